"""Code completion through a real gateway, driven by the official `openai` SDK and raw HTTP, in
front of real stubs: /v1/completions (plain, streamed, with usage), FIM templates and where a
suffix may go without one, /infill, latest-wins (supersede) and per-model priority, each judged by
what the stub itself logged (a cancelled generation, a request that never arrived)."""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.error
import urllib.request

import ollama as ollama_sdk
import openai
import pytest

from gwproc import Gateway, config_for
from rawhttp import post_and_vanish
from stubproc import start_stub, wait_for

ALICE, BOB, TIGHT, SOLO = "sk-alice", "sk-bob", "sk-tight", "sk-solo"
CODER = "qwen-coder"


@pytest.fixture(scope="module")
def vllm(tmpdir_session):
    with start_stub("vllm", "--model", "Qwen/Qwen2.5-Coder-7B", "--token-delay-ms", "2",
                    log_path=os.path.join(tmpdir_session, "stub-compl-vllm.log")) as s:
        yield s


@pytest.fixture(scope="module")
def llama(tmpdir_session):
    with start_stub("llamacpp", "--model", "qwen2.5-coder-1.5b",
                    log_path=os.path.join(tmpdir_session, "stub-compl-llama.log")) as s:
        yield s


@pytest.fixture(scope="module")
def gemma(tmpdir_session):
    with start_stub("llamacpp", "--model", "gemma-3-270m", "--no-fim",
                    log_path=os.path.join(tmpdir_session, "stub-compl-gemma.log")) as s:
        yield s


@pytest.fixture(scope="module")
def ollama(tmpdir_session):
    with start_stub("ollama", "--model", "qwen2.5-coder:1.5b",
                    log_path=os.path.join(tmpdir_session, "stub-compl-ollama.log")) as s:
        yield s


@pytest.fixture(scope="module")
def thinker(tmpdir_session):
    """A backend that thinks whatever it is told (a reasoning model that cannot be switched off)."""
    with start_stub("vllm", "--reasoning", "--model", "thinker",
                    log_path=os.path.join(tmpdir_session, "stub-compl-thinker.log")) as s:
        yield s


@pytest.fixture(scope="module")
def gw(vllm, llama, gemma, ollama, thinker):
    cfg = config_for(
        {"gpu": {"url": vllm.base, "kind": "vllm", "slots": 1, "queue": {"depth": 8, "timeout_s": 30}},
         "llama": {"url": llama.base, "kind": "llamacpp", "slots": 2},
         "gemma": {"url": gemma.base, "kind": "llamacpp", "slots": 2},
         "ollama": {"url": ollama.base, "kind": "ollama", "slots": 2},
         "thinker": {"url": thinker.base, "kind": "vllm", "slots": 2}},
        {CODER: {"backend": "gpu", "upstream_model": "Qwen/Qwen2.5-Coder-7B", "fim": "Qwen2.5-Coder",
                 "supersede": True, "priority": 5},
         "agent": {"backend": "gpu", "upstream_model": "Qwen/Qwen2.5-Coder-7B"},
         "raw": {"backend": "gpu", "upstream_model": "Qwen/Qwen2.5-Coder-7B"},
         "llama-coder": {"backend": "llama"},
         "gemma": {"backend": "gemma"},
         "ollama-coder": {"backend": "ollama", "upstream_model": "qwen2.5-coder:1.5b"},
         "thinker": {"backend": "thinker"}},
        auth={"keys": [{"name": "alice", "key": ALICE}, {"name": "bob", "key": BOB},
                       {"name": "tight", "key": TIGHT, "budget": {"tokens_per_day": 20}},
                       {"name": "solo", "key": SOLO, "max_concurrent": 1}],
              "admin_key_env": "HLF_TEST_ADMIN_KEY"},
        completions={"default_model": "llama-coder"},
    )
    with Gateway(cfg, env={"HLF_TEST_ADMIN_KEY": "sk-admin"}) as g:
        yield g


def queued(gw) -> int:
    """How many requests wait for a slot now (the gateway's own view, /admin/requests)."""
    return sum(r["phase"] == "queued" for r in gw.admin({"Authorization": "Bearer sk-admin"})["requests"])


