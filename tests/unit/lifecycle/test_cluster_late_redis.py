"""lifecycle/cluster.py with a Redis that answers late (its docstring, "Late is not gone"): a
leader gives up its lease when it must, without waiting for a call to fail, and a SET NX that
landed after the replica stopped waiting for it is claimed, not left to run out unused."""

from __future__ import annotations

import asyncio
import time

from homelab_frontend.lifecycle import cluster


class _Fleet:
    units: dict = {}

    def __init__(self) -> None:
        self.became: list[float] = []
        self.lost: list[float] = []

    def became_leader(self) -> None:
        self.became.append(time.monotonic())

    def lost_leadership(self) -> None:
        self.lost.append(time.monotonic())

    def mirror(self, states) -> None:
        pass

    def kick(self) -> None:
        pass


class _Redis:
    """The calls `_lead` makes, answering as scripted; `hang` makes every call wait for good
    (a Redis that stopped answering, with no socket bound to cut the wait)."""

    def __init__(self, set_ok: bool = False, holder: str | None = None, renews: int = 1, hang: bool = False):
        self.set_ok, self.holder, self.renews, self.hang = set_ok, holder, renews, hang
        self.calls: list[str] = []

    async def _answer(self, name: str, value):
        self.calls.append(name)
        if self.hang:
            await asyncio.Event().wait()
        return value

    def register_script(self, script):
        name = "renew" if script == cluster.RENEW else "release"
        return lambda keys, args: self._answer(name, self.renews)

    def set(self, *args, **kwargs):
        return self._answer("set", self.set_ok)

    def get(self, *args, **kwargs):
        return self._answer("get", self.holder)


def test_a_set_nx_that_landed_after_we_stopped_waiting_is_claimed():
    fleet = _Fleet()
    redis = _Redis(set_ok=False, holder="r1", renews=1)
    coord = cluster.Coordinator(redis, "r1", 4.0)
    asyncio.run(coord._lead(fleet))
    assert coord.leader and coord.leader_id == "r1" and len(fleet.became) == 1
    assert redis.calls == ["set", "get", "renew"]  # dated by a renewal sent now


def test_the_lock_held_by_another_replica_or_run_out_meanwhile_is_not_claimed():
    for holder, renews in (("r2", 1), ("r1", 0)):  # another's; ours, but expired before the renewal
        fleet = _Fleet()
        coord = cluster.Coordinator(_Redis(set_ok=False, holder=holder, renews=renews), "r1", 4.0)
        asyncio.run(coord._lead(fleet))
        assert not coord.leader and fleet.became == [] and coord.leader_id == holder


def test_a_leader_whose_redis_stops_answering_gives_up_before_its_lease_runs_out():
    lease_s = 4.0

    async def main() -> tuple[float, float, _Fleet]:
        fleet = _Fleet()
        redis = _Redis(set_ok=True)
        coord = cluster.Coordinator(redis, "r1", lease_s)
        await coord._lead(fleet)  # leader, renewed now
        assert coord.leader
        renewed = coord._renewed_at
        redis.hang = True  # from now on nothing answers, and no call fails either
        coord.start(fleet)
        deadline = time.monotonic() + 3 * lease_s
        while not fleet.lost and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert fleet.lost, "the leader kept its servers running with no lease it could vouch for"
        coord._closed = True
        coord._task.cancel()
        await asyncio.gather(coord._task, return_exceptions=True)
        return renewed, fleet.lost[0], fleet

    renewed, lost, fleet = asyncio.run(main())
    # waited for the late Redis as long as the lease allows, and stopped the servers before it ended
    assert lease_s * cluster.GIVE_UP <= lost - renewed < lease_s
