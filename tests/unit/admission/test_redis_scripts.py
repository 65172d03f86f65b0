"""The Lua scripts behind the shared slot leases (admission/redis_scripts.py), run by a real
redis-server: what each grants, refuses, extends, re-adds and gives back, by Redis's own clock.

A lease is its member's score, the expiry in Redis milliseconds, so an expired lease is written as
one with a score in the past (no waiting); one test lets a short lease run out by Redis's clock.
The epoch key "<grace end> <epoch start>" is written the same way to start after the grace. A
state machine holds the scripts to a model of the set: never more than `limit` live members, a
held member re-taken or renewed is one slot, a release frees only what is held."""

from __future__ import annotations

import itertools
import time

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

from homelab_frontend.admission.redis_scripts import ACQUIRE, RELEASE, RENEW, VIEW
from redisproc import RedisServer, available

pytestmark = pytest.mark.skipif(not available(), reason="redis-server not installed (.ci/deps)")

LEASE_MS = 60_000  # long enough that no lease of a test runs out by itself unless it means to
DISCOVERY_MS = 1_000
_names = itertools.count()


@pytest.fixture(scope="module")
def server():
    with RedisServer() as r:
        yield r


class Backend:
    """One backend's keys in the shared Redis (fresh names per use) and the four scripts on them."""

    def __init__(self, r, *, limit: int = 2, lease_ms: int = LEASE_MS) -> None:
        n = next(_names)
        self.r = r
        self.key, self.epoch, self.channel = f"t{n}:slots", f"t{n}:epoch", f"t{n}:free"
        self.limit, self.lease_ms = limit, lease_ms
        self._acquire, self._release = r.register_script(ACQUIRE), r.register_script(RELEASE)
        self._renew, self._view = r.register_script(RENEW), r.register_script(VIEW)

    def past_grace(self) -> "Backend":
        self.r.set(self.epoch, "1 1")  # an epoch whose grace ended long ago
        return self

    def acquire(self, member: str, *, holder: bool = False) -> tuple[int, int, int]:
        taken, n, grace = self._acquire(keys=[self.key, self.epoch],
                                        args=[self.lease_ms, self.limit, member, int(holder), DISCOVERY_MS])
        return taken, n, grace

    def release(self, *members: str) -> int:
        return self._release(keys=[self.key], args=[self.channel, *members])

    def renew(self, members: list[str], drops: list[str] = (), *, holder: bool = True):
        grace, lost, readded, live = self._renew(
            keys=[self.key, self.epoch],
            args=[self.lease_ms, self.limit, self.channel, int(holder), DISCOVERY_MS, len(drops), *drops, *members])
        return grace, lost, readded, sorted(live)

    def view(self) -> tuple[int, dict[str, float]]:
        now, flat = self._view(keys=[self.key, self.epoch])
        return now, {flat[i]: float(flat[i + 1]) for i in range(0, len(flat), 2)}

    def expire(self, member: str) -> None:
        self.r.zadd(self.key, {member: self.redis_ms() - 1})  # its lease just ran out, by Redis's clock

    def members(self) -> set[str]:
        return set(self.r.zrange(self.key, 0, -1))

    def expiry(self, member: str) -> float:
        return self.r.zscore(self.key, member)

    def redis_ms(self) -> int:
        s, us = self.r.time()
        return s * 1000 + us // 1000


# -- the epoch's grace ----------------------------------------------------------------------------


def test_an_empty_redis_grants_nothing_for_a_short_discovery_window_when_the_caller_holds_nothing(server):
    b = Backend(server.client())
    t0 = b.redis_ms()
    assert b.acquire("a:1") == (0, 0, DISCOVERY_MS)
    end, start = map(int, b.r.get(b.epoch).split())
    assert end - start == DISCOVERY_MS and t0 <= start <= b.redis_ms()
    taken, n, left = b.acquire("a:2")
    assert (taken, n) == (0, 0) and 0 < left <= DISCOVERY_MS  # the same window, not a new one
    assert b.members() == set()


def test_an_empty_redis_waits_a_whole_lease_when_the_caller_holds_slots(server):
    """A replica with leases says the Redis lost them: every holder gets lease_s to re-register."""
    b = Backend(server.client())
    assert b.acquire("a:1", holder=True) == (0, 0, LEASE_MS)
    end, start = map(int, b.r.get(b.epoch).split())
    assert end - start == LEASE_MS


