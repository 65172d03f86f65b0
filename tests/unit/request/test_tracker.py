"""The record of a request in flight and the tracker of them all (request/tracker.py): the
gateway's own cancels and the errors they answer with, the backends tried, what the admin API
shows."""

from __future__ import annotations

import asyncio
import re

from support.records import tracked

from homelab_frontend.request import tracker as tr
from homelab_frontend.request.outcome import OK
from homelab_frontend.request.tracker import Tracked, Tracker


def test_a_stalled_client_is_its_own_cancel_not_a_timeout():
    async def main():
        t = tracked()
        task = asyncio.current_task()
        t.task = task
        assert t.cancel("client_stalled", "stopped reading")
        try:
            await asyncio.sleep(1)
        except asyncio.CancelledError:
            err = t.own_cancel_error()
        assert err is not None and err.kind == "timeout"
        assert t.outcome == "cancelled_client_stalled"
        assert not task.cancelling()  # taken back: the error is answered, not propagated

    asyncio.run(main())


def test_own_cancel_reasons_map_to_errors():
    async def main():
        out = {}
        for reason in ("timeout", "shutdown", "slot_lost", "admin"):
            t = tracked()
            t.task = asyncio.current_task()
            t.cancel(reason, "why")
            try:
                await asyncio.sleep(1)
            except asyncio.CancelledError:
                err = t.own_cancel_error()
            out[reason] = (err.kind, err.status)
        return out

    got = asyncio.run(main())
    assert got["timeout"][0] == "timeout"
    assert got["shutdown"] == ("overloaded", 503)
    assert got["slot_lost"] == ("overloaded", 503)
    assert got["admin"] == ("api_error", 503)


def test_a_client_leaving_is_no_own_cancel():
    t = tracked()
    assert t.own_cancel_error() is None  # nothing of ours cancelled it
    assert not t.cancel("timeout")  # its task is over: nothing left to cancel


def test_tracker_lists_finds_and_cancels():
    async def main():
        trk = Tracker()
        t = tracked()
        t.task = asyncio.current_task()
        trk.add(t)
        assert len(trk) == 1 and trk.get(t.id) is t and list(trk) == [t]
        assert not trk.cancel("req_nope", "admin")
        assert trk.cancel(t.id, "admin")
        assert not trk.cancel(t.id, "admin")  # once
        try:
            await asyncio.sleep(1)
        except asyncio.CancelledError:
            t.own_cancel_error()
        trk.remove(t)
        trk.remove(t)  # idempotent
        assert len(trk) == 0 and trk.get(t.id) is None

    asyncio.run(main())


def test_as_dict_has_no_message_text_and_the_fields_the_admin_api_shows():
    t = tracked()
    d = t.as_dict()
    assert set(d) == {"id", "dialect", "model", "backend", "key", "phase", "stream", "age_s", "started",
                      "tokens_out", "backends_tried", "served_model", "client", "endpoint"}
    assert d["phase"] == tr.QUEUED


def test_request_ids_are_random_and_prefixed():
    ids = {tr.new_request_id() for _ in range(50)}
    assert len(ids) == 50 and all(re.fullmatch(r"req_[0-9a-f]{24}", i) for i in ids)


def test_a_record_notes_the_task_it_was_made_in():
    async def main():
        t = Tracked("r", "openai", "m", "alice", True)
        assert t.task is asyncio.current_task() and t.phase == tr.QUEUED and t.outcome == OK
        assert (t.key_name, t.stream, t.tokens_out, t.ending) == ("alice", True, 0, None)

    asyncio.run(main())


def test_the_backends_tried_are_the_failed_ones_then_the_current():
    t = tracked()
    assert t.tried() == [] and t.as_dict()["backends_tried"] == []
    t.backend = "b0"
    assert t.tried() == ["b0"]
    t.failovers = [("b0", "unreachable"), ("b1", "status")]
    t.backend = "b2"
    assert t.tried() == ["b0", "b1", "b2"] and t.as_dict()["backends_tried"] == ["b0", "b1", "b2"]


def test_a_superseded_request_answers_invalid_request_and_ends_superseded():
    async def main():
        t = tracked()
        t.task = asyncio.current_task()
        t.connecting(), t.answering(stream=True)
        assert t.cancel("superseded", "a newer completion replaced it")
        assert not t.cancel("timeout")  # the first reason stands
        try:
            await asyncio.sleep(1)
        except asyncio.CancelledError:
            err = t.own_cancel_error()
        assert (err.kind, err.message) == ("invalid_request", "a newer completion replaced it")
        assert t.outcome == "cancelled_superseded" and t.cancel_reason == "superseded"

    asyncio.run(main())
