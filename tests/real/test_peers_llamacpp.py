"""Two hops in front of llama.cpp's real `llama-server` (Gemma 3 270M, the shared --parallel 2
server): a front gateway -> a box's gateway -> llama-server. What the front lists is the server's
own context and slots; a greedy answer through both hops is the box's own, word for word and
token for token (from the same prompt cache state); a client leaving the front mid-stream stops the generation, judged by
llama.cpp's own /slots."""

from __future__ import annotations

import json
import time

import pytest

from gwproc import Gateway
from llamaproc import MODEL, get, llama_config, processing_slots
from rawhttp import post_and_vanish, post_raw
from stubproc import wait_for

pytestmark = pytest.mark.timeout(300)
KEY = "sk-front-real"
ENV = {"HLF_PEER_KEY": KEY}


@pytest.fixture(scope="module")
def hops(llama):
    box_cfg = llama_config(llama.base)
    box_cfg["auth"] = {"keys": [{"name": "front", "key_env": "HLF_PEER_KEY", "peer": True}]}
    with Gateway(box_cfg, env=ENV) as box, \
            Gateway({"backends": {"box": {"url": box.base, "api_key_env": "HLF_PEER_KEY", "health_interval_s": 0.5}}},
                    env=ENV) as front:
        wait_for(lambda: front.get("/llm/v1/models")[1]["data"], 15, 0.05)
        yield box, front


def test_the_front_lists_the_servers_own_context_and_the_boxs_slots(llama, hops):
    box, front = hops
    n_ctx = get(llama.base + "/models")["data"][0]["meta"]["n_ctx"]
    entry = {m["id"]: m for m in front.get("/llm/v1/models")[1]["data"]}[MODEL]
    assert entry["context_length"] == n_ctx and entry["state"] == "loaded"
    assert entry["homelab"]["backends"] == [{"name": "box/llama", "kind": "peer", "state": "loaded", "slots": 2,
                                             "in_use": 0, "queued": 0}]


def test_a_greedy_answer_through_two_hops_is_the_boxs_own(llama, hops):
    box, front = hops
    body = {"model": MODEL, "temperature": 0, "max_tokens": 24, "seed": 1,
            "messages": [{"role": "user", "content": "Name three colours."}]}
    # llama.cpp's numbers differ a little between a prompt it computes afresh and one it takes
    # from its prompt cache: one warm-up first, so both answers below are made from the cache
    assert post_raw(box.base + "/chat/completions", body, headers={"Authorization": f"Bearer {KEY}"})[0] == 200
    status, _, direct = post_raw(box.base + "/chat/completions", body, headers={"Authorization": f"Bearer {KEY}"})
    assert status == 200
    status, _, hopped = post_raw(front.base + "/chat/completions", body)
    assert status == 200
    d, h = json.loads(direct), json.loads(hopped)
    assert h["choices"][0]["message"]["content"] == d["choices"][0]["message"]["content"]
    assert h["usage"] == d["usage"] and h["choices"][0]["finish_reason"] == d["choices"][0]["finish_reason"]


def test_a_client_leaving_the_front_stops_llama_cpp(llama, hops):
    box, front = hops
    wait_for(lambda: not processing_slots(llama.url), 30, 0.05)
    post_and_vanish(front.base + "/chat/completions",
                    {"model": MODEL, "stream": True, "max_tokens": 1500,
                     "messages": [{"role": "user", "content": "Write a very long story about the sea."}]},
                    until=b'"content":"')
    left = time.monotonic()
    wait_for(lambda: not processing_slots(llama.url), 10, 0.02)
    assert time.monotonic() - left < 5
