"""The Responses surface in front of llama.cpp's real `llama-server` with a real model (Gemma 3
270M): the openai SDK's responses.create and responses.stream, the length limit, and a client
that leaves mid-stream, judged by llama.cpp's own /slots (no slot still processing) and /metrics.

llama-server and the model come from `.ci/deps/llama-cpp.sh` (cached under
~/.cache/homelab-frontend/llama.cpp, or $HLF_LLAMA_HOME). Without them these tests fail, naming
the script: they do not skip."""

from __future__ import annotations

import time

import openai
import pytest

from gwproc import Gateway, config_for
from llamaproc import module_llama, processing_slots, tokens_predicted
from rawhttp import post_and_vanish
from stubproc import wait_for


pytestmark = pytest.mark.timeout(300)


llama = module_llama(parallel=2, ctx=4096)


@pytest.fixture(scope="module")
def gateway(llama):
    cfg = config_for({"llama": {"url": llama + "/v1", "kind": "llamacpp", "slots": 2}},
                     {"gemma": {"backend": "llama"}})
    with Gateway(cfg) as gw:
        yield gw


def test_create_and_stream_against_llama_cpp(gateway, llama):
    client = openai.OpenAI(base_url=gateway.base, api_key="unused", max_retries=0)
    prompt = "Name three colours."
    # llama.cpp's first answer to a prompt (a cold prompt cache) can differ from later ones at
    # temperature 0: warm the cache, so that the two answers compared below both read it
    client.responses.create(model="gemma", input=prompt, temperature=0, max_output_tokens=24, store=False)
    plain = client.responses.create(model="gemma", input=prompt, temperature=0, max_output_tokens=24, store=False)
    assert plain.status in ("completed", "incomplete") and plain.model == "gemma"
    assert plain.output_text.strip()
    assert plain.usage.input_tokens > 5 and plain.usage.output_tokens > 0
    with client.responses.stream(model="gemma", input=prompt, temperature=0, max_output_tokens=24, store=False) as s:
        deltas = [e.delta for e in s if e.type == "response.output_text.delta"]
        final = s.get_final_response()
    assert "".join(deltas) == final.output_text == plain.output_text
    assert final.usage.output_tokens == plain.usage.output_tokens


def test_max_output_tokens_is_incomplete(gateway):
    client = openai.OpenAI(base_url=gateway.base, api_key="unused", max_retries=0)
    r = client.responses.create(model="gemma", input="Write a long story about a dragon.", max_output_tokens=4, store=False)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 4


def test_client_leaving_mid_stream_stops_llama_cpp(gateway, llama):
    before = tokens_predicted(llama)
    post_and_vanish(gateway.base + "/responses", {"model": "gemma", "stream": True, "store": False,
                                                  "max_output_tokens": 2000,
                                                  "input": "Write a very long story about a dragon."},
                    after_bytes=3000)
    gone = time.monotonic()
    wait_for(lambda: not processing_slots(llama), 3.0, 0.05)
    assert time.monotonic() - gone < 3.0
    wait_for(lambda: gateway.admin()["backends"]["llama"]["in_use"] == 0, 2.0)
    rec = wait_for(lambda: [r for r in gateway.access_log() if r["outcome"].startswith("cancelled")], 2)
    assert rec[-1]["dialect"] == "responses" and rec[-1]["outcome"] == "cancelled_streaming"
    # llama.cpp generated far fewer than the 2000 tokens asked for
    assert tokens_predicted(llama) - before < 1000


def test_a_prompt_over_the_context_is_context_length_exceeded(gateway):
    client = openai.OpenAI(base_url=gateway.base, api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as exc:
        client.responses.create(model="gemma", input="dragon " * 3000, store=False)
    assert exc.value.body["code"] == "context_length_exceeded" and exc.value.body["param"] == "input"
