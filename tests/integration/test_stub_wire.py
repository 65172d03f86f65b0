"""The stub upstreams as real processes: their bytes on the wire, and how they notice a client leaving.

Raw HTTP checks the exact shapes the gateway's decoder will meet; the official `openai` SDK
pointed straight at each stub checks that a real client accepts them.
"""

from __future__ import annotations

import http.client
import json
import re
import socket
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import openai
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from stubproc import StubHandle, start_stub, wait_for  # noqa: E402

VLLM_MODEL = "deepseek-ai/DeepSeek-R1-Distill-Qwen-32B"
OLLAMA_MODEL = "qwen2.5:3b-instruct"
BASH_SCHEMA = {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}
BASH = [{"type": "function", "function": {"name": "Bash", "description": "run", "parameters": BASH_SCHEMA}}]


def said(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


@pytest.fixture(scope="module")
def vllm():
    with start_stub("vllm", "--reasoning") as stub:
        yield stub


@pytest.fixture(scope="module")
def ollama():
    with start_stub("ollama") as stub:
        yield stub


@pytest.fixture(scope="module")
def strict():
    args = ["--api-key", "sekret", "--reasoning", "--reasoning-field", "both", "--max-model-len", "64"]
    with start_stub("vllm", *args, "--model", "alpha", "--model", "beta") as stub:
        yield stub


# -- helpers --


def post(stub: StubHandle, path: str, body: dict, headers: dict | None = None) -> tuple[int, dict, bytes]:
    parts = urlsplit(stub.url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    try:
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def get(stub: StubHandle, path: str, headers: dict | None = None) -> tuple[int, bytes]:
    parts = urlsplit(stub.url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    try:
        conn.request("GET", path, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def frames(raw: bytes) -> list[str]:
    assert raw.endswith(b"\n\n"), raw[-80:]
    out = []
    for block in raw.decode().split("\n\n")[:-1]:
        assert block.startswith("data: "), block
        out.append(block[len("data: ") :])
    return out


def chat(stub: StubHandle, text: str, model: str = VLLM_MODEL, **extra) -> tuple[int, dict, bytes]:
    return post(stub, "/v1/chat/completions", {"model": model, "messages": [{"role": "user", "content": text}], **extra})


def stream(stub: StubHandle, text: str, model: str = VLLM_MODEL, **extra) -> list[dict]:
    status, headers, raw = chat(stub, text, model, stream=True, **extra)
    assert status == 200, raw
    assert headers["content-type"].startswith("text/event-stream")
    data = frames(raw)
    assert data[-1] == "[DONE]" and data.count("[DONE]") == 1
    return [json.loads(d) for d in data[:-1]]


def cancelled_lines(stub: StubHandle) -> list[str]:
    return [line for line in stub.log_lines() if "cancelled" in line]


def open_request(stub: StubHandle, text: str, stream_: bool = True) -> socket.socket:
    body = json.dumps({"model": VLLM_MODEL, "messages": [{"role": "user", "content": text}], "stream": stream_}).encode()
    parts = urlsplit(stub.url)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=5)
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: stub\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    sock.sendall(head.encode() + body)
    return sock


def read_until(sock: socket.socket, marker: bytes) -> bytes:
    data = b""
    while marker not in data:
        piece = sock.recv(65536)
        assert piece, data
        data += piece
    return data


def assert_one_cancel(stub: StubHandle, before: int, seq_hint: str | None = None) -> None:
    started = time.monotonic()
    wait_for(lambda: len(cancelled_lines(stub)) > before, timeout=1.0)
    wait_for(lambda: stub.stats()["in_flight"] == 0, timeout=1.0)
    assert time.monotonic() - started < 1.0
    time.sleep(0.1)  # nothing else may trickle in
    lines = cancelled_lines(stub)
    assert len(lines) == before + 1, lines
    if seq_hint:
        assert seq_hint in lines[-1]


# -- vLLM flavour --


def test_vllm_stream_shapes(vllm):
    chunks = stream(vllm, "hi [stub reasoning=2 content=3]")
    first = chunks[0]
    assert set(first) == {"id", "object", "created", "model", "choices", "prompt_token_ids", "prompt_text"}
    assert first["id"].startswith("chatcmpl-") and first["object"] == "chat.completion.chunk"
    role = {"role": "assistant", "content": ""}
    assert first["choices"] == [{"index": 0, "delta": role, "logprobs": None, "finish_reason": None}]
    assert [c["choices"][0]["delta"] for c in chunks[1:3]] == [{"reasoning": "Let "}, {"reasoning": "me "}]
    assert [c["choices"][0]["delta"] for c in chunks[3:6]] == [{"content": "Hello "}, {"content": "from "}, {"content": "the "}]
    token = {"index": 0, "delta": {"reasoning": "Let "}, "logprobs": None, "finish_reason": None, "token_ids": None}
    assert chunks[1]["choices"][0] == token
    last = chunks[-1]["choices"][0]
    assert last == {  # an end that brings no text: an empty delta, with a reasoning parser
        "index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop", "stop_reason": None, "token_ids": None
    }
    assert chunks[-1]["system_fingerprint"].startswith("vllm-")  # on the last chunk only
    assert all("system_fingerprint" not in c for c in chunks[:-1])
    assert all("usage" not in c for c in chunks)
    assert len({c["id"] for c in chunks}) == 1


def test_vllm_hidden_reasoning_sends_no_empty_chunks(vllm):
    chunks = stream(vllm, "hi [stub reasoning=3 content=1]", include_reasoning=False)
    assert [c["choices"][0]["delta"] for c in chunks] == [
        {"role": "assistant", "content": ""}, {"content": "Hello ", "reasoning": None}, {}]


def test_vllm_usage_only_when_asked(vllm):
    chunks = stream(vllm, "hi [stub reasoning=1 content=2]", stream_options={"include_usage": True})
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == {"prompt_tokens": 4 + 4, "total_tokens": 11, "completion_tokens": 3,
                                   "completion_tokens_details": {"reasoning_tokens": 1}}
    assert all("usage" not in c for c in chunks[:-1])
    options = {"include_usage": True, "continuous_usage_stats": True}
    continuous = stream(vllm, "hi [stub reasoning=0 content=2]", stream_options=options)
    assert [c["usage"]["completion_tokens"] for c in continuous] == [0, 1, 2, 2, 2]


def test_vllm_stop_string_sets_stop_reason(vllm):
    chunks = stream(vllm, "count to 9 [stub reasoning=0]", stop=[" 4,", "never"])
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert text == "1, 2, 3,"
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"][0]["stop_reason"] == " 4,"
    status, _, raw = chat(vllm, "count to 9 [stub reasoning=0]", stop=" 4,")
    body = json.loads(raw)
    assert body["choices"][0]["message"]["content"] == "1, 2, 3,"
    assert body["choices"][0]["stop_reason"] == " 4,"


def test_vllm_length_counts_reasoning(vllm):
    chunks = stream(vllm, "hi [stub reasoning=3 content=5]", max_tokens=4, stream_options={"include_usage": True})
    finish = chunks[-2]["choices"][0]
    assert finish["finish_reason"] == "length" and finish["delta"] == {"content": "Hello "}
    assert chunks[-1]["usage"]["completion_tokens"] == 4


def test_vllm_tool_call_stream(vllm):
    chunks = stream(vllm, 'go [stub reasoning=0 tool=Bash args={"command":"ls"}]', tools=BASH)
    deltas = [c["choices"][0]["delta"] for c in chunks[1:]]
    first = deltas[0]
    assert first["content"] is None
    (call,) = first["tool_calls"]
    assert call["id"].startswith("chatcmpl-tool-") and call["type"] == "function" and call["index"] == 0
    assert call["function"] == {"name": "Bash"}
    fragments = [d["tool_calls"][0] for d in deltas[1:-1]]
    assert len(fragments) >= 2 and all(set(f) == {"index", "function"} for f in fragments)
    assert json.loads("".join(f["function"]["arguments"] for f in fragments)) == {"command": "ls"}
    assert deltas[-1] == {}
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_vllm_split_puts_content_tool_and_finish_together(vllm):
    chunks = stream(vllm, "go [stub reasoning=0 content=2 tool=Bash split=1]", tools=BASH)
    merged = chunks[2]["choices"][0]["delta"]
    assert merged["content"] == "from " and merged["tool_calls"][0]["function"]["name"] == "Bash"
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls" and chunks[-1]["choices"][0]["delta"]["tool_calls"]
    text = stream(vllm, "x [stub reasoning=0 content=2 split=1]")
    assert text[-1]["choices"][0]["delta"] == {"content": "from "} and text[-1]["choices"][0]["finish_reason"] == "stop"


def test_vllm_non_streaming_body(vllm):
    status, headers, raw = chat(vllm, "hi [stub reasoning=2 content=2]")
    assert status == 200 and headers["content-type"].startswith("application/json")
    body = json.loads(raw)
    message = body["choices"][0]["message"]
    assert message["content"] == "Hello from " and message["reasoning"] == "Let me "
    assert "tool_calls" not in message
    assert body["choices"][0]["finish_reason"] == "stop" and body["choices"][0]["stop_reason"] is None
    assert body["usage"] == {"prompt_tokens": 8, "total_tokens": 12, "completion_tokens": 4, "prompt_tokens_details": None,
                             "completion_tokens_details": {"reasoning_tokens": 2}}


def test_vllm_errors(vllm):
    status, _, raw = chat(vllm, "x", max_tokens=5000)
    assert status == 400
    error = json.loads(raw)["error"]
    assert error["type"] == "BadRequestError" and error["code"] == 400 and error["param"] == "max_tokens"
    assert error["message"] == ("max_tokens=5000 cannot be greater than max_model_len=4096. Please request fewer "
                                "output tokens. (parameter=max_tokens, value=5000)")
    status, _, raw = chat(vllm, "x", model="nope")
    assert status == 404
    error = {"message": f"The model `nope` does not exist. Valid aliases: {VLLM_MODEL}.", "type": "NotFoundError",
             "param": "model", "code": 404}
    assert json.loads(raw) == {"error": error}
    status, _, raw = chat(vllm, "x", stream_options={"include_usage": True})
    assert status == 400 and json.loads(raw)["error"]["param"] == "stream_options"
    status, _, raw = chat(vllm, "x [stub status=429]", stream=True)
    assert status == 429 and json.loads(raw)["error"]["message"] == "stub error 429"


def test_vllm_error_after_sends_error_frame_then_done(vllm):
    status, _, raw = chat(vllm, "x [stub reasoning=0 content=5 error_after=2]", stream=True)
    data = frames(raw)
    assert data[-1] == "[DONE]"
    error = {"message": "Internal server error", "type": "InternalServerError", "param": None, "code": 500}
    assert json.loads(data[-2]) == {"error": error}
    assert len(data) == 5  # role, 2 tokens, error, [DONE]


def test_fail_after_leaves_an_incomplete_stream(vllm):
    parts = urlsplit(vllm.url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=5)
    prompt = "x [stub reasoning=0 content=5 fail_after=2]"
    body = {"model": VLLM_MODEL, "messages": said(prompt), "stream": True}
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    with pytest.raises(http.client.IncompleteRead) as info:
        resp.read()
    assert b"from " in info.value.partial and b"[DONE]" not in info.value.partial
    conn.close()
    client = openai.OpenAI(base_url=vllm.base, api_key="x", max_retries=0)
    with pytest.raises((openai.APIError, Exception)):
        list(client.chat.completions.create(model=VLLM_MODEL, messages=said(prompt), stream=True))
    assert any(line.startswith("aborted ") for line in vllm.log_lines())


def test_disconnect_mid_stream_logs_one_cancel(vllm):
    before = len(cancelled_lines(vllm))
    sock = open_request(vllm, "x [stub reasoning=0 content=200 delay_ms=20]")
    read_until(sock, b'"content":"from "')
    assert vllm.stats()["in_flight"] == 1
    sock.close()
    assert_one_cancel(vllm, before)


def test_disconnect_during_headers_wait_logs_one_cancel(vllm):
    before = len(cancelled_lines(vllm))
    sock = open_request(vllm, "x [stub headers_ms=5000]")
    wait_for(lambda: vllm.stats()["in_flight"] == 1, timeout=1.0)
    sock.close()
    assert_one_cancel(vllm, before, "after 0 tokens")


def test_disconnect_before_first_token_and_non_streaming(vllm):
    before = len(cancelled_lines(vllm))
    sock = open_request(vllm, "x [stub ttft_ms=5000]")
    read_until(sock, b"\r\n\r\n")  # headers arrived, no token yet
    sock.close()
    assert_one_cancel(vllm, before, "after 0 tokens")
    sock = open_request(vllm, "x [stub content=200 delay_ms=10]", stream_=False)
    wait_for(lambda: vllm.stats()["in_flight"] == 1, timeout=1.0)
    time.sleep(0.05)
    sock.close()
    assert_one_cancel(vllm, before + 1)


def test_completed_and_request_lines_are_logged(vllm):
    stream(vllm, "x [stub reasoning=1 content=2]")
    lines = vllm.log_lines()
    request_id = lines[-2].split()[1]
    assert re.fullmatch(rf"request {request_id} model={re.escape(VLLM_MODEL)} stream=true seq=\d+", lines[-2])
    assert re.fullmatch(rf"completed {request_id} tokens=3 seq=\d+", lines[-1])


def test_openai_sdk_reads_vllm(vllm):
    client = openai.OpenAI(base_url=vllm.base, api_key="x", max_retries=0)
    done = client.chat.completions.create(model=VLLM_MODEL, messages=said("hi [stub content=3]"))
    assert done.choices[0].message.content == "Hello from the "
    assert done.choices[0].message.model_extra["reasoning"].startswith("Let me think")
    parts, reasoning, usage = [], [], None
    for chunk in client.chat.completions.create(
        model=VLLM_MODEL, messages=said("hi [stub content=3]"), stream=True, stream_options={"include_usage": True}
    ):
        if chunk.usage:
            usage = chunk.usage
        for choice in chunk.choices:
            parts.append(choice.delta.content or "")
            reasoning.append((choice.delta.model_extra or {}).get("reasoning") or "")
    assert "".join(parts) == "Hello from the " and "".join(reasoning).startswith("Let me")
    assert usage.completion_tokens == 11
    tool = client.chat.completions.create(model=VLLM_MODEL, messages=said("x [stub tool=Bash]"), tools=BASH)
    call = tool.choices[0].message.tool_calls[0]
    assert tool.choices[0].finish_reason == "tool_calls" and call.function.name == "Bash"
    assert json.loads(call.function.arguments) == {"command": "echo hello-from-tool"}


def test_vllm_side_endpoints(vllm):
    status, raw = get(vllm, "/v1/models")
    (card,) = json.loads(raw)["data"]
    assert card["id"] == VLLM_MODEL and card["max_model_len"] == 4096 and card["owned_by"] == "vllm"
    messages = [{"role": "user", "content": "one two three"}]
    _, _, raw = post(vllm, "/tokenize", {"model": VLLM_MODEL, "messages": messages})
    tokens = json.loads(raw)
    assert tokens["count"] == 7 == len(tokens["tokens"]) and tokens["max_model_len"] == 4096
    _, _, raw = chat(vllm, "one two three")
    assert json.loads(raw)["usage"]["prompt_tokens"] == 7
    _, _, raw = post(vllm, "/v1/embeddings", {"model": VLLM_MODEL, "input": ["a", "b"]})
    data = json.loads(raw)["data"]
    assert len(data) == 2 and data[0]["embedding"] != data[1]["embedding"] and len(data[0]["embedding"]) == 8
    sock = open_request(vllm, "x [stub ttft_ms=3000]")
    wait_for(lambda: vllm.stats()["in_flight"] == 1, timeout=1.0)
    _, metrics = get(vllm, "/metrics")
    assert f'vllm:num_requests_running{{engine="0",model_name="{VLLM_MODEL}"}} 1.0' in metrics.decode()
    sock.close()
    wait_for(lambda: vllm.stats()["in_flight"] == 0, timeout=1.0)


def test_requests_stats_and_reset(vllm):
    vllm.reset()
    assert vllm.requests() == []
    body = {"model": VLLM_MODEL, "messages": [{"role": "user", "content": "remember me [stub content=1]"}]}
    post(vllm, "/v1/chat/completions", body, {"X-Trace": "t1"})
    (seen,) = vllm.requests()
    assert seen["body"]["messages"][0]["content"] == "remember me [stub content=1]"
    assert seen["headers"]["x-trace"] == "t1"
    stats = vllm.stats()
    assert stats == {"in_flight": 0, "max_in_flight": 1, "total": 1, "cancelled": 0, "completed": 1, "failed": 0,
                     "prompt_tokens": 8, "cached_tokens": 0, "upload_bytes": 0}  # 4 template tokens + 4 words; no cache modelled
    assert seen["cached_tokens"] is None


# -- Ollama flavour --


def test_ollama_stream_shapes(ollama):
    chunks = stream(ollama, "hi [stub reasoning=5 content=2]", model=OLLAMA_MODEL, stream_options={"include_usage": True})
    for c in chunks:
        assert c["id"].startswith("chatcmpl-") and c["id"][len("chatcmpl-") :].isdigit()
        assert c["system_fingerprint"] == "fp_ollama"
    assert [c["choices"][0] for c in chunks[:-1]] == [
        {"index": 0, "delta": {"role": "assistant", "content": "Hello "}, "finish_reason": None},
        {"index": 0, "delta": {"role": "assistant", "content": "from "}, "finish_reason": None},
        {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": "stop"},
    ]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == {"prompt_tokens": 8, "completion_tokens": 2, "total_tokens": 10}
    plain = stream(ollama, "hi [stub content=1]", model=OLLAMA_MODEL)
    assert all("usage" not in c for c in plain)


def test_ollama_tool_call_in_one_delta(ollama):
    chunks = stream(ollama, 'go [stub tool=Bash args={"command":"ls","a":1}]', model=OLLAMA_MODEL, tools=BASH)
    (call,) = chunks[0]["choices"][0]["delta"]["tool_calls"]
    assert call["id"].startswith("call_") and len(call["id"]) == len("call_") + 8
    assert call["function"] == {"name": "Bash", "arguments": '{"a":1,"command":"ls"}'}
    assert chunks[0]["choices"][0]["finish_reason"] is None
    assert chunks[-1]["choices"][0] == {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": "tool_calls"}


def test_ollama_limits_and_errors(ollama):
    chunks = stream(ollama, "x [stub content=5]", model=OLLAMA_MODEL, max_tokens=2, stop=["never"])
    assert "stop_reason" not in chunks[-1]["choices"][0] and chunks[-1]["choices"][0]["finish_reason"] == "length"
    status, _, raw = chat(ollama, "x", model="missing")
    assert status == 404
    message = 'model "missing" not found, try pulling it first'
    assert json.loads(raw) == {"error": {"message": message, "type": "not_found_error", "param": None, "code": None}}
    status, _, raw = chat(ollama, "x [stub status=503]", model=OLLAMA_MODEL)
    assert status == 503
    assert json.loads(raw)["error"] == {"message": "stub error 503", "type": "api_error", "param": None, "code": None}
    status, _, _ = chat(ollama, "x " * 5000, model=OLLAMA_MODEL, max_tokens=10)
    assert status == 200  # no context check: Ollama truncates instead


def test_openai_sdk_reads_ollama(ollama):
    client = openai.OpenAI(base_url=ollama.base, api_key="ollama", max_retries=0)
    done = client.chat.completions.create(model=OLLAMA_MODEL, messages=said("count to 3"))
    assert done.choices[0].message.content == "1, 2, 3,"
    assert done.system_fingerprint == "fp_ollama" and done.usage.completion_tokens == 3
    calls = {}
    chunks = client.chat.completions.create(model=OLLAMA_MODEL, messages=said("x [stub tool=Bash]"), tools=BASH, stream=True)
    for chunk in chunks:
        for call in chunk.choices[0].delta.tool_calls or [] if chunk.choices else []:
            calls[call.index] = call
    assert json.loads(calls[0].function.arguments) == {"command": "echo hello-from-tool"}


# -- options --


def test_api_key_models_and_both_reasoning_fields(strict):
    status, _, raw = chat(strict, "x", model="alpha")
    assert status == 401 and json.loads(raw) == {"error": "Unauthorized"}
    assert strict.requests()[-1]["body"]["model"] == "alpha"  # recorded even when refused
    auth = {"Authorization": "Bearer sekret"}
    status, raw = get(strict, "/v1/models", auth)
    assert [m["id"] for m in json.loads(raw)["data"]] == ["alpha", "beta"]
    assert get(strict, "/v1/models")[0] == 401
    body = {"messages": said("x [stub reasoning=1 content=1]"), "stream": True}
    status, _, raw = post(strict, "/v1/chat/completions", body, auth)
    chunks = [json.loads(d) for d in frames(raw)[:-1]]
    assert chunks[0]["model"] == "alpha"  # no model given: the first served one
    assert chunks[1]["choices"][0]["delta"] == {"reasoning": "Let ", "reasoning_content": "Let "}
    status, _, raw = post(strict, "/v1/chat/completions", {"model": "beta", "messages": said("word " * 70)}, auth)
    assert status == 400 and "maximum context length is 64 tokens" in json.loads(raw)["error"]["message"]