@pytest.fixture
def client(gw, vllm, llama, gemma, ollama):
    for s in (vllm, llama, gemma, ollama):
        s.reset()
    return openai.OpenAI(base_url=gw.base, api_key=ALICE, max_retries=0)


def auth(key: str = ALICE) -> dict:
    return {"Authorization": f"Bearer {key}"}


def upstream(stub) -> dict:
    return stub.requests()[-1]["body"]


# -- /v1/completions ------------------------------------------------------------------------------


def test_plain_completion_echoes_the_model_and_the_backends_usage(client, vllm):
    got = client.completions.create(model="raw", prompt="def add(a, b):", max_tokens=5)
    assert got.object == "text_completion" and got.model == "raw"
    assert got.choices[0].text == " c1 c2 c3 c4 c5" and got.choices[0].finish_reason == "length"
    assert (got.usage.prompt_tokens, got.usage.completion_tokens) == (3, 5)  # the stub's own count
    body = upstream(vllm)
    assert body["model"] == "Qwen/Qwen2.5-Coder-7B" and body["prompt"] == "def add(a, b):"
    assert body["max_tokens"] == 5 and "suffix" not in body


def test_stream_with_include_usage(client, gw):
    raw = client.completions.with_raw_response.create(model="raw", prompt=["x = 1"], max_tokens=4, stream=True,
                                                      stream_options={"include_usage": True}, stop=["c3"])
    rid = raw.headers["request-id"]  # its own access-log line (an earlier test's stream of "raw" was cancelled)
    chunks = list(raw.parse())
    text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
    assert text == " c1 c2 "  # cut where the stop begins, as vLLM cuts
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 2
    assert all(ch.model == "raw" for ch in chunks)
    line, = wait_for(lambda: [r for r in gw.access_log() if r.get("id") == rid], timeout=10)
    assert line["outcome"] == "ok" and line["tokens_out"] == 2 and line["tokens_in"] == 3, line


def test_stream_without_include_usage_has_no_usage_chunk(gw):
    req = urllib.request.Request(gw.base + "/completions", method="POST", headers={**auth(), "content-type": "application/json"},
                                 data=json.dumps({"model": "llama-coder", "prompt": "a b", "max_tokens": 3,
                                                  "stream": True}).encode())
    with urllib.request.urlopen(req, timeout=30) as resp:
        raw = resp.read().decode()
    frames = [f[len("data: "):] for f in raw.split("\n\n") if f.startswith("data: ")]
    assert frames[-1] == "[DONE]"
    docs = [json.loads(f) for f in frames[:-1]]
    assert all(d["choices"] for d in docs) and all("usage" not in d for d in docs)
    assert "".join(d["choices"][0]["text"] for d in docs) == " c1 c2 c3"


@pytest.mark.parametrize("field,value,model", [("n", 2, "raw"), ("best_of", 3, "raw"), ("echo", True, "llama-coder"),
                                               ("logprobs", 2, "ollama-coder")])
def test_what_no_backend_of_the_model_can_do_is_a_400_naming_the_field(gw, field, value, model):
    status, doc = gw.post("/v1/completions", {"model": model, "prompt": "x", field: value}, auth())
    assert status == 400, doc
    assert doc["error"]["param"] == field and field in doc["error"]["message"]


def test_bad_prompt_is_a_400(gw):
    status, doc = gw.post("/llm/v1/completions", {"model": "raw", "prompt": ["a", "b"]}, auth())
    assert status == 400 and doc["error"]["param"] == "prompt"
    status, doc = gw.post("/llm/v1/completions", {"model": "raw"}, auth())
    assert status == 400 and doc["error"]["param"] == "prompt"


# -- fill in the middle ---------------------------------------------------------------------------


def test_suffix_is_rendered_through_the_models_template(client, vllm):
    got = client.completions.create(model=CODER, prompt="def f():\n    ", suffix="\n    return x", max_tokens=2)
    assert got.choices[0].text == " c1 c2"
    body = upstream(vllm)
    assert body["prompt"] == "<|fim_prefix|>def f():\n    <|fim_suffix|>\n    return x<|fim_middle|>"
    assert "suffix" not in body