def test_a_lost_lease_re_registered_in_the_discovery_window_stretches_it_to_the_full_grace(server):
    b = Backend(server.client(), limit=1)
    b.acquire("new:1")  # a fresh replica opens the epoch: the short window
    _, start = map(int, b.r.get(b.epoch).split())
    grace, lost, readded, live = b.renew(["old:1", "old:2"])  # a holder comes back with two
    # re-registrations are taken past the limit: these requests were already running
    assert (lost, readded, live) == ([], ["old:1", "old:2"], ["old:1", "old:2"])
    assert b.r.get(b.epoch) == f"{start + LEASE_MS} {start}"
    assert DISCOVERY_MS < grace <= LEASE_MS
    taken, _, left = b.acquire("new:1")
    assert taken == 0 and DISCOVERY_MS < left <= grace  # no new grant until the full grace ends


def test_a_renewal_that_re_adds_nothing_leaves_the_window_short(server):
    b = Backend(server.client())
    b.acquire("new:1")
    before = b.r.get(b.epoch)
    b.renew([])
    assert b.r.get(b.epoch) == before


def test_a_member_already_held_is_held_again_even_during_the_grace(server):
    """The retry of a call whose answer was lost: the member is in the set, so it is its slot."""
    b = Backend(server.client(), limit=1)
    b.renew(["a:1"])  # re-registered into the grace a holder opened
    assert b.acquire("a:1") == (1, 1, 0)
    assert b.acquire("a:2")[0] == 0


# -- taking and holding ---------------------------------------------------------------------------


def test_slots_are_granted_up_to_the_limit_each_until_now_plus_the_lease(server):
    b = Backend(server.client(), limit=2).past_grace()
    t0 = b.redis_ms()
    assert b.acquire("a:1") == (1, 1, 0)
    assert b.acquire("b:1") == (1, 2, 0)
    assert b.acquire("c:1") == (0, 2, 0)
    t1 = b.redis_ms()
    for m in ("a:1", "b:1"):
        assert t0 + LEASE_MS <= b.expiry(m) <= t1 + LEASE_MS
    assert b.members() == {"a:1", "b:1"}


def test_taking_again_what_is_held_extends_it_and_takes_no_second_slot(server):
    b = Backend(server.client(), limit=2).past_grace()
    b.acquire("a:1")
    b.r.zadd(b.key, {"a:1": b.redis_ms() + 2_000})  # sooner than a fresh lease would
    assert b.acquire("b:1") == (1, 2, 0)
    assert b.acquire("a:1") == (1, 2, 0)  # full, but it is a's own slot
    assert b.expiry("a:1") >= b.redis_ms() + LEASE_MS - 1_000


def test_an_expired_lease_is_dropped_and_its_slot_granted_to_the_next_taker(server):
    b = Backend(server.client(), limit=1).past_grace()
    assert b.acquire("dead:1")[0] == 1
    assert b.acquire("b:1") == (0, 1, 0)
    b.expire("dead:1")
    assert b.acquire("b:1") == (1, 1, 0)
    assert b.members() == {"b:1"}


def test_a_lease_runs_out_by_redis_s_own_clock(server):
    b = Backend(server.client(), limit=1, lease_ms=200).past_grace()
    assert b.acquire("dead:1")[0] == 1
    ends = b.expiry("dead:1")
    assert b.acquire("b:1")[0] == 0
    # the lease's end is the subject: b is granted once Redis's clock passes it, not before
    deadline = time.monotonic() + 30
    while b.acquire("b:1")[0] == 0:
        assert time.monotonic() < deadline, "the lease never ran out"
        time.sleep(0.02)
    assert b.redis_ms() >= ends  # not before its end
    assert b.members() == {"b:1"}


# -- giving back ----------------------------------------------------------------------------------


def test_a_release_frees_what_is_held_and_announces_the_count_left(server):
    b = Backend(server.client(), limit=3).past_grace()
    for m in ("a:1", "a:2", "b:1"):
        b.acquire(m)
    sub = b.r.pubsub()
    sub.subscribe(b.channel)
    assert sub.get_message(timeout=10)["type"] == "subscribe"
    assert b.release("a:1", "a:2") == 2
    msg = sub.get_message(timeout=10)
    assert (msg["type"], msg["data"]) == ("message", "1")
    assert b.members() == {"b:1"}
    sub.close()


def test_a_stale_holder_s_release_frees_nobody_else_s_slot_and_announces_nothing(server):
    """A's lease ran out and B took the slot: A's late release (its own member, never reused)
    removes nothing, and no replica is woken for a slot that is not free."""
    b = Backend(server.client(), limit=1).past_grace()
    b.acquire("a:1")
    b.expire("a:1")
    assert b.acquire("b:1") == (1, 1, 0)
    sub = b.r.pubsub()
    sub.subscribe(b.channel)
    assert sub.get_message(timeout=10)["type"] == "subscribe"
    assert b.release("a:1") == 0
    assert b.members() == {"b:1"}
    assert b.acquire("c:1") == (0, 1, 0)
    assert b.release("b:1") == 1
    # the first message on the channel is b's release: the stale one published nothing before it
    msg = sub.get_message(timeout=10)
    assert (msg["type"], msg["data"]) == ("message", "0")
    sub.close()


