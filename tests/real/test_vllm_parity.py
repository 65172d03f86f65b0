"""The stub kept honest: the same requests to the stub's vLLM flavour and to the real vLLM (0.32, the
suite's, tests/vllmproc.py), their answers compared by shape, never by value (tests/support/
wire_shape.py): field names and JSON types, the order of a stream's chunk kinds (the opening role
chunk, reasoning, content, a tool call's start and its argument fragments, the finish, the usage
chunk; a chunk the real vLLM coalesced on a busy machine split back first: wire_shape.uncoalesced),
where usage comes (on each chunk with continuous usage, on a final `choices: []` chunk),
what `stop_reason` is (the string for a stop string, the token id for an end of turn), the error
bodies the gateway reads (an unknown model, a prompt over the context, a bad `max_tokens`), and the
side endpoints it relies on (`/v1/models` with `max_model_len`, `/tokenize`, the `/metrics` names).

Every other test of the gateway runs against the stub; this one is what keeps that worth something.
Where the two differ, the stub is wrong: it follows vLLM.

Each prompt carries both servers' directives: `[[hlf:NAME]]` makes the real model's answer
(support/vllm_script.py), `[stub ...]` the stub's; each ignores the other's. The stub runs as the
real server is configured: a reasoning parser, Gemma's end of turn (id 106) as a stop token of the
generation config, a prefix cache in blocks of 128 tokens with `--enable-prompt-tokens-details`,
the same context length.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import time
from urllib.parse import urlsplit

import pytest

from homelab_frontend.ops.health import _RUNNING
from homelab_frontend.request.context_clamp import context_refusal
from stubproc import start_stub
from support.vllm_script import END_OF_TURN, WEATHER_TOOL, directive
from vllmproc import SERVED
from support.wire_shape import diff, grammar, paths, stream_diff, uncoalesced

pytestmark = [pytest.mark.xdist_group("vllm"), pytest.mark.timeout(900)]  # the first test waits for vLLM

CONTINUOUS = {"include_usage": True, "continuous_usage_stats": True}  # what the gateway asks for


@pytest.fixture(scope="module")
def stub(vllm):
    args = ["--reasoning", "--model", SERVED, "--max-model-len", str(vllm.max_model_len), "--end-of-turn-id",
            str(END_OF_TURN), "--prefix-cache-tokens", "65536", "--prefix-block", "128"]
    with start_stub("vllm", *args) as s:
        yield s


def call(url: str, method: str, path: str, body: object = None) -> tuple[int, dict, bytes]:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=300)
    try:
        payload = None if body is None else body if isinstance(body, bytes) else json.dumps(body)
        conn.request(method, path, payload, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def both(stub, vllm, method: str, path: str, body: object = None) -> tuple[tuple, tuple]:
    """The same request to each; the stub first (it is instant), then the real server."""
    return call(stub.url, method, path, body), call(vllm.url, method, path, body)


def chat_body(prompt: str, **extra) -> dict:
    return {"model": SERVED, "messages": [{"role": "user", "content": prompt}], **extra}


def chunks_of(raw: bytes) -> list[dict]:
    """An SSE stream's JSON chunks; it must end with exactly one `data: [DONE]`."""
    blocks = raw.decode().split("\n\n")
    assert blocks[-1] == "", raw[-200:]
    data = []
    for block in blocks[:-1]:
        assert block.startswith("data: "), block
        data.append(block[len("data: "):])
    assert data[-1] == "[DONE]" and data.count("[DONE]") == 1, data[-3:]
    return [json.loads(d) for d in data[:-1]]


def finish(chunks: list[dict]) -> dict:
    (choice,) = [c["choices"][0] for c in chunks if c["choices"] and c["choices"][0].get("finish_reason")]
    return choice


