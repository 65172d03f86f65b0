"""The fleet (lifecycle/fleet.py) without processes: a scripted spawner and prober in place of
process.Child and probe.Prober, real slot pools, real policy. Starts on demand, waiting through a
load, a failed start's 503 and back-off, a bug of the gateway's own in a start, a crash while
serving, a swap that never stops a backend under a held slot, and illegal moves refused."""

from __future__ import annotations

import asyncio
import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from homelab_frontend import config as cfgmod
from homelab_frontend.admission.slots import SlotPool
from homelab_frontend.errors import GatewayError
from homelab_frontend.lifecycle.fleet import Fleet
from homelab_frontend.lifecycle.machine import Event, IllegalMove
from homelab_frontend.lifecycle.swap_policy import HOLDING, UnitState
from support.scripted_child import ScriptedChild


class Spawner:
    def __init__(self) -> None:
        self.children: dict[str, list[ScriptedChild]] = {}
        self.exit_at_start: int | None = None
        self.bug: Exception | None = None

    async def __call__(self, argv, env, cwd, ring, kill_grace_s):
        if self.bug is not None:
            raise self.bug
        child = ScriptedChild(self.exit_at_start)
        self.children.setdefault(argv[0], []).append(child)
        return child

    def live(self) -> list[str]:
        return [n for n, cs in self.children.items() if any(c.running for c in cs)]


class Prober:
    def __init__(self) -> None:
        self.delay = 0.05
        self.taken_for = 0  # how many `listening` asks still find the address taken (-1: for good)
        self.asked = 0

    async def ready(self, cfg) -> bool:
        await asyncio.sleep(self.delay)
        return True

    async def listening(self, cfg) -> bool:
        self.asked += 1
        if self.taken_for == 0:
            return False
        if self.taken_for > 0:
            self.taken_for -= 1
        return True

    async def close(self) -> None:
        pass


def config(*names: str, gpu: float = 1.0, **run) -> cfgmod.Config:
    backends = {n: {"url": f"http://127.0.0.1:9/{n}/v1", "slots": 1, "queue": {"depth": 8, "timeout_s": 5},
                    "run": {"cmd": [n], "uses": {"gpu": 1}, "start_timeout_s": 5, "backoff_s": 2, **run}}
                for n in names}
    return cfgmod.parse({"backends": backends, "models": {n: {"backend": n} for n in names},
                         "resources": {"gpu": gpu}, "lifecycle": {"swap_after_s": 0.2}})


class Rec:
    def __init__(self, rid: str) -> None:
        self.id, self.phase, self.load_wait = rid, "queued", 0.0

    def queued(self):
        self.phase = "queued"

    def loading(self):
        self.phase = "loading"

    def cancel(self, reason, message=""):
        return False


async def fleet_of(*names: str, **kw):
    spawner, prober = Spawner(), Prober()
    fleet = Fleet(spawner=spawner, prober=prober)
    cfg = config(*names, **kw)
    fleet.configure(cfg)
    pools = {}
    for n in names:
        b = cfg.backends[n]
        pools[n] = SlotPool(n, b.slots, b.queue.depth, b.queue.timeout_s)
        fleet.attach(n, pools[n])
    fleet.start()
    return fleet, spawner, prober, pools


def test_a_request_starts_its_backend_waits_through_the_load_then_holds_a_slot():
    async def go():
        fleet, spawner, prober, pools = await fleet_of("a")
        prober.delay = 0.3
        rec = Rec("r1")
        lease = await asyncio.wait_for(pools["a"].acquire("k", 0, rec), 5)
        u = fleet.units["a"]
        assert u.state is UnitState.READY and spawner.live() == ["a"] and lease.holder is rec
        assert rec.load_wait >= 0.25 and fleet.load_wait_s["a"] >= 0.25
        pools["a"].release(lease, 0.1)
        await fleet.close()
        assert spawner.live() == [] and u.state is UnitState.STOPPED
    asyncio.run(go())


def test_a_failed_start_answers_its_waiters_and_backs_off():
    async def go():
        fleet, spawner, prober, pools = await fleet_of("a")
        spawner.exit_at_start = 1
        with pytest.raises(GatewayError) as ei:
            await asyncio.wait_for(pools["a"].acquire("k", 0, Rec("r")), 5)
        assert ei.value.status == 503 and "failed to start" in ei.value.message
        assert fleet.units["a"].state is UnitState.FAILED
        with pytest.raises(GatewayError) as again:  # the back-off: refused at once, not queued
            await pools["a"].acquire()
        assert again.value.retry_after >= 1 and pools["a"].queued == 0
        await fleet.close()
    asyncio.run(go())


