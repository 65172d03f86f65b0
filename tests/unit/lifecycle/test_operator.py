"""lifecycle/operator.py, through the fleet's methods that call it: what an operator's start and
stop and a client's keep_alive ask of the fleet's records: the goal beside the state (a start keeps what runs, a stop drains what holds),
a failed backend tried again at once, keep_alive 0 as an unload, and the view naming the leader."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from homelab_frontend.lifecycle.keep_alive import FOREVER
from homelab_frontend.lifecycle import operator
from homelab_frontend.lifecycle.fleet import Fleet
from homelab_frontend.lifecycle.machine import Aim, Event, Goal
from homelab_frontend.lifecycle.swap_policy import UnitState
from homelab_frontend.lifecycle.unit import Managed

from support.managed_config import config

CFG = config(a={"idle_ttl_s": 300}, b={})


class _Fleet(Fleet):
    """The fleet without its loop, counting its wake-ups."""

    def __init__(self, coord=None, cfg=CFG) -> None:
        super().__init__()
        self.units = {n: Managed(n, b) for n, b in cfg.backends.items()}
        self.coord = coord
        self.kicks = 0

    def kick(self) -> None:
        self.kicks += 1
        super().kick()


def _at(fleet: _Fleet, name: str, *events: Event) -> Managed:
    u = fleet.units[name]
    for ev in events:
        u.advance(ev)
    return u


def test_a_start_of_a_stopped_backend_wants_it_and_wakes_the_loop():
    f = _Fleet()
    d = f.want("a")
    assert f.units["a"].wanted_at is not None and f.kicks == 1 and d["name"] == "a"


def test_keep_alive_says_whether_it_changed_anything_so_the_fleet_wakes_only_then():
    units = {n: Managed(n, b) for n, b in config(a={}, b={"client_keep_alive": {"honour": False}}).backends.items()}
    assert operator.keep_alive(units["a"], 60.0) and units["a"].keep_alive == 60.0
    assert not operator.keep_alive(units["b"], 60.0) and units["b"].keep_alive is None
    units["a"].aim(Aim.DROP)
    assert not operator.keep_alive(units["a"], 5.0) and units["a"].keep_alive == 60.0


def test_a_start_of_a_ready_backend_asks_nothing_more():
    f = _Fleet()
    u = _at(f, "a", Event.START, Event.UP)
    f.want("a")
    assert u.wanted_at is None and u.goal is Goal.KEEP


def test_a_start_of_a_failed_backend_is_tried_now_not_after_its_backoff():
    f = _Fleet()
    u = _at(f, "a", Event.START, Event.FAIL)
    assert u.state is UnitState.FAILED
    u.retry_at = 1e12
    f.want("a")
    assert u.retry_at is None and u.wanted_at is not None


@pytest.mark.parametrize("aim, before, after", [(Aim.UNWANT, Goal.STOP, Goal.KEEP),
                                               (Aim.CHANGE, Goal.REPLACE, Goal.REPLACE_LATER)])
def test_a_start_cancels_a_pending_stop_but_not_a_pending_replacement(aim, before, after):
    f = _Fleet()
    u = _at(f, "a", Event.START, Event.UP)
    assert u.aim(aim) is before
    f.want("a")
    assert u.goal is after


def test_a_stop_drains_only_a_backend_whose_process_exists():
    f = _Fleet()
    ready = _at(f, "a", Event.START, Event.UP)
    ready.wanted_at = 5.0
    f.unwant("a")
    assert ready.goal is Goal.STOP and ready.wanted_at is None
    stopped = f.units["b"]
    f.unwant("b")
    assert stopped.goal is Goal.KEEP  # nothing to stop


def test_keep_alive_sets_the_idle_time_and_zero_unloads():
    f = _Fleet()
    u = _at(f, "a", Event.START, Event.UP)
    f.keep_alive("a", 60.0)
    assert u.idle_ttl_s == 60.0 and u.goal is Goal.KEEP
    f.keep_alive("a", FOREVER)
    assert u.keep_alive is FOREVER and u.idle_ttl_s is None  # until swapped out or stopped
    f.keep_alive("a", 0.0)  # with a prompt: stopped once idle after it, not drained now
    assert u.idle_ttl_s == 0.0 and u.goal is Goal.KEEP
    f.keep_alive("a", 0.0, prompt=False)
    assert u.keep_alive is None and u.goal is Goal.STOP  # Ollama's unload: the config's idle time again


def test_the_operator_caps_or_ignores_a_clients_keep_alive():
    capped = _Fleet(cfg=config(a={"idle_ttl_s": 300, "client_keep_alive": {"max_s": 600}}))
    u = _at(capped, "a", Event.START, Event.UP)
    capped.keep_alive("a", FOREVER)
    assert u.idle_ttl_s == 600.0
    capped.keep_alive("a", 3600.0)
    assert u.idle_ttl_s == 600.0
    capped.keep_alive("a", 5.0)
    assert u.idle_ttl_s == 5.0
    ignored = _Fleet(cfg=config(a={"idle_ttl_s": 300, "client_keep_alive": {"honour": False}}))
    u = _at(ignored, "a", Event.START, Event.UP)
    ignored.keep_alive("a", FOREVER)
    ignored.keep_alive("a", 0.0, prompt=False)
    assert u.keep_alive is None and u.idle_ttl_s == 300 and u.goal is Goal.KEEP and ignored.kicks == 0


def test_keep_alive_for_an_unknown_or_removed_backend_is_ignored():
    f = _Fleet()
    f.keep_alive("nope", 60.0)
    f.units["a"].aim(Aim.DROP)
    f.keep_alive("a", 60.0)
    assert f.units["a"].keep_alive is None and f.kicks == 0


def test_the_view_leaves_out_removed_backends_and_names_the_leader():
    coord = SimpleNamespace(replica="r1", leader=False, leader_id="r2")
    f = _Fleet(coord)
    f.units["b"].aim(Aim.DROP)
    snap = f.snapshot()
    assert [d["name"] for d in snap] == ["a"] and snap[0]["leader"] == "r2"
    coord.leader = True
    assert f.snapshot()[0]["leader"] == "r1"
    assert "leader" not in _Fleet().snapshot()[0]  # no replicas