# name -> (prompt, extra body): one of each kind of answer the gateway meets
STREAMS = {
    "reasoning, continuous usage": (f"{directive('reason')} [stub reasoning=3 content=4]",
                                    {"stream_options": CONTINUOUS}),
    "reasoning, final usage": (f"{directive('reason')} [stub reasoning=3 content=4]",
                               {"stream_options": {"include_usage": True}}),
    "reasoning, no usage": (f"{directive('reason')} [stub reasoning=3 content=4]", {}),
    "reasoning hidden": (f"{directive('reason')} [stub reasoning=3 content=4]",
                         {"include_reasoning": False, "stream_options": CONTINUOUS}),
    "reasoning only": (f"{directive('think-only')} [stub reasoning=3 content=0]", {"stream_options": CONTINUOUS}),
    "stop string": (f"count to 9 {directive('stop')} [stub reasoning=2]",
                    {"stop": ["STOP", " 4,"], "stream_options": CONTINUOUS}),
    "max_tokens reached": (f"{directive('long')} [stub reasoning=1 content=40]",
                           {"max_tokens": 12, "stream_options": CONTINUOUS}),
    "tool call": (f'weather? {directive("weather")} [stub reasoning=2 tool=get_weather args={{"city":"Paris"}}]',
                  {"tools": [WEATHER_TOOL], "stream_options": CONTINUOUS}),
}


@pytest.mark.parametrize("case", list(STREAMS))
def test_a_stream_has_vllms_shape(stub, vllm, case):
    prompt, extra = STREAMS[case]
    (s_status, s_headers, s_raw), (v_status, v_headers, v_raw) = both(
        stub, vllm, "POST", "/v1/chat/completions", chat_body(prompt, stream=True, **extra))
    assert (s_status, v_status) == (200, 200), (s_raw[-300:], v_raw[-300:])
    assert s_headers["content-type"] == v_headers["content-type"]
    s_chunks, v_chunks = chunks_of(s_raw), chunks_of(v_raw)
    assert stream_diff(s_chunks, v_chunks) == []
    # the values the gateway's decoder acts on, beyond their types
    s_end, v_end = finish(s_chunks), finish(v_chunks)
    assert s_end["finish_reason"] == v_end["finish_reason"]
    if case == "stop string":
        assert (s_end["stop_reason"], v_end["stop_reason"]) == (" 4,", "STOP")
    elif case == "max_tokens reached":
        assert s_end["stop_reason"] is None is v_end["stop_reason"]
    else:  # the end of turn: its token id
        assert s_end["stop_reason"] == END_OF_TURN == v_end["stop_reason"]
    usage = grammar(v_chunks)[-1] == "usage-only"
    assert usage == ("stream_options" in extra)


def paused_stream(vllm, body: dict, pause_s: float) -> list[dict]:
    """A stream of the real vLLM whose API server is stopped (SIGSTOP) for `pause_s` once its
    first chunk is out, while its engine (a process of its own) goes on generating: what a
    machine too busy to schedule the API server does to it (the full suite at load 16)."""
    parts = urlsplit(vllm.url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=300)
    try:
        conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        first = resp.read1()
        assert b'"role"' in first, first  # the opening chunk: the request is in the engine
        os.kill(vllm.proc.pid, signal.SIGSTOP)
        try:
            time.sleep(pause_s)
        finally:
            os.kill(vllm.proc.pid, signal.SIGCONT)
        return chunks_of(first + resp.read())
    finally:
        conn.close()


def test_a_stream_vllm_coalesced_has_the_stubs_shape_once_split(stub, vllm):
    """vLLM's API server merges the deltas its engine made while the server was not scheduled
    (RequestOutputCollector), and puts them on the finishing chunk: the full suite saw
    ['open', 'reasoning', 'finish', 'usage-only'] for the `reason` script. The comparison splits
    such a chunk back (wire_shape.uncoalesced); here the real server is made to coalesce."""
    prompt, extra = STREAMS["reasoning, continuous usage"]
    body = chat_body(prompt, stream=True, **extra)
    s_chunks = chunks_of(call(stub.url, "POST", "/v1/chat/completions", body)[2])
    coalesced = 0
    for _ in range(5):  # until vLLM's engine made two steps or more during a pause
        v_chunks = paused_stream(vllm, body, 2.0)
        assert stream_diff(s_chunks, v_chunks) == []
        assert finish(v_chunks)["stop_reason"] == END_OF_TURN
        if len(uncoalesced(v_chunks)) > len(v_chunks):
            coalesced += 1
            break
    assert coalesced, "vLLM never coalesced a paused stream"