def test_suffix_without_template_on_vllm_is_a_400_naming_suffix(gw, client, vllm):
    status, doc = gw.post("/v1/completions", {"model": "raw", "prompt": "a", "suffix": "b"}, auth())
    assert status == 400 and doc["error"]["param"] == "suffix" and "fim" in doc["error"]["message"]
    assert vllm.requests() == []  # refused before it took a slot


def test_suffix_without_template_goes_to_llamacpps_infill(client, llama):
    got = client.completions.create(model="llama-coder", prompt="int main() {", suffix="}", max_tokens=3)
    assert got.choices[0].text == " c1 c2 c3" and got.model == "llama-coder"
    assert got.usage.completion_tokens == 3 and got.usage.prompt_tokens == 7  # llama.cpp's own: 4 words, 3 FIM tokens
    body = upstream(llama)
    assert body["input_prefix"] == "int main() {" and body["input_suffix"] == "}" and body["n_predict"] == 3


def test_suffix_to_a_model_without_fim_tokens_is_a_clear_400(gw, gemma):
    status, doc = gw.post("/v1/completions", {"model": "gemma", "prompt": "a", "suffix": "b"}, auth())
    assert status == 400, doc
    assert doc["error"]["param"] == "suffix" and "Infill is not supported" in doc["error"]["message"]


def test_suffix_goes_to_ollama_as_suffix(client, ollama):
    client.completions.create(model="ollama-coder", prompt="a", suffix="b", max_tokens=2)
    body = upstream(ollama)
    assert body["suffix"] == "b" and body["prompt"] == "a"


# -- /infill --------------------------------------------------------------------------------------

LLAMA_VSCODE = {  # llama.vscode's request (src/llama-server.ts, createRequestPayload)
    "input_prefix": "def add(a, b):\n    ", "input_suffix": "\n", "prompt": "ret",
    "input_extra": [{"text": "import math\n", "time": 1, "filename": "util.py"}],
    "n_predict": 4, "top_k": 40, "top_p": 0.99, "stream": False, "samplers": ["top_k", "top_p", "infill"],
    "cache_prompt": True, "n_indent": 4, "t_max_prompt_ms": 500, "t_max_predict_ms": 1000,
}


def test_infill_is_relayed_to_llamacpp_with_the_default_model(gw, client, llama):
    status, doc = gw.post("/infill", LLAMA_VSCODE, auth())
    assert status == 200, doc
    assert doc["content"] == " c1 c2 c3 c4" and doc["stop"] is True and doc["stop_type"] == "limit"
    assert doc["tokens_predicted"] == 4 and doc["model"] == "llama-coder"
    body = upstream(llama)
    assert body["input_prefix"] == LLAMA_VSCODE["input_prefix"] and body["t_max_predict_ms"] == 1000
    assert body["input_extra"] == LLAMA_VSCODE["input_extra"] and body["stream"] is True


def test_infill_rendered_through_the_template_for_another_backend(gw, client, vllm):
    status, doc = gw.post("/infill", {**LLAMA_VSCODE, "model": CODER}, auth())
    assert status == 200, doc
    assert doc["content"] == " c1 c2 c3 c4"
    body = upstream(vllm)
    assert body["prompt"] == ("util.py\nimport math\n<|fim_prefix|>def add(a, b):\n    ret<|fim_suffix|>\n"
                              "<|fim_middle|>")
    assert body["max_tokens"] == 4


def test_llama_vscodes_warm_up_on_another_backend_generates_one_token(gw, client, vllm):
    status, doc = gw.post("/infill", {**LLAMA_VSCODE, "model": CODER, "n_predict": 0, "samplers": []}, auth())
    assert status == 200 and doc["stop"] is True
    assert upstream(vllm)["max_tokens"] == 1


def test_infill_stream(gw, client):
    req = urllib.request.Request(gw.url + "/infill", method="POST", headers={**auth(), "content-type": "application/json"},
                                 data=json.dumps({**LLAMA_VSCODE, "stream": True}).encode())
    with urllib.request.urlopen(req, timeout=30) as resp:
        raw = resp.read().decode()
    docs = [json.loads(f[len("data: "):]) for f in raw.split("\n\n") if f.startswith("data: ")]
    assert "".join(d["content"] for d in docs) == " c1 c2 c3 c4"
    assert [d["stop"] for d in docs] == [False] * 4 + [True]


