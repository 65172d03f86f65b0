"""The span plan of a finished request (tracing/spans.py): pure."""

from __future__ import annotations

from types import SimpleNamespace

from hypothesis import given, strategies as st

from homelab_frontend.tracing import spans, traceparent


def _record(**kw):
    trace = traceparent.RequestTrace(1, 5, True)
    base = dict(trace=trace, started=100.0, started_wall=1000.0, model="m", upstream_model="up", id="req_1",
                dialect="openai", outcome="ok", stream=True, status=200, key_name="k", backend="b",
                tokens_in=20, tokens_out=7, tokens_cached=None, slot_seconds=2.0, queue_wait=0.5, ttft=1.2,
                client="192.0.2.7", endpoint="/llm/v1/chat/completions", load_wait=0.0)
    return SimpleNamespace(**{**base, **kw})


def test_a_streamed_request_plans_root_queue_upstream_first_token():
    t = _record()
    got = {p.name: p for p in spans.plan(t, now_mono=103.0)}
    root, queue, up, first = got["chat m"], got["queue"], got["upstream"], got["first token"]
    assert (root.start, root.end, root.parent_id) == (1000.0, 1003.0, 5)
    assert (queue.start, queue.end) == (1000.5, 1001.0)  # admitted 2 s before the end, after 0.5 s
    assert (up.span_id, up.parent_id, up.start, up.end) == (t.trace.upstream_id, t.trace.span_id, 1001.0, 1003.0)
    assert (first.parent_id, first.start, first.end) == (up.span_id, 1001.0, 1001.2)
    assert root.attributes["gen_ai.usage.input_tokens"] == 20 and "homelab.usage.estimated" not in root.attributes
    assert (root.attributes["client.address"], root.attributes["http.route"]) == ("192.0.2.7", "/llm/v1/chat/completions")
    assert len({p.span_id for p in got.values()}) == 4


def test_a_load_wait_sits_between_the_queue_and_the_upstream_call():
    got = {p.name: p for p in spans.plan(_record(load_wait=0.75), now_mono=103.0)}
    assert (got["load wait"].start, got["load wait"].end) == (1001.0, 1001.75)
    assert got["upstream"].start == 1001.75


def test_a_request_refused_before_admission_is_the_one_span():
    got = spans.plan(_record(slot_seconds=0.0, queue_wait=None, outcome="rejected_rate_limit", tokens_in=None,
                             tokens_out=0, ttft=None), now_mono=100.01)
    assert [p.name for p in got] == ["chat m"] and got[0].attributes["error.type"] == "rejected_rate_limit"


@given(st.floats(0, 50), st.floats(0, 50), st.floats(0, 50), st.floats(0, 100))
def test_children_never_leave_their_parent(queue, slot, ttft, total):
    t = _record(queue_wait=queue, slot_seconds=slot, ttft=ttft)
    planned = spans.plan(t, now_mono=100.0 + total)
    by_id = {p.span_id: p for p in planned}
    for p in planned:
        assert p.start <= p.end
        parent = by_id.get(p.parent_id)
        if parent is not None:
            assert parent.start <= p.start and p.end <= parent.end + 1e-9


def test_the_relayed_calls_name_their_operation():
    for path, operation in (("/v1/rerank", "rerank"), ("/llm/v1/audio/transcriptions", "transcription"),
                            ("/v1/audio/speech", "speech"), ("/v1/images/generations", "image_generation"),
                            ("/llm/v1/chat/completions", "chat")):
        [root, *_] = spans.plan(_record(dialect="speech"), now_mono=103.0, path=path)
        assert root.attributes["gen_ai.operation.name"] == operation and root.name == f"{operation} m"
