"""lifecycle/reload.py: a reloaded config against the records: a new managed backend gets a
record (wanted at once with `preload`), a changed `run` or `url` replaces a process that exists
and starts the failure back-off afresh, an unchanged one is left alone, and a backend gone or no
longer managed is marked to be removed (and taken back if it returns before it is forgotten)."""

from __future__ import annotations

import pytest

from homelab_frontend.lifecycle.machine import Event, Goal
from homelab_frontend.lifecycle.swap_policy import UnitState
from homelab_frontend.lifecycle.reload import reconcile
from homelab_frontend.lifecycle.unit import Managed

from support.managed_config import config


def _reconciled(units, cfg):
    changes = []
    reconcile(units, cfg, lambda n, s: changes.append((n, s)))
    return changes


def test_new_managed_backends_get_a_record_and_only_preloads_are_wanted():
    units: dict[str, Managed] = {}
    _reconciled(units, config(a={"preload": True}, b={}, plain=None))
    assert set(units) == {"a", "b"}  # a plain URL is no managed backend
    assert units["a"].wanted_at is not None and units["b"].wanted_at is None
    assert units["a"].state is UnitState.STOPPED


def _running(cfg, *events) -> dict[str, Managed]:
    units: dict[str, Managed] = {}
    _reconciled(units, cfg)
    for ev in events:
        units["a"].advance(ev)
    return units


@pytest.mark.parametrize("events, replaced", [((Event.START, Event.UP), True), ((Event.START,), True),
                                              ((), False)])
def test_a_changed_command_replaces_a_process_that_exists(events, replaced):
    units = _running(config(a={}), *events)
    units["a"].failures, units["a"].retry_at = 3, 99.0
    new = config(a={"cmd": ["a", "--new"]})
    _reconciled(units, new)
    u = units["a"]
    assert (u.goal is Goal.REPLACE) is replaced
    assert u.cfg is new.backends["a"] and u.run.cmd == ["a", "--new"]
    assert (u.failures, u.retry_at) == (0, None)  # the back-off starts afresh


def test_an_unchanged_config_leaves_the_record_alone():
    units = _running(config(a={}), Event.START, Event.UP)
    units["a"].failures = 2
    _reconciled(units, config(a={}))
    assert units["a"].goal is Goal.KEEP and units["a"].failures == 2


def test_a_backend_gone_or_no_longer_managed_is_removed_and_taken_back_if_it_returns():
    units = _running(config(a={}, b={}), Event.START, Event.UP)
    _reconciled(units, config(b=None))
    assert units["a"].goal is Goal.REMOVE and units["b"].goal is Goal.REMOVE
    _reconciled(units, config(a={}, b=None))
    assert units["a"].goal is Goal.REPLACE  # back before it was forgotten: a new process
