"""Latest wins (admission/supersede.py): per (client, model), a new completion cancels the one
before it, once; other clients and other models are untouched; an ended request is forgotten."""

from __future__ import annotations

import asyncio

from hypothesis import given, strategies as st

from homelab_frontend.admission.supersede import MESSAGE, Supersede


class Handle:
    def __init__(self) -> None:
        self.cancels: list[tuple[str, str]] = []
        self.done = False
        self.task = None  # no task of its own to wait on (supersede.Cancellable)

    def cancel(self, reason: str, message: str = "") -> bool:
        if self.done or self.cancels:
            return False
        self.cancels.append((reason, message))
        return True


def test_a_new_completion_cancels_the_previous_one_of_its_client_and_model():
    s = Supersede()
    a, b, c, d = Handle(), Handle(), Handle(), Handle()
    assert s.replace("alice", "coder", a) is None
    assert s.replace("bob", "coder", b) is None  # another client
    assert s.replace("alice", "other", c) is None  # another model
    assert s.replace("alice", "coder", d) is a
    assert a.cancels == [("superseded", MESSAGE)] and not b.cancels and not c.cancels and not d.cancels
    assert s.superseded == 1


def test_an_ended_request_is_forgotten_and_not_cancelled_later():
    s = Supersede()
    a, b = Handle(), Handle()
    s.replace("k", "m", a)
    s.done("k", "m", a)
    assert len(s) == 0
    assert s.replace("k", "m", b) is None and not a.cancels
    s.done("k", "m", a)  # a late `done` of a replaced request leaves the newest in place
    assert len(s) == 1


@given(st.lists(st.tuples(st.sampled_from("ab"), st.sampled_from("xy"), st.booleans()), max_size=40))
def test_every_request_but_the_newest_per_key_is_cancelled_exactly_once(ops):
    s = Supersede()
    newest: dict = {}
    handles = []
    for client, model, ends in ops:
        h = Handle()
        handles.append((client, model, h))
        s.replace(client, model, h)
        if ends:
            h.done = True
            s.done(client, model, h)
        newest[(client, model)] = h
    for client, model, h in handles:
        assert len(h.cancels) <= 1
        if h is newest[(client, model)] or h.done:
            assert not h.cancels
    assert len(s) == sum(1 for h in newest.values() if not h.done)


def test_latest_lets_the_cancelled_request_act_before_the_new_one_goes_on():
    async def main():
        s = Supersede()
        order = []

        class Task:
            def __init__(self, name):
                self.name = name
                self.task = None  # nothing to wait on: latest() yields to the loop once

            def cancel(self, reason, message=""):
                asyncio.get_running_loop().call_soon(order.append, f"{self.name} cancelled")
                return True

        async with s.latest("k", "m", Task("old")):
            pass
        s.replace("k", "m", Task("old"))
        async with s.latest("k", "m", Task("new")):
            order.append("new admitted")
        assert order == ["old cancelled", "new admitted"]
        assert len(s) == 0

    asyncio.run(main())


def test_latest_waits_for_the_cancelled_request_to_end_before_the_new_one_goes_on():
    async def main():
        s = Supersede()
        order = []

        class Request:
            def __init__(self, name):
                self.name = name
                self.task = None

            def cancel(self, reason, message=""):
                self.task.cancel()
                return True

        async def run(req, hold_s):
            async with s.latest("k", "m", req):
                order.append(f"{req.name} admitted")
                try:
                    await asyncio.sleep(hold_s)
                except asyncio.CancelledError:
                    await asyncio.sleep(0.05)  # giving back its upstream and slot takes a moment
                    order.append(f"{req.name} ended")
                    raise

        old, new = Request("old"), Request("new")
        old.task = asyncio.create_task(run(old, 10))
        await asyncio.sleep(0.01)
        new.task = asyncio.create_task(run(new, 0))
        await new.task
        assert order == ["old admitted", "old ended", "new admitted"]

    asyncio.run(main())