WHOLE = {name: STREAMS[name] for name in ("reasoning, no usage", "reasoning only", "stop string", "tool call")}


@pytest.mark.parametrize("case", list(WHOLE))
def test_a_whole_answer_has_vllms_shape(stub, vllm, case):
    prompt, extra = WHOLE[case]
    extra = {k: v for k, v in extra.items() if k != "stream_options"}  # refused without stream
    (s_status, _, s_raw), (v_status, _, v_raw) = both(stub, vllm, "POST", "/v1/chat/completions",
                                                      chat_body(prompt, **extra))
    assert (s_status, v_status) == (200, 200), (s_raw[-300:], v_raw[-300:])
    s_body, v_body = json.loads(s_raw), json.loads(v_raw)
    assert diff(paths(s_body), paths(v_body)) == []
    assert s_body["choices"][0]["finish_reason"] == v_body["choices"][0]["finish_reason"]


def _error(raw: bytes) -> dict:
    body = json.loads(raw)
    assert set(body) == {"error"}, body
    return body["error"]


# name -> (request body, what the gateway needs of the refusal beyond its shape)
LONG = "word " * 1100  # more tokens than the context (1024) on both servers
REFUSALS = {
    "unknown model": {"model": "nope", "messages": [{"role": "user", "content": "hi"}]},
    "prompt over the context": chat_body(LONG, max_tokens=5),
    "max_tokens 0": chat_body("hi", max_tokens=0),
    "max_tokens negative": chat_body("hi", max_tokens=-3),
    "max_tokens over the context": chat_body("hi", max_tokens=5000),
    "max_tokens not a number": chat_body("hi", max_tokens="many"),
    "stream_options without stream": chat_body("hi", max_tokens=2, stream_options={"include_usage": True}),
    "no messages": {"model": SERVED, "messages": []},
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_a_refusal_has_vllms_shape(stub, vllm, case):
    (s_status, s_headers, s_raw), (v_status, v_headers, v_raw) = both(
        stub, vllm, "POST", "/v1/chat/completions", REFUSALS[case])
    assert s_status == v_status and s_status in (400, 404), (s_raw, v_raw[:500])
    assert s_headers["content-type"] == v_headers["content-type"] == "application/json"
    s_err, v_err = _error(s_raw), _error(v_raw)
    assert diff(paths(s_err), paths(v_err)) == []
    assert {k: s_err[k] for k in ("type", "param", "code")} == {k: v_err[k] for k in ("type", "param", "code")}
    if case == "prompt over the context":
        # the gateway reads the context length and the prompt's size out of the message
        s_ctx, v_ctx = context_refusal(s_err["message"]), context_refusal(v_err["message"])
        assert s_ctx is not None and v_ctx is not None, (s_err["message"], v_err["message"])
        assert s_ctx[0] == v_ctx[0] == vllm.max_model_len and s_ctx[1] > s_ctx[0] and v_ctx[1] > v_ctx[0]


def test_max_tokens_past_the_context_is_fitted_not_refused(stub, vllm):
    """vLLM 0.32 fits `max_tokens` to what the prompt leaves of the context (older ones refused)."""
    body = chat_body(f"{directive('long')} [stub reasoning=0 content=2000] " + "word " * 900, max_tokens=1000)
    (s_status, _, s_raw), (v_status, _, v_raw) = both(stub, vllm, "POST", "/v1/chat/completions", body)
    assert (s_status, v_status) == (200, 200), (s_raw[:300], v_raw[:300])
    for raw in (s_raw, v_raw):
        doc = json.loads(raw)
        assert doc["choices"][0]["finish_reason"] == "length"
        assert doc["usage"]["prompt_tokens"] + doc["usage"]["completion_tokens"] == vllm.max_model_len


# /v1/completions (the gateway's raw and FIM calls): vLLM 0.32 builds the chat's TokenizeParams there too
COMPLETION_REFUSALS = {
    "max_tokens over the context": {"model": SERVED, "prompt": "hi", "max_tokens": 2**31},
    "max_tokens 0": {"model": SERVED, "prompt": "hi", "max_tokens": 0},
    "prompt over the context": {"model": SERVED, "prompt": LONG, "max_tokens": 5},
}


@pytest.mark.parametrize("case", list(COMPLETION_REFUSALS))
def test_a_completions_refusal_has_vllms_shape(stub, vllm, case):
    (s_status, _, s_raw), (v_status, _, v_raw) = both(stub, vllm, "POST", "/v1/completions", COMPLETION_REFUSALS[case])
    assert s_status == v_status == 400, (s_raw, v_raw[:500])
    s_err, v_err = _error(s_raw), _error(v_raw)
    assert diff(paths(s_err), paths(v_err)) == []
    assert {k: s_err[k] for k in ("type", "param", "code")} == {k: v_err[k] for k in ("type", "param", "code")}
    if case == "max_tokens over the context":
        assert s_err["message"] == v_err["message"]


def test_completions_max_tokens_past_what_the_prompt_leaves_is_fitted(stub, vllm):
    body = {"model": SERVED, "prompt": f"{directive('long')} [stub content=2000] " + "word " * 900, "max_tokens": 1000}
    (s_status, _, s_raw), (v_status, _, v_raw) = both(stub, vllm, "POST", "/v1/completions", body)
    assert (s_status, v_status) == (200, 200), (s_raw[:300], v_raw[:300])
    for raw in (s_raw, v_raw):
        doc = json.loads(raw)
        assert doc["choices"][0]["finish_reason"] == "length"
        assert doc["usage"]["prompt_tokens"] + doc["usage"]["completion_tokens"] == vllm.max_model_len


def test_the_side_endpoints_the_gateway_reads(stub, vllm):
    (s_status, _, s_raw), (v_status, _, v_raw) = both(stub, vllm, "GET", "/v1/models")
    assert s_status == v_status == 200
    s_models, v_models = json.loads(s_raw), json.loads(v_raw)
    assert diff(paths(s_models), paths(v_models)) == []
    assert s_models["data"][0]["max_model_len"] == v_models["data"][0]["max_model_len"] == vllm.max_model_len

    messages = [{"role": "user", "content": "one two three"}]
    (s_status, _, s_raw), (v_status, _, v_raw) = both(stub, vllm, "POST", "/tokenize",
                                                      {"model": SERVED, "messages": messages})
    assert s_status == v_status == 200
    assert diff(paths(json.loads(s_raw)), paths(json.loads(v_raw))) == []


def metric_families(text: str) -> dict[str, tuple[str, frozenset[str]]]:
    """name -> (type, its label names), from Prometheus text."""
    types = {}
    labels: dict[str, set[str]] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            types[name] = kind
        elif line and not line.startswith("#"):
            name, _, rest = line.partition("{")
            names = {pair.split("=", 1)[0] for pair in rest.rsplit("}", 1)[0].split(",") if "=" in pair}
            labels.setdefault(name.split()[0], set()).update(names)
    return {name: (kind, frozenset(labels.get(name, ()))) for name, kind in types.items()}


def test_the_metrics_the_stub_serves_are_vllms(stub, vllm):
    (s_status, _, s_raw), (v_status, _, v_raw) = both(stub, vllm, "GET", "/metrics")
    assert s_status == v_status == 200
    s_fam, v_fam = metric_families(s_raw.decode()), metric_families(v_raw.decode())
    assert _RUNNING["vllm"] in s_fam  # the gauge the gateway reads
    assert {n: s_fam[n] for n in s_fam} == {n: v_fam.get(n) for n in s_fam}