def test_infill_on_a_model_without_fim_tokens_is_llamacpps_400(gw, client):
    status, doc = gw.post("/infill", {**LLAMA_VSCODE, "model": "gemma"}, auth())
    assert status == 400
    assert doc["error"]["code"] == 400 and doc["error"]["type"] == "invalid_request_error"
    assert "Infill is not supported" in doc["error"]["message"]


def test_infill_missing_field_in_llamacpps_shape(gw):
    status, doc = gw.post("/infill", {"input_prefix": "x"}, auth())
    assert status == 400 and "input_suffix" in doc["error"]["message"] and doc["error"]["code"] == 400


# -- latest wins ----------------------------------------------------------------------------------


def _stream_in_thread(gw, key: str, body: dict, out: list):
    def run():
        req = urllib.request.Request(gw.base + "/completions", method="POST",
                                     headers={**auth(key), "content-type": "application/json"},
                                     data=json.dumps({**body, "stream": True}).encode())
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                out.append((resp.status, resp.read().decode()))
        except urllib.error.HTTPError as err:
            out.append((err.code, err.read().decode()))

    th = threading.Thread(target=run)
    th.start()
    return th


def test_a_newer_completion_cancels_the_generating_one(gw, client, vllm):
    old: list = []
    th = _stream_in_thread(gw, ALICE, {"model": CODER, "prompt": "old [stub delay_ms=50]", "max_tokens": 200}, old)
    wait_for(lambda: "request id=" in vllm.log_text() and vllm.stats()["in_flight"] == 1, timeout=20)
    got = client.completions.create(model=CODER, prompt="new", max_tokens=3)
    th.join(30)
    assert got.choices[0].text == " c1 c2 c3"
    status, raw = old[0]
    assert status == 200 and "superseded" in raw and "[DONE]" not in raw
    # the backend's own evidence: the old generation was cancelled, well before its 200 tokens
    line = wait_for(lambda: [ln for ln in vllm.log_lines() if ln.startswith("cancelled")], timeout=10)[0]
    assert int(line.split("after ")[1].split()[0]) < 200
    rec = wait_for(lambda: [r for r in gw.access_log() if r.get("outcome") == "cancelled_superseded"], timeout=10)
    assert rec[-1]["model"] == CODER


def test_a_newer_completion_takes_a_queued_ones_place_before_it_reaches_the_backend(gw, client, vllm):
    # bob's long agent turn holds the backend's only slot; alice's first completion queues
    busy: list = []
    agent = _stream_in_thread(gw, BOB, {"model": "raw", "prompt": "busy [stub delay_ms=20]", "max_tokens": 150}, busy)
    wait_for(lambda: vllm.stats()["in_flight"] == 1, timeout=20)
    stale: list = []
    th = _stream_in_thread(gw, ALICE, {"model": CODER, "prompt": "stale", "max_tokens": 3}, stale)
    wait_for(lambda: queued(gw) == 1, timeout=10)
    got = client.completions.create(model=CODER, prompt="fresh", max_tokens=3)
    th.join(30)
    agent.join(30)
    assert got.choices[0].text == " c1 c2 c3"
    status, raw = stale[0]
    assert status == 400 and "superseded" in raw
    prompts = [r["body"].get("prompt") for r in vllm.requests()]
    assert "stale" not in prompts and "fresh" in prompts  # the stale one never reached the backend


def test_a_key_with_max_concurrent_1_is_not_refused_for_the_completion_it_replaces(gw, client, vllm):
    # the new completion waits for the one it cancelled to give back the key's hold and its slot
    old: list = []
    th = _stream_in_thread(gw, SOLO, {"model": CODER, "prompt": "old [stub delay_ms=50]", "max_tokens": 200}, old)
    wait_for(lambda: vllm.stats()["in_flight"] == 1, timeout=20)
    solo = openai.OpenAI(base_url=gw.base, api_key=SOLO, max_retries=0)
    got = solo.completions.create(model=CODER, prompt="new", max_tokens=2)
    th.join(30)
    assert got.choices[0].text == " c1 c2" and "superseded" in old[0][1]


