"""The editors' completion requests (tests/support/editors.py: each plugin's own body, each answer
read as the plugin reads it) through a real gateway in front of llama.cpp's real llama-server,
on Gemma 3 270M with FIM tokens named in its metadata (.ci/deps/llama-fim.sh), so /infill runs
for real. llama.vim's answers are held against llama.cpp's own: the same request straight to the
server gives the same fields (its `response_fields` trimming, its warm-up's `{}`); the fields a
client's llama.cpp options add (`n_probs`, `post_sampling_probs`, `return_tokens`,
`timings_per_token`) come through as llama.cpp writes them. A llama.vim request whose curl is
killed (the plugin's `jobstop` at the next keystroke) stops the server's generation: judged by its
own /slots. And the llama.cpp-flavoured stub, which the stub-backed tests trust, answers /infill
with the same fields as the real server, request for request."""

from __future__ import annotations

import json

import pytest

from gwproc import Gateway, config_for
from llamaproc import ALIAS, FIM_GGUF, FIM_TOKENS, LlamaServer, require_llama_fim, tokens_predicted
from rawhttp import post_and_vanish, post_raw, sse_data
from stubproc import start_stub, wait_for
from support.editors import (LLAMA_VIM_FIELDS, ContinueLlamaCpp, ContinueOllama, ContinueOpenAI, LlamaVim,
                             LlamaVscode, LlmLs, Twinny, send)

pytestmark = pytest.mark.timeout(600)

KEY = "sk-editor"
PREFIX, MIDDLE, SUFFIX = "def add(a, b):\n", "    ", "\n\nprint(add(1, 2))\n"
EXTRA = [("util.py", "def sub(a, b):\n    return a - b\n")]
FIM_PROMPT = f"{FIM_TOKENS['prefix']}{PREFIX}{FIM_TOKENS['suffix']}{SUFFIX}{FIM_TOKENS['middle']}"


@pytest.fixture(scope="module")
def server():
    require_llama_fim()
    with LlamaServer(parallel=2, ctx=2048, gguf=FIM_GGUF) as s:
        yield s


@pytest.fixture(scope="module")
def gw(server):
    # `coder`: no template, so a suffix goes to llama.cpp's own /infill; `coder-tpl`: the FIM
    # tokens as a gateway template (what Continue's Ollama provider needs to send a suffix)
    cfg = config_for({"llama": {"url": server.base, "kind": "llamacpp", "slots": 2, "health_interval_s": 1}},
                     {"coder": {"backend": "llama", "upstream_model": ALIAS},
                      "coder-tpl": {"backend": "llama", "upstream_model": ALIAS, "fim": FIM_TOKENS}},
                     auth={"keys": [{"name": "editor", "key": KEY}]},
                     completions={"default_model": "coder"})
    with Gateway(cfg) as g:
        yield g


@pytest.fixture
def idle(server, gw):
    wait_for(server.idle, timeout=60, interval=0.25)
    return server


def test_llama_vim_completion_is_llamacpps_own_answer(gw, idle):
    vim = LlamaVim()
    call = vim.fim(PREFIX, MIDDLE, SUFFIX, indent=4, extra=vim.extra(EXTRA), first=False)
    status, body, text = send(gw.url, call, KEY)
    assert status == 200 and isinstance(text, str)  # llama.vim's own check passed
    _, direct, _ = send(idle.url, call)
    assert list(json.loads(body)) == list(json.loads(direct))  # the fields llama.cpp itself answers
    assert set(json.loads(body)) == set(LLAMA_VIM_FIELDS)
    info = vim.info(body)
    assert info["tokens_cached"] > 0 and info["prompt_n"] >= 0 and info["predicted_per_second"] >= 0


def test_llama_vims_warm_up_is_answered_as_llamacpp_answers_it(gw, idle):
    vim = LlamaVim()
    call = vim.warmup(vim.extra(EXTRA))
    assert send(idle.url, call)[:2] == (200, b"{}")
    assert send(gw.url, call, KEY)[:2] == (200, b"{}")


def test_llama_options_that_shape_the_answer_come_through_as_llamacpp_writes_them(gw, idle):
    body = {"input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": 4, "ignore_eos": True, "temperature": 0,
            "n_probs": 2, "post_sampling_probs": True, "return_tokens": True, "model": "coder"}
    status, _, via = post_raw(gw.url + "/infill", body, {"Authorization": f"Bearer {KEY}"}, timeout=120)
    _, _, direct = post_raw(idle.url + "/infill", body, timeout=120)
    got, want = json.loads(via), json.loads(direct)
    assert status == 200 and set(got) == set(want)
    assert got["content"] == want["content"] and len(got["tokens"]) == 4 and got["tokens"] == want["tokens"]
    assert got["generation_settings"]["stream"] is False and got["model"] == "coder"
    assert len(got["completion_probabilities"]) == 4
    assert set(got["completion_probabilities"][0]) == set(want["completion_probabilities"][0])
    assert "prob" in got["completion_probabilities"][0] and "top_probs" in got["completion_probabilities"][0]
    # streamed, with timings on every object
    stream = {**body, "stream": True, "timings_per_token": True, "response_fields": ["content", "timings/predicted_n"]}
    status, _, via = post_raw(gw.url + "/infill", stream, {"Authorization": f"Bearer {KEY}"}, timeout=120)
    _, _, direct = post_raw(idle.url + "/infill", stream, timeout=120)
    frames, want = [json.loads(d) for d in sse_data(via)], [json.loads(d) for d in sse_data(direct)]
    assert status == 200 and len(frames) == len(want) and frames[-1] == {"content": "", "timings/predicted_n": 4}
    assert want[-1] == frames[-1]  # llama.cpp trims its own last object the same way
    assert all("timings" in f and "completion_probabilities" in f for f in frames[:-1])


