"""OpenTelemetry traces (tracing/, the [otel] extra): a real gateway exports over OTLP/HTTP to a
receiver in this test, whose bodies are decoded with the OTLP protobuf definitions
(opentelemetry-proto): the GenAI attributes, the parent/child structure, the client's
`traceparent` continued and the upstream span's id sent to the backend, no prompt text unless
configured, sampling."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gwproc import Gateway, config_for
from rawhttp import post_raw
from stubproc import start_stub, wait_for

trace_pb = pytest.importorskip("opentelemetry.proto.collector.trace.v1.trace_service_pb2")

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"


class Receiver:
    """An OTLP/HTTP traces endpoint: every exported span, decoded."""

    def __init__(self) -> None:
        spans = self.spans = []
        paths = self.paths = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers["content-length"]))
                paths.append((self.path, self.headers.get("content-type")))
                req = trace_pb.ExportTraceServiceRequest()
                req.ParseFromString(body)
                for rs in req.resource_spans:
                    res = {a.key: a.value.string_value for a in rs.resource.attributes}
                    for ss in rs.scope_spans:
                        for s in ss.spans:
                            spans.append((res, s))
                out = trace_pb.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *a) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def trace(self, trace_id: str) -> dict[str, object]:
        return {s.name: s for _, s in self.spans if s.trace_id.hex() == trace_id}


def _attrs(span) -> dict:
    out = {}
    for a in span.attributes:
        v = a.value
        out[a.key] = v.string_value if v.HasField("string_value") else (
            v.int_value if v.HasField("int_value") else (v.bool_value if v.HasField("bool_value") else v.double_value))
    return out


@pytest.fixture(scope="module")
def stub():
    with start_stub("vllm", "--model", "up-m", "--token-delay-ms", "5") as s:
        yield s


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


def _gateway(stub, receiver, **tracing) -> Gateway:
    cfg = config_for({"gpu": {"url": stub.base, "kind": "vllm", "slots": 2}},
                     {"m": {"backend": "gpu", "upstream_model": "up-m"}},
                     tracing={"otlp_endpoint": receiver.url, **tracing})
    # the SDK's own variables apply: a short batch delay, so the test waits less
    return Gateway(cfg, env={"OTEL_BSP_SCHEDULE_DELAY": "50", "OTEL_SERVICE_NAME": "hlf-under-test"})


def _chat(g: Gateway, prompt: str, stream: bool, headers: dict | None = None):
    return post_raw(g.url + "/llm/v1/chat/completions",
                    {"model": "m", "stream": stream, "messages": [{"role": "user", "content": prompt}]}, headers)


def test_a_request_is_one_span_with_queue_upstream_and_first_token_children(stub, receiver):
    with _gateway(stub, receiver, sample=1.0) as g:
        prompt_before = stub.stats()["prompt_tokens"]
        status, _, _ = _chat(g, "[stub content=7] secret prompt text", True,
                             {"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"})
        assert status == 200
        prompt_tokens = stub.stats()["prompt_tokens"] - prompt_before
        spans = wait_for(lambda: (t := receiver.trace(CLIENT_TRACE)) and len(t) >= 4 and t, 15)
    assert all(path == "/v1/traces" and ctype == "application/x-protobuf" for path, ctype in receiver.paths)
    root, queue, upstream, first = spans["chat m"], spans["queue"], spans["upstream"], spans["first token"]
    assert root.parent_span_id.hex() == CLIENT_SPAN  # the client's trace, continued
    assert root.kind == root.SPAN_KIND_SERVER and upstream.kind == upstream.SPAN_KIND_CLIENT
    assert queue.parent_span_id == root.span_id and upstream.parent_span_id == root.span_id
    assert first.parent_span_id == upstream.span_id
    for child in (queue, upstream, first):
        assert root.start_time_unix_nano <= child.start_time_unix_nano <= child.end_time_unix_nano <= root.end_time_unix_nano
    a = _attrs(root)
    assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.request.model"] == "m"
    assert a["gen_ai.response.model"] == "up-m"
    assert a["gen_ai.usage.output_tokens"] == 7 and a["gen_ai.usage.input_tokens"] == prompt_tokens
    assert a["homelab.outcome"] == "ok" and a["homelab.backend"] == "gpu" and a["http.response.status_code"] == 200
    res = next(r for r, s in receiver.spans if s.trace_id.hex() == CLIENT_TRACE)
    assert res["service.name"] == "hlf-under-test"  # OTEL_SERVICE_NAME
    # no prompt text anywhere in a span unless capture_content is on
    assert not any("secret prompt" in str(_attrs(s)) for s in spans.values())
    # the backend was asked under the upstream span: its traceparent names that span
    sent = [r["headers"].get("traceparent") for r in stub.requests()]
    assert f"00-{CLIENT_TRACE}-{upstream.span_id.hex()}-01" in sent


def test_sampling_and_captured_content(stub, receiver):
    with _gateway(stub, receiver, sample=0.0, capture_content=True) as g:
        stub.reset()
        assert _chat(g, "[stub content=3] not sampled", False)[0] == 200  # sample 0, no traceparent
        assert _chat(g, "[stub content=3] the client's sampled trace", False,
                     {"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"})[0] == 200
        spans = wait_for(lambda: (t := receiver.trace(CLIENT_TRACE)) and len(t) >= 3 and t, 15)
        headers = [r["headers"] for r in stub.requests()]
    assert "traceparent" not in headers[0]  # not traced at all: nothing sent upstream either
    assert headers[1]["traceparent"].startswith(f"00-{CLIENT_TRACE}-")
    assert {s.trace_id.hex() for _, s in receiver.spans} == {CLIENT_TRACE}
    assert "first token" not in spans  # a whole answer has no first token to time
    a = _attrs(spans["chat m"])
    assert json.loads(a["gen_ai.input.messages"]) == [{"role": "user", "content": "[stub content=3] the client's sampled trace"}]


def test_a_failed_request_is_an_error_span(stub, receiver):
    with _gateway(stub, receiver) as g:
        tp = f"00-{'ab' * 16}-{CLIENT_SPAN}-01"
        status, _, _ = _chat(g, "[stub status=500] fail", False, {"traceparent": tp})
        assert status >= 500
        spans = wait_for(lambda: (t := receiver.trace("ab" * 16)) and "chat m" in t and t, 15)
    root = spans["chat m"]
    assert root.status.code == root.status.STATUS_CODE_ERROR
    assert _attrs(root)["error.type"].startswith("error_")


# one streamed request per streaming surface: (path, body), each with 5 tokens of content
STREAMS = {
    "openai": ("/llm/v1/chat/completions", {"model": "m", "stream": True, "max_tokens": 20,
                                            "messages": [{"role": "user", "content": "[stub content=5] hi"}]}),
    "anthropic": ("/llm/v1/messages", {"model": "m", "stream": True, "max_tokens": 20,
                                       "messages": [{"role": "user", "content": "[stub content=5] hi"}]}),
    "responses": ("/llm/v1/responses", {"model": "m", "stream": True, "max_output_tokens": 20, "store": False,
                                        "input": "[stub content=5] hi"}),
    "gemini": ("/llm/v1beta/models/m:streamGenerateContent?alt=sse",
               {"contents": [{"role": "user", "parts": [{"text": "[stub content=5] hi"}]}]}),
    "ollama": ("/api/chat", {"model": "m", "stream": True, "messages": [{"role": "user", "content": "[stub content=5] hi"}]}),
}


@pytest.mark.parametrize("dialect", sorted(STREAMS))
def test_every_streaming_surface_times_its_first_token(stub, receiver, dialect):
    """The first-token child (the upstream call's start -> the first token written) on every
    surface that streams, not only the OpenAI one, inside the upstream span it belongs to."""
    path, body = STREAMS[dialect]
    trace_id = f"{abs(hash(dialect)) % (1 << 64):016x}" * 2
    with _gateway(stub, receiver, sample=1.0) as g:
        status, _, raw = post_raw(g.url + path, body, {"traceparent": f"00-{trace_id}-{CLIENT_SPAN}-01"})
        assert status == 200, raw
        spans = wait_for(lambda: (t := receiver.trace(trace_id)) and "upstream" in t and t, 15)
        wait_for(lambda: "first token" in (spans := receiver.trace(trace_id)), 5)
        spans = receiver.trace(trace_id)
    root = next(s for s in spans.values() if s.parent_span_id.hex() == CLIENT_SPAN)
    upstream, first = spans["upstream"], spans["first token"]
    assert _attrs(root)["homelab.dialect"] == dialect and _attrs(root)["homelab.stream"] is True
    assert first.parent_span_id == upstream.span_id and upstream.parent_span_id == root.span_id
    assert upstream.start_time_unix_nano <= first.start_time_unix_nano <= first.end_time_unix_nano \
        <= upstream.end_time_unix_nano