def test_only_a_failed_start_makes_a_managed_backend_unavailable():
    """What /readyz asks: stopped is available (a request starts it), failed is not, with why."""
    async def go():
        fleet, spawner, prober, pools = await fleet_of("a")
        assert fleet.units["a"].state is UnitState.STOPPED and fleet.unavailable("a") is None
        assert fleet.unavailable("not-managed") is None
        spawner.exit_at_start = 1
        with pytest.raises(GatewayError) as ei:
            await asyncio.wait_for(pools["a"].acquire("k", 0, Rec("r")), 5)
        assert fleet.unavailable("a") == ei.value.message and "failed to start" in ei.value.message
        spawner.exit_at_start = None
        fleet.units["a"].retry_at = None  # the back-off over: the next request tries again
        lease = await asyncio.wait_for(pools["a"].acquire("k", 0, Rec("r2")), 5)
        assert fleet.units["a"].state is UnitState.READY and fleet.unavailable("a") is None
        pools["a"].release(lease, 0.1)
        await fleet.close()
    asyncio.run(go())


def test_a_taken_address_fails_the_start_without_spawning_and_names_it():
    """Something else answers at the backend's address: spawning would leave the new server
    unable to bind while the probe took the stranger for it and the requests went there."""
    async def go():
        fleet, spawner, prober, pools = await fleet_of("a", start_timeout_s=0.5)
        prober.taken_for = -1
        with pytest.raises(GatewayError) as ei:
            await asyncio.wait_for(pools["a"].acquire("k", 0, Rec("r")), 5)
        msg = ei.value.message
        assert ei.value.status == 503 and "already answers" in msg
        assert "not from a server the gateway started" in msg and "next try in" in msg
        assert spawner.children == {} and fleet.units["a"].state is UnitState.FAILED
        assert fleet.starts[("a", "port_in_use")] == 1
        assert "waiting for it to be free" in "\n".join(fleet.units["a"].log.tail(5))
        await fleet.close()
    asyncio.run(go())


def test_an_address_freed_within_the_start_timeout_is_waited_for():
    """What holds the port may be on its way out (a previous leader's server being killed by
    its supervisor): the start waits for it, then spawns."""
    async def go():
        fleet, spawner, prober, pools = await fleet_of("a")
        prober.taken_for = 3
        lease = await asyncio.wait_for(pools["a"].acquire("k", 0, Rec("r")), 5)
        assert prober.asked == 4 and len(spawner.children["a"]) == 1
        assert fleet.units["a"].state is UnitState.READY and fleet.starts[("a", "ok")] == 1
        pools["a"].release(lease, 0.1)
        await fleet.close()
    asyncio.run(go())


def test_a_bug_in_the_start_path_is_the_gateways_own_error(caplog):
    async def go():
        fleet, spawner, prober, pools = await fleet_of("a")
        spawner.bug = KeyError("oops")
        with caplog.at_level(logging.ERROR, logger="homelab_frontend.lifecycle"):
            with pytest.raises(GatewayError) as ei:
                await asyncio.wait_for(pools["a"].acquire("k", 0, Rec("r")), 5)
        assert "internal error" in ei.value.message and "KeyError" in ei.value.message
        assert fleet.starts[("a", "error")] == 1
        assert any("internal error while starting backend a" in r.getMessage() and r.exc_info
                   for r in caplog.records)
        await fleet.close()
    asyncio.run(go())


def test_a_bug_after_the_spawn_stops_the_process_it_started():
    """A start that fails on the gateway's own bug once its server runs (the probe raised, say):
    the unit is `failed`, so the policy counts its resources free and may start another backend
    in their place; the process must not live on holding the GPU and the port."""
    async def go():
        fleet, spawner, prober, pools = await fleet_of("a")

        async def broken(cfg):
            raise RuntimeError("probe bug")
        prober.ready = broken
        with pytest.raises(GatewayError) as ei:
            await asyncio.wait_for(pools["a"].acquire("k", 0, Rec("r")), 5)
        assert "internal error" in ei.value.message
        assert fleet.units["a"].state is UnitState.FAILED
        child = spawner.children["a"][0]
        assert not child.running and child.stops == 1
        await fleet.close()
    asyncio.run(go())


def test_a_bug_while_stopping_kills_the_tree_and_the_unit_does_not_stay_stopping():
    """A stop that raises (the gateway's own bug) must still end in `stopped`, the tree killed:
    a unit left `stopping` is skipped by every later round and holds its GPU room for good."""
    async def go():
        fleet, spawner, prober, pools = await fleet_of("a", idle_ttl_s=0.1)
        pools["a"].release(await asyncio.wait_for(pools["a"].acquire(), 5))
        child = spawner.children["a"][0]

        async def broken(timeout_s):
            raise RuntimeError("stop bug")
        child.stop = broken
        for _ in range(500):
            if fleet.units["a"].state is UnitState.STOPPED:
                break
            await asyncio.sleep(0.01)
        assert fleet.units["a"].state is UnitState.STOPPED
        assert not child.running and child.exited.result() == -9
        await fleet.close()
    asyncio.run(go())


def test_a_crash_while_ready_is_noticed_and_the_next_request_starts_it_again():
    async def go():
        fleet, spawner, prober, pools = await fleet_of("a")
        pools["a"].release(await asyncio.wait_for(pools["a"].acquire(), 5))
        first = spawner.children["a"][0]
        first.die(-9)
        for _ in range(100):
            if fleet.units["a"].state is UnitState.STOPPED:
                break
            await asyncio.sleep(0.01)
        assert fleet.units["a"].state is UnitState.STOPPED and "exited while ready" in fleet.units["a"].error
        pools["a"].release(await asyncio.wait_for(pools["a"].acquire(), 5))
        assert len(spawner.children["a"]) == 2 and spawner.children["a"][1].running
        await fleet.close()
    asyncio.run(go())


