"""Session affinity: the session key, rendezvous ranking, and Route.place's bounded-wait rule."""

from __future__ import annotations

import asyncio

from hypothesis import given
from hypothesis import strategies as st

from homelab_frontend.policy import affinity
from homelab_frontend import canonical as c
from homelab_frontend import config as cfgmod
from homelab_frontend.policy.routing import BackendState, Route
from homelab_frontend.admission.slots import SlotPool


def _req(*messages: c.Message, cache_key: str | None = None) -> c.Request:
    return c.Request(model="m", messages=list(messages), cache_key=cache_key)


def _msg(role: str, text: str) -> c.Message:
    return c.Message(role=role, parts=[c.TextPart(text)])


def test_every_turn_of_a_conversation_has_the_key_of_its_first():
    sys_, first = _msg("system", "be brief"), _msg("user", "read main.py")
    turn1 = _req(sys_, first)
    turn3 = _req(sys_, first, _msg("assistant", "ok"), _msg("user", "now fix it"),
                 _msg("assistant", "done"), _msg("system", "reminder"), _msg("user", "thanks"))
    assert affinity.session_key({}, turn1) == affinity.session_key({}, turn3) is not None
    assert affinity.session_key({}, _req(sys_, _msg("user", "read other.py"))) != affinity.session_key({}, turn1)
    assert affinity.session_key({}, _req(_msg("assistant", "prefill"))) is None  # nothing to anchor


def test_a_client_session_header_or_prompt_cache_key_wins_over_the_prompt():
    req = _req(_msg("user", "hi"), cache_key="conv-7")
    assert affinity.session_key({"x-claude-code-session-id": "abc"}, req) == "h:abc"
    assert affinity.session_key({"session-id": "def"}, req) == "h:def"
    assert affinity.session_key({}, req) == "k:conv-7"
    assert len(affinity.session_key({"session-id": "x" * 10_000}, req)) <= 260  # bounded


@given(st.text(min_size=1), st.sets(st.sampled_from("abcdefgh"), min_size=2))
def test_rendezvous_moves_only_the_sessions_of_a_backend_that_leaves(key, names):
    names = sorted(names)
    first = affinity.rank(key, names)[0]
    for gone in names:
        rest = [n for n in names if n != gone]
        expected = first if first != gone else affinity.rank(key, names)[1]
        assert affinity.rank(key, rest)[0] == expected


def _route(*states: BackendState, on: bool = True, wait: float = 2.0) -> Route:
    return Route("m", "m", "m", tuple(states), None, affinity=on, affinity_max_wait_s=wait)


def _backend(name: str, slots: int = 2, depth: int = 4) -> BackendState:
    return BackendState(name, cfgmod.Backend(url="http://127.0.0.1:1/v1"), SlotPool(name, slots, depth, 60))


def _session_preferring(first: str, names: list[str]) -> str:
    return next(k for k in (f"s{i}" for i in range(1000)) if affinity.rank(k, names)[0] == first)


def test_place_prefers_the_sessions_backend_while_it_has_room_then_spills():
    async def scenario():
        a, b = _backend("a"), _backend("b")
        route = _route(a, b)
        key = _session_preferring("b", ["a", "b"])
        assert route.place(key) == (b, "hit")
        first = await b.pool.acquire()
        assert route.place(key) == (b, "hit")  # one slot still free there
        second = await b.pool.acquire()
        # b full, a idle: the expected wait on b (recent hold 5 s x 1 / 2 slots) is over 2 s more
        assert route.place(key) == (a, "spill")
        b.pool.queue.hold_s = 1.0  # short answers lately: a 0.5 s wait is within the bound
        assert route.place(key) == (b, "hit")
        assert _route(a, b, wait=0.1).place(key) == (a, "spill")
        assert _route(a, b, on=False).place(key) == (a, None)  # affinity off: most free slots
        assert route.place(None) == (a, None)  # no session key
        b.up = False
        assert route.place(key) == (a, None)  # one backend up: nothing to choose
        b.pool.release(first)
        b.pool.release(second)

    asyncio.run(scenario())


def test_a_full_queue_is_never_worth_the_cache():
    async def scenario():
        a, b = _backend("a", slots=1, depth=0), _backend("b", slots=1, depth=0)
        route = _route(a, b, wait=1e9)
        key = _session_preferring("b", ["a", "b"])
        lease = await b.pool.acquire()
        assert route.place(key) == (a, "spill")
        b.pool.release(lease)

    asyncio.run(scenario())