# -- renewing -------------------------------------------------------------------------------------


def test_a_renewal_extends_what_is_held_and_gives_back_the_drops(server):
    b = Backend(server.client(), limit=3).past_grace()
    for m in ("a:1", "a:2", "b:1"):
        b.acquire(m)
    b.r.zadd(b.key, {"a:1": b.redis_ms() + 2_000})
    sub = b.r.pubsub()
    sub.subscribe(b.channel)
    assert sub.get_message(timeout=10)["type"] == "subscribe"
    grace, lost, readded, live = b.renew(["a:1"], drops=["a:2"])
    assert (grace, lost, readded, live) == (0, [], [], ["a:1", "b:1"])
    assert b.expiry("a:1") >= b.redis_ms() + LEASE_MS - 1_000
    msg = sub.get_message(timeout=10)
    assert (msg["type"], msg["data"]) == ("message", "2")
    sub.close()


def test_a_lost_lease_is_taken_back_when_there_is_room_and_lost_when_there_is_none(server):
    b = Backend(server.client(), limit=2).past_grace()
    b.acquire("a:1")
    b.acquire("a:2")
    b.expire("a:1")
    b.expire("a:2")
    assert b.acquire("b:1")[0] == 1  # one of the two slots went to b meanwhile
    grace, lost, readded, live = b.renew(["a:1", "a:2"])
    assert (grace, lost, readded, live) == (0, ["a:2"], ["a:1"], ["a:1", "b:1"])


def test_view_lists_the_live_leases_with_their_expiries_and_changes_nothing(server):
    b = Backend(server.client(), limit=3).past_grace()
    b.acquire("a:1")
    b.acquire("b:1")
    b.expire("b:1")
    now, live = b.view()
    assert abs(now - b.redis_ms()) < 5_000
    assert list(live) == ["a:1"] and now < live["a:1"] <= now + LEASE_MS
    assert b.members() == {"a:1", "b:1"}  # the expired one is left for a writing script to drop


# -- the state machine ----------------------------------------------------------------------------

MEMBERS = [f"r{i % 2}:{i}" for i in range(6)]


class LeaseSet(RuleBasedStateMachine):
    """After the grace: the scripts against a model of the set. `live` members hold slots;
    `stale` ones ran out but are still in the set until a writing script sweeps them (acquire
    and renew do; a release removes one like any other member, freeing nobody's slot)."""

    def __init__(self, server: RedisServer) -> None:
        super().__init__()
        self.b = Backend(server.client(), limit=3).past_grace()
        self.live: set[str] = set()
        self.stale: set[str] = set()

    @rule(m=st.sampled_from(MEMBERS))
    def acquire(self, m):
        taken, n, grace = self.b.acquire(m)
        self.stale.clear()
        want = m in self.live or len(self.live) < self.b.limit
        if want:
            self.live.add(m)
        assert (taken, n, grace) == (int(want), len(self.live), 0)

    @rule(ms=st.lists(st.sampled_from(MEMBERS), min_size=1, max_size=3, unique=True))
    def release(self, ms):
        assert self.b.release(*ms) == len((self.live | self.stale) & set(ms))
        self.live -= set(ms)
        self.stale -= set(ms)

    @rule(ms=st.lists(st.sampled_from(MEMBERS), max_size=4, unique=True),
          drops=st.lists(st.sampled_from(MEMBERS), max_size=2, unique=True))
    def renew(self, ms, drops):
        ms = [m for m in ms if m not in drops]
        grace, lost, readded, live = self.b.renew(ms, drops)
        self.live -= set(drops)
        self.stale.clear()
        want_lost, want_readded = [], []
        for m in ms:
            if m in self.live:
                continue
            if len(self.live) < self.b.limit:
                self.live.add(m)
                want_readded.append(m)
            else:
                want_lost.append(m)
        assert (grace, lost, readded, live) == (0, want_lost, want_readded, sorted(self.live))

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def expire(self, data):
        m = data.draw(st.sampled_from(sorted(self.live)))
        self.b.expire(m)
        self.live.discard(m)
        self.stale.add(m)

    @invariant()
    def the_set_is_the_model_and_never_more_live_than_the_limit(self):
        assert len(self.live) <= self.b.limit
        assert set(self.b.view()[1]) == self.live
        assert self.b.members() == self.live | self.stale

    def teardown(self):
        self.b.r.delete(self.b.key, self.b.epoch)
        self.b.r.close()


def test_the_scripts_keep_the_lease_set_a_model_predicts(server):
    run_state_machine_as_test(lambda: LeaseSet(server),
                              settings=settings(max_examples=40, stateful_step_count=30, deadline=None))
