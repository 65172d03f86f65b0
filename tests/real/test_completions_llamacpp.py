"""Code completion against llama.cpp's real llama-server (Gemma 3 270M) through a real gateway:
/v1/completions plain and streamed with the server's own usage, Ollama's raw generate, and the
refusals of a model without FIM tokens (Gemma 3 has none: llama.cpp's own 501 on /infill reaches
the client as a 400 in its dialect). Latest-wins judged by llama.cpp's own evidence: its /slots
and its /metrics decode steps."""

from __future__ import annotations

import urllib.error

import ollama
import openai
import pytest

from gwproc import Gateway, config_for
from llamaproc import ALIAS, MODEL, processing_slots, tokens_predicted
from rawhttp import stream_on_thread
from stubproc import wait_for

pytestmark = pytest.mark.timeout(300)

KEY = "sk-editor"


@pytest.fixture(scope="module")
def gw(llama):
    cfg = config_for({"llama": {"url": llama.base, "kind": "llamacpp", "slots": 2, "health_interval_s": 1}},
                     {MODEL: {"backend": "llama", "upstream_model": ALIAS, "supersede": True}},
                     auth={"keys": [{"name": "editor", "key": KEY}]},
                     completions={"default_model": MODEL})
    with Gateway(cfg) as g:
        yield g


@pytest.fixture
def client(gw, idle_llama):
    return openai.OpenAI(base_url=gw.base, api_key=KEY, max_retries=0)


def test_plain_and_streamed_completions_carry_the_servers_own_usage(client, llama):
    before = tokens_predicted(llama.url)
    got = client.completions.create(model=MODEL, prompt="def fibonacci(n):", max_tokens=12, temperature=0)
    assert got.model == MODEL and got.choices[0].text and got.choices[0].finish_reason == "length"
    assert got.usage.completion_tokens == 12 and got.usage.prompt_tokens > 3
    assert wait_for(lambda: tokens_predicted(llama.url) - before >= 12, timeout=10)
    chunks = list(client.completions.create(model=MODEL, prompt="def fibonacci(n):", max_tokens=12, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
    assert text == got.choices[0].text  # temperature 0: the same answer, streamed
    assert chunks[-1].usage.completion_tokens == 12 and chunks[-1].usage.prompt_tokens == got.usage.prompt_tokens


def test_ollama_raw_generate_on_llamacpp(gw, idle_llama):
    oc = ollama.Client(host=gw.url, headers={"Authorization": f"Bearer {KEY}"})
    got = oc.generate(model=MODEL, prompt="<start_of_turn>user\nSay hi<end_of_turn>\n<start_of_turn>model\n", raw=True,
                      options={"num_predict": 8, "temperature": 0}, stream=False)
    assert got.done and got.response and got.eval_count <= 8 and got.prompt_eval_count > 5
    assert got.done_reason in ("stop", "length")


def test_gemma_has_no_fim_tokens_llamacpps_refusal_is_a_clear_400(gw, client, idle_llama):
    status, doc = gw.post("/infill", {"input_prefix": "def f(", "input_suffix": "):\n    pass\n", "n_predict": 8},
                          {"Authorization": f"Bearer {KEY}"})
    assert status == 400, doc
    assert doc["error"]["code"] == 400 and "Infill is not supported by this model" in doc["error"]["message"]
    with pytest.raises(openai.BadRequestError) as exc:
        client.completions.create(model=MODEL, prompt="def f(", suffix="    pass\n", max_tokens=8)
    assert exc.value.body["param"] == "suffix" and "Infill is not supported" in exc.value.body["message"]
    oc = ollama.Client(host=gw.url, headers={"Authorization": f"Bearer {KEY}"})
    with pytest.raises(ollama.ResponseError) as oerr:
        oc.generate(model=MODEL, prompt="def f(", suffix="    pass\n")
    assert oerr.value.status_code == 400 and oerr.value.error.startswith("suffix:")


def test_a_newer_completion_stops_the_older_generation_on_the_server(gw, client, llama):
    steps0 = llama.metrics()["llamacpp:n_decode_total"]
    old, done = stream_on_thread(gw.base + "/completions",
                                 {"model": MODEL, "prompt": "Write a very long story about a dragon.",
                                  "max_tokens": 1500, "temperature": 0, "stream": True},
                                 {"Authorization": f"Bearer {KEY}"}, timeout=120)
    wait_for(lambda: len(b"".join(old)) > 2000, timeout=60, interval=0.01)  # it is generating
    assert processing_slots(llama.url)
    got = client.completions.create(model=MODEL, prompt="def add(a, b):", max_tokens=8, temperature=0)
    assert done.wait(30)
    assert got.choices[0].text
    text = b"".join(old).decode(errors="replace")
    assert "superseded" in text and "[DONE]" not in text, gw.stderr()[-2000:]
    # llama.cpp's own evidence: its slots and its running gauge say nothing generates any more,
    # and its decode steps (one per token of every running generation, so every token the old
    # one made, however it ended) fall short of the 1500 it would have taken to run to its end
    wait_for(llama.idle, timeout=30, interval=0.25)
    steps = llama.metrics()["llamacpp:n_decode_total"] - steps0
    assert steps < 1500, steps
    print(f"the superseded generation and the new one took {steps:g} decode steps")