def test_llama_vscode(gw, idle):
    vs = LlamaVscode()
    status, body, text = send(gw.url, vs.fim(PREFIX, MIDDLE, SUFFIX, indent=4, chunks=vs.chunks(EXTRA)), KEY)
    assert status == 200 and isinstance(text, str)
    bar = vs.status_bar(body)
    assert bar["tokens_cached"] > 0 and bar["prompt_n"] is not None and bar["predicted_n"] is not None
    assert send(gw.url, vs.warmup(vs.chunks(EXTRA)), KEY)[0] == 200


def test_continue_providers(gw, idle):
    status, _, text = send(gw.url + "/llm/v1", ContinueOpenAI().complete("coder", FIM_PROMPT, max_tokens=8), KEY)
    assert status == 200 and isinstance(text, str)
    status, _, text = send(gw.url, ContinueLlamaCpp().complete("coder", FIM_PROMPT, max_tokens=8), KEY)
    assert status == 200 and isinstance(text, str)
    cont = ContinueOllama()
    assert send(gw.url, cont.show("coder-tpl"), KEY)[2] == "fim"
    status, _, text = send(gw.url, cont.fim("coder-tpl", PREFIX, SUFFIX, max_tokens=8), KEY)
    assert status == 200 and isinstance(text, str)


def test_llm_ls_and_twinny(gw, idle):
    ls = LlmLs()
    prompt = ls.prompt(FIM_TOKENS, PREFIX, SUFFIX)
    assert send(gw.url, ls.openai("coder", prompt, {"max_tokens": 8, "temperature": 0.2}), KEY)[0] == 200
    assert send(gw.url, ls.ollama("coder", prompt, {"options": {"num_predict": 8}}), KEY)[0] == 200
    tw = Twinny()
    assert send(gw.url, tw.ollama("coder", FIM_PROMPT, num_predict=8), KEY)[0] == 200
    assert send(gw.url, tw.llamacpp(FIM_PROMPT, num_predict=8), KEY)[0] == 200


def test_a_suffix_without_a_template_is_filled_by_llamacpps_infill(gw, idle):
    """/v1/completions with `suffix` on a model without a gateway template: llama.cpp's own /infill."""
    body = {"model": "coder", "prompt": PREFIX, "suffix": SUFFIX, "max_tokens": 4, "temperature": 0}
    status, _, got = post_raw(gw.base + "/completions", body, {"Authorization": f"Bearer {KEY}"}, timeout=120)
    doc = json.loads(got)
    assert status == 200 and doc["usage"]["completion_tokens"] <= 4 and doc["usage"]["prompt_tokens"] > 5


def test_llama_vim_killing_its_curl_stops_the_generation(gw, idle):
    """llama.vim `jobstop`s the previous request's curl at the next keystroke: the gateway's
    upstream closes and llama.cpp stops the generation (its own /slots and token count)."""
    call = LlamaVim().fim(PREFIX, MIDDLE, SUFFIX)
    body = {**call.body, "n_predict": 2000, "t_max_predict_ms": 600000, "ignore_eos": True}
    before = tokens_predicted(idle.url)
    post_and_vanish(gw.url + "/infill", body, after_s=3.0, headers={"Authorization": f"Bearer {KEY}"})
    assert wait_for(lambda: idle.processing() == 0, timeout=30, interval=0.25)
    assert wait_for(lambda: tokens_predicted(idle.url) > before, timeout=10, interval=0.25)  # it had begun
    assert tokens_predicted(idle.url) - before < 2000  # and stopped long before its end


@pytest.fixture(scope="module")
def stub(tmp_path_factory):
    with start_stub("llamacpp", "--model", ALIAS, "--token-delay-ms", "1",
                    log_path=str(tmp_path_factory.mktemp("stub") / "stub-llama.log")) as s:
        yield s


def _shape(url: str, body: dict) -> list:
    """The fields of each object of an /infill answer: [keys] for a whole one, one per object
    streamed (the first piece, the last piece, the last object)."""
    status, _, raw = post_raw(url + "/infill", body, timeout=120)
    assert status == 200, raw
    if not body.get("stream"):
        doc = json.loads(raw)
        probs = doc.get("completion_probabilities") or [{}]
        return [sorted(doc), sorted(doc.get("generation_settings", {}).keys() & {"stream", "n_probs"}), sorted(probs[0])]
    frames = [json.loads(d) for d in sse_data(raw)]
    return [sorted(frames[0]), sorted(frames[-2]), sorted(frames[-1])]


@pytest.mark.parametrize("extra", [
    {},
    {"response_fields": LLAMA_VIM_FIELDS},
    {"n_probs": 2, "return_tokens": True},
    {"n_probs": 2, "post_sampling_probs": True},
    {"stream": True},
    {"stream": True, "timings_per_token": True, "n_probs": 1},
    {"stream": True, "response_fields": ["content", "timings/predicted_n", "nope"]},
    {"n_predict": 0, "response_fields": [""]},
])
def test_the_stub_answers_infill_with_the_real_servers_fields(idle, stub, extra):
    body = {"input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": 3, "ignore_eos": True, "temperature": 0,
            **extra}
    assert _shape(stub.url, body) == _shape(idle.url, body)