def test_other_clients_and_chat_are_never_superseded(gw, client, vllm):
    other: list = []
    th = _stream_in_thread(gw, BOB, {"model": CODER, "prompt": "bob [stub delay_ms=10]", "max_tokens": 20}, other)
    wait_for(lambda: vllm.stats()["in_flight"] == 1, timeout=20)
    client.completions.create(model=CODER, prompt="alice", max_tokens=2)
    th.join(30)
    assert other[0][0] == 200 and "[DONE]" in other[0][1]
    # alice's own chat turn on the same model: a completion never supersedes a chat
    chat: list = []

    def chat_turn():
        chat.append(client.chat.completions.create(
            model=CODER, messages=[{"role": "user", "content": "[stub content=20 delay_ms=10] hi"}]))

    ct = threading.Thread(target=chat_turn)
    ct.start()
    wait_for(lambda: vllm.stats()["in_flight"] == 1, timeout=20)
    client.completions.create(model=CODER, prompt="alice again", max_tokens=2)
    ct.join(30)
    assert chat and chat[0].choices[0].finish_reason
    assert vllm.stats()["cancelled"] == 0


def test_completion_priority_goes_before_a_queued_agent_turn(gw, client, vllm):
    # the slot is busy; an agent turn queues first, then a completion of the priority-5 model
    busy: list = []
    first = _stream_in_thread(gw, BOB, {"model": "raw", "prompt": "busy [stub delay_ms=20]", "max_tokens": 150}, busy)
    wait_for(lambda: vllm.stats()["in_flight"] == 1, timeout=20)
    agent: list = []
    a = _stream_in_thread(gw, BOB, {"model": "agent", "prompt": "agent turn", "max_tokens": 2}, agent)
    wait_for(lambda: queued(gw) == 1, timeout=10)
    comp: list = []
    b = _stream_in_thread(gw, ALICE, {"model": CODER, "prompt": "keystroke", "max_tokens": 2}, comp)
    wait_for(lambda: queued(gw) == 2, timeout=10)
    for th in (first, a, b):
        th.join(30)
    prompts = [r["body"].get("prompt") for r in vllm.requests()]
    assert prompts.index("keystroke") < prompts.index("agent turn")


# -- Ollama's /api/generate: raw and suffix ---------------------------------------------------------


@pytest.fixture
def oc(gw, client):
    return ollama_sdk.Client(host=gw.url, headers=auth())


def test_ollama_raw_generate_sends_the_prompt_verbatim(oc, vllm):
    got = oc.generate(model="raw", prompt="<|fim_prefix|>a<|fim_suffix|>b<|fim_middle|>", raw=True,
                      options={"num_predict": 3, "temperature": 0.2}, stream=False)
    assert got.response == " c1 c2 c3" and got.done and got.done_reason == "length"
    assert got.eval_count == 3 and got.prompt_eval_count == 1  # the backend's own figures
    assert got.total_duration > 0 and got.eval_duration > 0 and got.load_duration >= 0
    body = upstream(vllm)
    assert body["prompt"] == "<|fim_prefix|>a<|fim_suffix|>b<|fim_middle|>" and body["max_tokens"] == 3
    assert body["temperature"] == 0.2 and "messages" not in body


def test_ollama_generate_suffix_through_the_template_streamed(oc, vllm):
    parts = list(oc.generate(model=CODER, prompt="def f():", suffix="return 1", raw=True,
                             options={"num_predict": 4, "stop": ["c4"]}, stream=True))
    assert "".join(p.response for p in parts) == " c1 c2 c3 "
    last = parts[-1]
    assert last.done and last.done_reason == "stop" and last.eval_count == 3 and last.prompt_eval_count == 3
    assert all(not p.done for p in parts[:-1])
    assert upstream(vllm)["prompt"] == "<|fim_prefix|>def f():<|fim_suffix|>return 1<|fim_middle|>"


def test_ollama_generate_suffix_to_llamacpp_and_to_a_model_without_fim(oc, llama):
    got = oc.generate(model="llama-coder", prompt="x =", suffix="\n", options={"num_predict": 2})
    assert got.response == " c1 c2" and upstream(llama)["input_prefix"] == "x ="
    with pytest.raises(ollama_sdk.ResponseError) as exc:
        oc.generate(model="gemma", prompt="x =", suffix="y")
    assert exc.value.status_code == 400 and exc.value.error.startswith("suffix:")