def test_illegal_moves_raise():
    async def go():
        fleet, spawner, prober, pools = await fleet_of("a")
        u = fleet.units["a"]
        with pytest.raises(IllegalMove):
            u.advance(Event.UP)  # never started
        assert u.state is UnitState.STOPPED
        await fleet.close()
    asyncio.run(go())


@settings(max_examples=15, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("ab"), st.integers(0, 3)), min_size=1, max_size=8))
def test_two_backends_one_gpu_serve_everyone_never_both_running_never_stopped_under_a_slot(reqs):
    """Requests for two backends that cannot run together: every request is served, at no moment
    do both hold the GPU, and a backend is never stopped while one of its slots is held."""
    async def go():
        fleet, spawner, prober, pools = await fleet_of("a", "b")
        prober.delay = 0.01
        violations: list[str] = []

        def check():
            holding = [n for n, u in fleet.units.items() if u.state in HOLDING]
            if len(holding) > 1:
                violations.append(f"both hold: {holding}")
            for n, u in fleet.units.items():
                if pools[n].in_use and u.state not in (UnitState.READY, UnitState.DRAINING):
                    violations.append(f"{n} {u.state.value} with a slot held")
            if len(spawner.live()) > 1:
                violations.append(f"two processes: {spawner.live()}")

        async def req(name, ticks):
            lease = await pools[name].acquire()
            for _ in range(ticks):
                check()
                await asyncio.sleep(0.005)
            pools[name].release(lease, 0.01)

        done = await asyncio.wait_for(asyncio.gather(*(req(n, t) for n, t in reqs)), 30)
        assert len(done) == len(reqs) and not violations, violations
        await fleet.close()
    asyncio.run(go())


async def _ready_and_seen(policy: str = "batch"):
    """A ready unit with two slots, the loop not running: each round is a `step()` of the test's,
    and `kicks` counts what would have woken the loop."""
    fleet = Fleet(spawner=Spawner(), prober=Prober())
    fleet.configure(config("a"))
    fleet.policy = policy
    pool = SlotPool("a", 2, 8, 5)
    fleet.attach("a", pool)
    fleet.want("a")
    fleet.step()
    await fleet.units["a"].effect
    fleet.step()  # the round that sees it ready and idle
    kicks: list[int] = []
    fleet.kick = lambda: kicks.append(1)  # type: ignore[method-assign]
    return fleet, pool, kicks


async def _queued(pool: SlotPool, n: int) -> asyncio.Task:
    task = asyncio.get_running_loop().create_task(pool.acquire())
    while pool.queued < n:
        await asyncio.sleep(0)
    return task


def test_slots_taken_and_given_back_wake_the_loop_only_when_the_demand_moves():
    async def go():
        fleet, pool, kicks = await _ready_and_seen()
        u = fleet.units["a"]
        before = u.last_used
        lease = await pool.acquire()
        pool.release(lease)
        assert kicks == [] and u.last_used > before  # the round saw it idle; only its idle clock moved
        lease = await pool.acquire()
        fleet.step()  # a round sees it busy: it may have decided to drain it
        pool.release(lease)
        assert len(kicks) == 1  # the last slot freed
        fleet.step()
        held = [await pool.acquire(), await pool.acquire()]
        fleet.step()
        kicks.clear()
        first = await _queued(pool, 1)
        assert len(kicks) == 1  # a first waiter
        fleet.step()
        second = await _queued(pool, 2)
        pool.release(held.pop())  # granted to the first waiter: one still waits, both slots held
        assert await first and pool.queued == 1 and len(kicks) == 1
        second.cancel()
        await asyncio.gather(second, return_exceptions=True)
        assert len(kicks) == 2  # the last waiter gone
        fleet.step()
        pool.queue.timeout_s = 0.05
        expiring = await _queued(pool, 1)
        fleet.step()
        with pytest.raises(GatewayError):
            await expiring
        assert len(kicks) == 4  # its arrival, and its expiry
        await fleet.close()
    asyncio.run(go())


@pytest.mark.parametrize("policy, wakes", [("batch", 0), ("fifo", 1)])
def test_the_oldest_waiter_leaving_wakes_the_loop_under_fifo_only(policy, wakes):
    """Under fifo a queue's oldest request may hold back another queue: when it leaves, the
    round must let that one in. Under batch nothing the policy reads moved while one still waits."""
    async def go():
        fleet, pool, kicks = await _ready_and_seen(policy)
        held = [await pool.acquire(), await pool.acquire()]
        oldest = await _queued(pool, 1)
        await _queued(pool, 2)
        fleet.step()
        kicks.clear()
        oldest.cancel()
        await asyncio.gather(oldest, return_exceptions=True)
        assert pool.queued == 1 and len(kicks) == wakes
        for lease in held:
            pool.release(lease)
        await fleet.close()
    asyncio.run(go())
