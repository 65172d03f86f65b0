"""The editors' completion requests (tests/support/editors.py: each plugin's own body, read as the
plugin reads it) through a real gateway in front of the llama.cpp-flavoured stub (which answers
/infill and /completion as the real llama-server does, `response_fields` trimming its last object)
and the vLLM-flavoured one (FIM through the model's template). The same plugins against the real
servers: tests/real/test_editors_llamacpp.py and test_editors_vllm.py."""

from __future__ import annotations

import json
import os

import pytest

from support.editors import (LLAMA_VIM_FIELDS, ContinueLlamaCpp, ContinueOllama, ContinueOpenAI, LlamaVim,
                            LlamaVscode, LlmLs, Refused, Twinny, send)
from gwproc import Gateway, config_for
from rawhttp import post_raw, sse_data
from stubproc import start_stub

KEY = "sk-editor"
FIM = {"prefix": "<PRE>", "suffix": "<SUF>", "middle": "<MID>"}


@pytest.fixture(scope="module")
def llama(tmpdir_session):
    with start_stub("llamacpp", "--model", "qwen2.5-coder-1.5b", "--token-delay-ms", "1",
                    log_path=os.path.join(tmpdir_session, "stub-editors-llama.log")) as s:
        yield s


@pytest.fixture(scope="module")
def vllm(tmpdir_session):
    with start_stub("vllm", "--model", "Qwen/Qwen2.5-Coder-7B", "--token-delay-ms", "1",
                    log_path=os.path.join(tmpdir_session, "stub-editors-vllm.log")) as s:
        yield s


@pytest.fixture(scope="module")
def gw(llama, vllm):
    cfg = config_for(
        {"llama": {"url": llama.base, "kind": "llamacpp", "slots": 2},
         "gpu": {"url": vllm.base, "kind": "vllm", "slots": 2}},
        {"coder": {"backend": "llama", "fim": FIM},
         "vcoder": {"backend": "gpu", "upstream_model": "Qwen/Qwen2.5-Coder-7B", "fim": FIM}},
        auth={"keys": [{"name": "editor", "key": KEY}]},
        completions={"default_model": "coder"})
    with Gateway(cfg) as g:
        yield g


@pytest.fixture(params=["coder", "vcoder"])
def model(request):
    return request.param


PREFIX, MIDDLE, SUFFIX = "def add(a, b):\n", "    ", "\n\nprint(add(1, 2))\n"
EXTRA = [("util.py", "def sub(a, b):\n    return a - b\n")]


def upstream(stub) -> dict:
    return stub.requests()[-1]["body"]


def test_llama_vim_gets_its_completion_and_its_info_line_through_the_gateway(gw, llama):
    vim = LlamaVim()
    status, body, text = send(gw.url, vim.fim(PREFIX, MIDDLE, SUFFIX, indent=4, extra=vim.extra(EXTRA)), KEY)
    assert status == 200 and text.startswith(" c1")
    doc = json.loads(body)
    assert list(doc) == LLAMA_VIM_FIELDS  # exactly the fields asked, flattened, as llama.cpp answers
    info = vim.info(body)
    assert info["tokens_cached"] > 0 and info["predicted_n"] == 128 and info["prompt_n"] > 0
    sent = upstream(llama)
    assert "response_fields" not in sent and sent["samplers"] == ["top_k", "top_p", "infill"]
    assert sent["input_extra"][0]["filename"] == "util.py" and sent["n_indent"] == 4 and sent["id_slot"] == 0
    # the same request straight to the stub: the same fields
    _, direct, _ = send(llama.url, vim.fim(PREFIX, MIDDLE, SUFFIX, indent=4))
    assert list(json.loads(direct)) == LLAMA_VIM_FIELDS


def test_llama_vims_warm_up_is_answered_as_llamacpp_answers_it(gw, llama):
    vim = LlamaVim()
    status, body, _ = send(gw.url, vim.warmup(vim.extra(EXTRA)), KEY)
    assert (status, body) == (200, b"{}")
    _, direct, _ = send(llama.url, vim.warmup(vim.extra(EXTRA)))
    assert direct == b"{}"


def test_llama_vim_on_a_backend_other_than_llamacpp_gets_an_answer_it_accepts(gw, vllm):
    vim = LlamaVim()
    call = vim.fim(PREFIX, MIDDLE, SUFFIX)
    call.body["model"] = "vcoder"
    status, body, text = send(gw.url, call, KEY)
    assert status == 200 and text
    assert set(json.loads(body)) <= set(LLAMA_VIM_FIELDS) and "content" in json.loads(body)
    assert upstream(vllm)["prompt"].startswith("<PRE>")  # rendered through the model's template
    status, body, _ = send(gw.url, vim.warmup([]), KEY)
    assert (status, body) == (200, b"{}")