def test_ollama_raw_generate_with_more_tokens_than_the_context_is_vllms_400_not_an_endless_answer(gw, vllm):
    """vLLM refuses `max_tokens` over its whole context on /v1/completions too (and fits a smaller
    one to what the prompt leaves); the stub did not, and generated 2**31 tokens for the fuzz
    test's `num_predict: 2147483648` while the gateway held the slot (test_fuzz_surfaces)."""
    oc = ollama_sdk.Client(host=gw.url, headers=auth(), timeout=60)  # without the refusal: no answer
    with pytest.raises(ollama_sdk.ResponseError) as exc:
        oc.generate(model="raw", prompt="x", raw=True, options={"num_predict": 2**31}, stream=False)
    assert exc.value.status_code == 400 and "max_tokens=2147483648 cannot be greater than" in exc.value.error
    assert vllm.log_lines()[-1].startswith("rejected status=400")
    assert vllm.stats()["in_flight"] == 0 and gw.admin(auth("sk-admin"))["requests"] == []


def test_ollama_raw_with_images_is_a_400(oc):
    with pytest.raises(ollama_sdk.ResponseError) as exc:
        oc.generate(model="raw", prompt="x", raw=True, images=["iVBORw0KGgo="])
    assert exc.value.status_code == 400 and exc.value.error.startswith("images:")


def test_think_false_drops_the_reasoning_a_backend_sends_anyway(oc, thinker):
    thinker.reset()
    got = oc.chat(model="thinker", messages=[{"role": "user", "content": "[stub reasoning=5 content=3]"}],
                  think=False, stream=False)
    assert not got.message.thinking and got.message.content
    assert got.eval_count == 8  # the reasoning was generated: it still counts
    parts = list(oc.generate(model="thinker", prompt="[stub reasoning=5 content=3]", think=False, stream=True))
    assert not any(p.thinking for p in parts) and "".join(p.response for p in parts)
    assert parts[-1].eval_count == 8
    with_thinking = oc.chat(model="thinker", messages=[{"role": "user", "content": "[stub reasoning=5 content=3]"}],
                            stream=False)
    assert with_thinking.message.thinking  # not asked to hide: shown


CONTINUE_OLLAMA_FIM = {  # Continue's Ollama provider, _streamFim (core/llm/llms/Ollama.ts)
    "prompt": "def add(a, b):\n    ", "suffix": "\n\nprint(add(1, 2))", "raw": True,
    "options": {"temperature": 0.01, "num_predict": 4, "stop": ["\n\n"], "num_ctx": 8096},
    "keep_alive": 1800, "stream": True,
}


def test_continue_ollama_provider_sees_fim_and_its_request_is_served(gw, oc, vllm):
    # Continue decides a model takes a suffix when /api/show's template has `.Suffix`
    shown = oc.show(CODER)
    assert ".Suffix" in shown.template and "insert" in shown.capabilities
    assert "insert" not in (oc.show("raw").capabilities or [])
    req = urllib.request.Request(gw.url + "/api/generate", method="POST",
                                 headers={**auth(), "content-type": "application/json"},
                                 data=json.dumps({**CONTINUE_OLLAMA_FIM, "model": CODER}).encode())
    with urllib.request.urlopen(req, timeout=30) as resp:
        lines = [json.loads(x) for x in resp.read().splitlines()]
    assert "".join(x["response"] for x in lines) == " c1 c2 c3 c4" and lines[-1]["done"]
    body = upstream(vllm)
    assert body["prompt"] == "<|fim_prefix|>def add(a, b):\n    <|fim_suffix|>\n\nprint(add(1, 2))<|fim_middle|>"
    assert body["stop"] == ["\n\n"] and body["temperature"] == 0.01


def test_continue_openai_provider_legacy_completions_replayed(gw, client, vllm):
    # Continue's OpenAI provider for autocomplete (legacy completions, streamed, FIM already in the prompt)
    req = urllib.request.Request(gw.base + "/completions", method="POST",
                                 headers={**auth(), "content-type": "application/json"},
                                 data=json.dumps({"model": "raw", "prompt": "<|fim_prefix|>x = <|fim_suffix|>\n<|fim_middle|>",
                                                  "max_tokens": 3, "temperature": 0.01, "stream": True,
                                                  "stop": ["<|endoftext|>", "<|fim_pad|>"], "frequency_penalty": 0,
                                                  "presence_penalty": 0, "user": "continue"}).encode())
    with urllib.request.urlopen(req, timeout=30) as resp:
        raw = resp.read().decode()
    assert raw.rstrip().endswith("data: [DONE]")
    body = upstream(vllm)
    assert "user" not in body and body["stop"] == ["<|endoftext|>", "<|fim_pad|>"]


