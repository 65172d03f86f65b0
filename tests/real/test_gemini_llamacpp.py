"""The Gemini surface in front of llama.cpp's real `llama-server` with a real model (Gemma 3
270M), driven by the google-genai SDK: generate_content and generate_content_stream agree,
count_tokens is llama.cpp's own count, a JSON schema is enforced by llama.cpp's grammar, the
length limit, and a client that leaves mid-stream, judged by llama.cpp's own /slots and /metrics.

llama-server and the model come from `.ci/deps/llama-cpp.sh` (cached under
~/.cache/homelab-frontend/llama.cpp, or $HLF_LLAMA_HOME). Without them these tests fail, naming
the script: they do not skip."""

from __future__ import annotations

import json
import time

import pytest
from google import genai
from google.genai import types

from gwproc import Gateway, config_for
from llamaproc import module_llama, processing_slots, tokens_predicted
from rawhttp import post_and_vanish
from stubproc import wait_for

pytestmark = pytest.mark.timeout(300)


llama = module_llama(parallel=2, ctx=4096)


@pytest.fixture(scope="module")
def gateway(llama):
    cfg = config_for({"llama": {"url": llama + "/v1", "kind": "llamacpp", "slots": 2}},
                     {"gemma": {"backend": "llama"}}, aliases={"gemini-*": "gemma"})
    with Gateway(cfg) as gw:
        yield gw


@pytest.fixture
def client(gateway):
    return genai.Client(api_key="unused", http_options=types.HttpOptions(
        base_url=gateway.llm, retry_options=types.HttpRetryOptions(attempts=1)))


def test_generate_content_and_the_stream_agree(client):
    prompt = "Name three colours."
    config = types.GenerateContentConfig(temperature=0, max_output_tokens=24)
    # llama.cpp's first answer to a cold prompt cache can differ at temperature 0: warm it
    client.models.generate_content(model="gemini-2.5-flash", contents=prompt, config=config)
    whole = client.models.generate_content(model="gemini-2.5-flash", contents=prompt, config=config)
    assert whole.text.strip() and whole.model_version == "gemini-2.5-flash"
    assert whole.usage_metadata.prompt_token_count > 5 and whole.usage_metadata.candidates_token_count > 0
    chunks = list(client.models.generate_content_stream(model="gemini-2.5-flash", contents=prompt, config=config))
    assert "".join(ch.text or "" for ch in chunks) == whole.text
    assert chunks[-1].usage_metadata.candidates_token_count == whole.usage_metadata.candidates_token_count
    assert len(chunks) > 3


def test_count_tokens_is_llama_cpps_count(client):
    contents = "Name three colours."
    counted = client.models.count_tokens(model="gemma", contents=contents).total_tokens
    used = client.models.generate_content(model="gemma", contents=contents, config=types.GenerateContentConfig(
        max_output_tokens=2)).usage_metadata.prompt_token_count
    assert counted == used


def test_a_json_schema_is_enforced(client):
    # An enum: a 270M model given an object schema wanders in the whitespace the JSON grammar
    # allows until max_output_tokens; a closed set of strings shows the constraint just as well.
    schema = {"type": "STRING", "enum": ["red", "green", "blue"]}
    r = client.models.generate_content(model="gemma", contents="Pick a colour.",
                                       config=types.GenerateContentConfig(
                                           temperature=0, max_output_tokens=32, response_mime_type="application/json",
                                           response_schema=schema))
    assert json.loads(r.text) in ("red", "green", "blue"), r.text


def test_max_output_tokens(client):
    r = client.models.generate_content(model="gemma", contents="Write a long story about a dragon.",
                                       config=types.GenerateContentConfig(max_output_tokens=4))
    assert r.candidates[0].finish_reason == types.FinishReason.MAX_TOKENS
    assert r.usage_metadata.candidates_token_count == 4


def test_client_leaving_mid_stream_stops_llama_cpp(gateway, llama):
    before = tokens_predicted(llama)
    post_and_vanish(gateway.llm + "/v1beta/models/gemma:streamGenerateContent?alt=sse",
                    {"contents": [{"parts": [{"text": "Write a very long story about a dragon."}]}],
                     "generationConfig": {"maxOutputTokens": 2000}}, after_bytes=3000)
    gone = time.monotonic()
    wait_for(lambda: not processing_slots(llama), 3.0, 0.05)
    assert time.monotonic() - gone < 3.0
    wait_for(lambda: gateway.admin()["backends"]["llama"]["in_use"] == 0, 2.0)
    rec = wait_for(lambda: [r for r in gateway.access_log() if r["outcome"].startswith("cancelled")], 2)
    assert rec[-1]["dialect"] == "gemini" and rec[-1]["outcome"] == "cancelled_streaming"

    assert tokens_predicted(llama) - before < 1000
