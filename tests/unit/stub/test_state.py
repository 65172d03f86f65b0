"""The stub's state (stub/state.py): its counters, the recent requests it records, its event log
and a reset that starts it cold: pure (the log a file in tmp_path)."""

from __future__ import annotations

from multidict import CIMultiDict

from homelab_frontend.stub.state import RECENT_REQUESTS, EventLog, Stats, StubConfig, StubState


def test_in_flight_survives_a_reset_and_the_peak_restarts_from_it():
    s = Stats()
    s.begin(), s.begin(), s.end()
    s.total, s.completed, s.upload_bytes = 3, 2, 10
    assert (s.in_flight, s.max_in_flight) == (1, 2)
    s.reset()
    assert s.as_dict() == {"in_flight": 1, "max_in_flight": 1, "total": 0, "cancelled": 0, "completed": 0,
                           "failed": 0, "prompt_tokens": 0, "cached_tokens": 0, "upload_bytes": 0}


def test_requests_are_numbered_and_kept_with_their_headers_folded(tmp_path):
    state = StubState(StubConfig(), EventLog(None))
    assert state.record({"a": 1}, CIMultiDict([("X-Trace", "1"), ("x-trace", "2"), ("Content-Type", "json")])) == 1
    assert state.requests[-1] == {"body": {"a": 1}, "headers": {"x-trace": "1, 2", "content-type": "json"}}
    for i in range(RECENT_REQUESTS + 5):
        state.record(i, CIMultiDict())
    assert state.sequence == state.stats.total == RECENT_REQUESTS + 6
    assert len(state.requests) == RECENT_REQUESTS and state.requests[0]["body"] == 5
    state.reset()
    assert len(state.requests) == 0 and state.stats.total == 0 and state.sequence == RECENT_REQUESTS + 6


def test_the_event_log_writes_lines_and_without_a_path_nothing(tmp_path):
    path = tmp_path / "stub.log"
    log = EventLog(str(path))
    log.write("request 1")
    assert path.read_text() == "request 1\n"  # flushed at once: the tests read it while it runs
    log.write("completed 1")
    log.close()
    log.close()  # twice is fine
    log.write("after close")  # ignored
    assert path.read_text().splitlines() == ["request 1", "completed 1"]
    EventLog(None).write("nowhere")


def test_both_reasoning_fields_when_asked():
    assert StubConfig(reasoning_field="both").reasoning_fields == ("reasoning", "reasoning_content")
    assert StubConfig(reasoning_field="reasoning_content").reasoning_fields == ("reasoning_content",)