# Twinny's FIM request for Ollama (src/extension/completion/request-body.ts, createStreamRequestBodyFim):
# the prompt already in the model's FIM form, no `raw`, so the model's own template applies (a chat
# for a chat model, as Ollama does; base code models' templates are the prompt alone)
TWINNY_OLLAMA = {
    "prompt": "<PRE> const x = <SUF>; <MID>", "stream": True, "keep_alive": "5m",
    "options": {"temperature": 0.2, "num_predict": 3},
}


def test_twinny_ollama_fim_replayed(gw, oc, vllm):
    req = urllib.request.Request(gw.url + "/api/generate", method="POST",
                                 headers={**auth(), "content-type": "application/json"},
                                 data=json.dumps({**TWINNY_OLLAMA, "model": "raw"}).encode())
    with urllib.request.urlopen(req, timeout=30) as resp:
        lines = [json.loads(x) for x in resp.read().splitlines()]
    assert lines[-1]["done"] and lines[-1]["eval_count"] == 3


# -- like chat: cancelled, metered, budgeted --------------------------------------------------------


def test_a_client_leaving_mid_stream_cancels_the_generation(gw, client, vllm, llama):
    for stub, model, path, body in [
        (vllm, "raw", "/llm/v1/completions", {"prompt": "x [stub delay_ms=30]", "max_tokens": 300, "stream": True}),
        (llama, "llama-coder", "/infill", {"input_prefix": "x [stub delay_ms=30]", "input_suffix": "",
                                          "n_predict": 300, "stream": True}),
    ]:
        post_and_vanish(gw.url + path, {**body, "model": model}, after_bytes=200, headers=auth())
        line = wait_for(lambda: [ln for ln in stub.log_lines() if ln.startswith("cancelled")], timeout=10)[0]
        assert int(line.split("after ")[1].split()[0]) < 300
        wait_for(lambda: stub.stats()["in_flight"] == 0, timeout=10)


def test_completion_tokens_reach_the_usage_ledger_and_the_budget(gw, client):
    got = client.completions.create(model="raw", prompt="one two three", max_tokens=4)
    assert got.usage.total_tokens == 7

    def mine():
        status, doc = gw.get("/llm/v1/usage?group=day", auth())
        assert status == 200, doc
        return [r for r in doc["rows"] if r.get("model") == "raw"]

    rows = wait_for(mine, timeout=10)
    assert sum(r["output_tokens"] for r in rows) >= 4
    tight = openai.OpenAI(base_url=gw.base, api_key=TIGHT, max_retries=0)
    with pytest.raises(openai.RateLimitError) as exc:
        for _ in range(10):
            tight.completions.create(model="raw", prompt="a b c d e", max_tokens=5)
            time.sleep(0.6)  # the ledger's flush (usage.flush_interval_s)
    assert "tokens_per_day" in str(exc.value)
    status, doc = gw.post("/infill", {**LLAMA_VSCODE}, auth(TIGHT))
    assert status == 429 and doc["error"]["code"] == 429  # in llama.cpp's shape


def test_an_ollama_raw_generate_is_superseded_like_any_completion(gw, oc, vllm):
    old: list = []

    def stale():
        try:
            for _ in oc.generate(model=CODER, prompt="old [stub delay_ms=50]", raw=True,
                                 options={"num_predict": 200}, stream=True):
                pass
        except ollama_sdk.ResponseError as err:
            old.append(err.error)

    th = threading.Thread(target=stale)
    th.start()
    wait_for(lambda: vllm.stats()["in_flight"] == 1, timeout=20)
    got = oc.generate(model=CODER, prompt="new", raw=True, options={"num_predict": 2}, stream=False)
    th.join(30)
    assert got.response == " c1 c2"
    assert old and "superseded" in old[0]
    assert wait_for(lambda: [ln for ln in vllm.log_lines() if ln.startswith("cancelled")], timeout=10)
