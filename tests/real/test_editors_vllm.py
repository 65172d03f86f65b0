"""The editors' completion requests (tests/support/editors.py: each plugin's own body, each answer
read as the plugin reads it) through a real gateway in front of the real vLLM (Gemma 3 270M, its
answers scripted by the test logits processor, tests/support/vllm_script.py). vLLM takes no
suffix and has no /infill: the gateway renders every fill-in-the-middle request through the
model's FIM template (`<PRE>`, `<SUF>`, `<MID>` as text: Gemma 3 has no FIM tokens) onto vLLM's
/v1/completions, and answers llama.cpp's clients in llama.cpp's shape, `response_fields` applied."""

from __future__ import annotations

import json

import pytest

from gwproc import Gateway, config_for
from stubproc import wait_for
from support.editors import (LLAMA_VIM_FIELDS, ContinueLlamaCpp, ContinueOllama, ContinueOpenAI, LlamaVim,
                             LlamaVscode, LlmLs, Twinny, send)
from support.vllm_script import SCRIPTS, directive
from vllmproc import SERVED, SLOTS

pytestmark = [pytest.mark.xdist_group("vllm"), pytest.mark.timeout(600)]

KEY = "sk-editor"
FIM = {"prefix": "<PRE>", "suffix": "<SUF>", "middle": "<MID>"}
ANSWER = SCRIPTS["plain"].content
PREFIX, MIDDLE, SUFFIX = f"# {directive('plain')}\ndef add(a, b):\n", "    ", "\n\nprint(add(1, 2))\n"
FIM_PROMPT = f"<PRE>{PREFIX}<SUF>{SUFFIX}<MID>"


@pytest.fixture(scope="module")
def gw(vllm):
    cfg = config_for({"vllm": {"url": vllm.base, "kind": "vllm", "slots": SLOTS, "health_interval_s": 1}},
                     {"coder": {"backend": "vllm", "upstream_model": SERVED, "fim": FIM}},
                     auth={"keys": [{"name": "editor", "key": KEY}]},
                     completions={"default_model": "coder"})
    with Gateway(cfg) as g:
        yield g


@pytest.fixture
def idle(vllm, gw):
    wait_for(vllm.idle, timeout=60, interval=0.1)
    return vllm


def test_llama_vim(gw, idle):
    vim = LlamaVim()
    call = vim.fim(PREFIX, MIDDLE, SUFFIX, extra=vim.extra([("util.py", "def sub(a, b):\n    return a - b\n")]))
    call.body["n_predict"] = 40
    status, body, text = send(gw.url, call, KEY)
    assert status == 200 and ANSWER in text  # llama.vim's own check passed, vLLM's scripted answer
    assert set(json.loads(body)) <= set(LLAMA_VIM_FIELDS) and "content" in json.loads(body)
    assert send(gw.url, vim.warmup([]), KEY)[:2] == (200, b"{}")  # one token generated, nothing said


def test_llama_vscode(gw, idle):
    vs = LlamaVscode()
    call = vs.fim(PREFIX, MIDDLE, SUFFIX)
    call.body["n_predict"] = 40
    status, _, text = send(gw.url, call, KEY)
    assert status == 200 and ANSWER in text
    assert send(gw.url, vs.warmup([]), KEY)[0] == 200


def test_continue_providers(gw, idle):
    status, _, text = send(gw.url + "/llm/v1", ContinueOpenAI().complete("coder", FIM_PROMPT, max_tokens=40), KEY)
    assert status == 200 and ANSWER in text
    cont = ContinueOllama()
    assert send(gw.url, cont.show("coder"), KEY)[2] == "fim"
    status, _, text = send(gw.url, cont.fim("coder", PREFIX, SUFFIX, max_tokens=40), KEY)
    assert status == 200 and ANSWER in text
    status, _, text = send(gw.url, ContinueLlamaCpp().complete("coder", FIM_PROMPT, max_tokens=40), KEY)
    assert status == 200 and ANSWER in text


def test_llm_ls_and_twinny(gw, idle):
    ls = LlmLs()
    prompt = ls.prompt(FIM, PREFIX, SUFFIX)
    status, _, text = send(gw.url, ls.openai("coder", prompt, {"max_tokens": 40, "temperature": 0.2}), KEY)
    assert status == 200 and ANSWER in text
    status, _, text = send(gw.url, ls.ollama("coder", prompt, {"options": {"num_predict": 40}}), KEY)
    assert status == 200 and isinstance(text, str)  # no `raw`: a chat turn, as Ollama makes it
    tw = Twinny()
    status, _, text = send(gw.url, tw.llamacpp(FIM_PROMPT, num_predict=40), KEY)
    assert status == 200 and ANSWER in text
    status, _, text = send(gw.url, tw.ollama("coder", FIM_PROMPT, num_predict=40), KEY)
    assert status == 200 and isinstance(text, str)
