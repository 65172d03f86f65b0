"""Code completion against the real vLLM (Gemma 3 270M, its answers scripted by the test logits
processor, tests/support/vllm_script.py) through a real gateway: the FIM template rendered into
the one prompt vLLM counts (its own /tokenize agrees with the usage the client gets), streamed
usage, vLLM refusing nothing the gateway sends, and a superseded generation judged by vLLM's own
evidence: its log of aborted requests and its running count."""

from __future__ import annotations

import json
import urllib.request

import openai
import pytest

from gwproc import Gateway, config_for
from rawhttp import stream_on_thread
from stubproc import wait_for
from support.vllm_script import directive
from vllmproc import SERVED, SLOTS

pytestmark = [pytest.mark.xdist_group("vllm"), pytest.mark.timeout(600)]

KEY = "sk-editor"
FIM = {"prefix": "<PRE>", "suffix": "<SUF>", "middle": "<MID>"}  # Gemma 3 has no FIM tokens: text ones


@pytest.fixture(scope="module")
def gw(vllm):
    cfg = config_for({"vllm": {"url": vllm.base, "kind": "vllm", "slots": SLOTS, "health_interval_s": 1}},
                     {"coder": {"backend": "vllm", "upstream_model": SERVED, "fim": FIM, "supersede": True}},
                     auth={"keys": [{"name": "editor", "key": KEY}]})
    with Gateway(cfg) as g:
        yield g


@pytest.fixture
def client(gw, vllm):
    wait_for(vllm.idle, timeout=60, interval=0.1)
    return openai.OpenAI(base_url=gw.base, api_key=KEY, max_retries=0)


def test_fim_is_one_prompt_and_the_usage_is_vllms_own(client, vllm):
    prompt, suffix = f"{directive('plain')} def add(a, b):\n    ", "\n\nprint(add(1, 2))"
    got = client.completions.create(model="coder", prompt=prompt, suffix=suffix, max_tokens=30, temperature=0)
    assert got.model == "coder" and got.choices[0].text
    req = urllib.request.Request(vllm.url + "/tokenize", method="POST", headers={"content-type": "application/json"},
                                 data=json.dumps({"model": SERVED, "prompt": f"<PRE>{prompt}<SUF>{suffix}<MID>"}).encode())
    with urllib.request.urlopen(req, timeout=60) as resp:
        counted = json.loads(resp.read())
    assert got.usage.prompt_tokens == counted["count"]  # the rendered prompt, exactly as vLLM counts it
    chunks = list(client.completions.create(model="coder", prompt=prompt, suffix=suffix, max_tokens=30,
                                            temperature=0, stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == got.choices[0].text
    assert chunks[-1].usage.prompt_tokens == counted["count"]
    assert chunks[-1].usage.completion_tokens == got.usage.completion_tokens


def test_echo_goes_to_vllm(client):
    prompt = f"{directive('plain')} x"
    got = client.completions.create(model="coder", prompt=prompt, max_tokens=3, echo=True, temperature=0)
    assert got.choices[0].text.startswith(prompt) and len(got.choices[0].text) > len(prompt)


def test_a_newer_completion_aborts_the_older_one_in_vllm(gw, client, vllm):
    before, gen0 = set(vllm.aborted()), vllm.generated()
    old, done = stream_on_thread(gw.base + "/completions",
                                 {"model": "coder", "prompt": f"{directive('long')} story", "max_tokens": 600,
                                  "stream": True},
                                 {"Authorization": f"Bearer {KEY}"}, timeout=300)
    wait_for(lambda: len(b"".join(old)) > 1000, timeout=120, interval=0.02)  # it is generating
    got = client.completions.create(model="coder", prompt=f"{directive('plain')} new", max_tokens=5)
    assert done.wait(60) and got.choices[0].text
    text = b"".join(old).decode(errors="replace")
    assert "superseded" in text and "[DONE]" not in text
    # vLLM's own evidence: it runs nothing now, the old request short of its 600 tokens (its abort
    # log line is best effort, VllmServer.aborted)
    vllm.stopped_short(gen0, 600)
    assert len(set(vllm.aborted()) - before) <= 1
    wait_for(vllm.idle, timeout=30, interval=0.1)