def test_a_streamed_infill_with_response_fields_ends_cleanly(gw, llama):
    """The bug this came from: llama.cpp's trimmed last object has no `"stop": true`."""
    body = {**LlamaVim().fim(PREFIX, MIDDLE, SUFFIX).body, "stream": True, "n_predict": 3}
    status, _, raw = post_raw(gw.url + "/infill", body, {"Authorization": f"Bearer {KEY}"})
    frames = [json.loads(d) for d in sse_data(raw)]
    assert status == 200 and [f.get("stop") for f in frames[:-1]] == [False, False, False]
    assert list(frames[-1]) == LLAMA_VIM_FIELDS and frames[-1]["content"] == ""  # streamed: the text came before
    assert "".join(f["content"] for f in frames) == " c1 c2 c3"


def test_llama_vscode_fim_and_warm_up(gw, llama, model):
    vs = LlamaVscode()
    status, body, text = send(gw.url, vs.fim(PREFIX, MIDDLE, SUFFIX, indent=4, chunks=vs.chunks(EXTRA),
                                             model=model if model != "coder" else ""), KEY)
    assert status == 200 and text
    if model == "coder":
        bar = vs.status_bar(body)
        assert bar["tokens_cached"] > 0 and bar["predicted_n"] == 128 and bar["predicted_per_second"] > 0
        assert "n_cmpl" not in upstream(llama)  # one request, one slot: one completion back
    assert send(gw.url, vs.warmup(vs.chunks(EXTRA), model=""), KEY)[0] == 200


def test_continue_openai_legacy_completions(gw, model):
    status, _, text = send(gw.url + "/llm/v1", ContinueOpenAI().complete(model, f"<PRE>{PREFIX}<SUF>{SUFFIX}<MID>"), KEY)
    assert status == 200 and text.startswith(" c1")


def test_continue_ollama_sends_the_suffix_once_api_show_says_it_can(gw, model):
    cont = ContinueOllama()
    assert send(gw.url, cont.show(model), KEY)[2] == "fim"
    status, _, text = send(gw.url, cont.fim(model, PREFIX, SUFFIX), KEY)
    assert status == 200 and text.startswith(" c1")


def test_continue_llamacpp_provider(gw, llama, model):
    status, _, text = send(gw.url, ContinueLlamaCpp().complete(model, f"<PRE>{PREFIX}<SUF>{SUFFIX}<MID>"), KEY)
    assert status == 200 and text.startswith(" c1")
    if model == "coder":
        assert upstream(llama)["prompt"].startswith("<PRE>")  # relayed to llama.cpp's own /completion


def test_llm_ls_backends(gw, model):
    ls = LlmLs()
    prompt = ls.prompt(FIM, PREFIX, SUFFIX)
    assert send(gw.url, ls.openai(model, prompt), KEY)[2].startswith(" c1")
    status, _, text = send(gw.url, ls.ollama(model, prompt), KEY)
    assert status == 200 and isinstance(text, str)  # no `raw`: a chat turn, as Ollama makes it


def test_twinny_providers(gw, model):
    tw = Twinny()
    prompt = f"<PRE>{PREFIX}<SUF>{SUFFIX}<MID>"
    status, _, text = send(gw.url, tw.ollama(model, prompt), KEY)
    assert status == 200 and isinstance(text, str)
    body = tw.llamacpp(prompt).body
    call = tw.llamacpp(prompt)
    call.body = {**body, "model": model}  # Twinny names no model: the gateway's default, or this one
    status, _, text = send(gw.url, call, KEY)
    assert status == 200 and text.startswith(" c1")
    assert send(gw.url, tw.llamacpp(prompt), KEY)[2].startswith(" c1")  # completions.default_model


def test_an_editor_that_cannot_read_the_answer_says_so(gw):
    """The readers are no rubber stamp: a refusal is something each plugin would not show."""
    status, body, _ = send(gw.url, LlamaVim().warmup([]), KEY)
    with pytest.raises(Refused):
        LlamaVim.read(status, body)  # `{}` has no "content": llama.vim would show nothing
    call = LlamaVim().fim(PREFIX, MIDDLE, SUFFIX)
    with pytest.raises(Refused):
        send(gw.url, call, "sk-wrong")
