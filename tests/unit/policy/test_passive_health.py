"""Passive health (policy/passive_health.py): requests mark a backend down; strikes stop flapping."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from homelab_frontend.policy.passive_health import BASE_S, MAX_CAP_INTERVALS, THRESHOLD, PassiveHealth


def test_two_connection_failures_in_a_row_mark_it_down_and_an_answer_clears_the_count():
    p = PassiveHealth()
    assert THRESHOLD == 2
    assert not p.connection_failed()
    p.answered(False)  # an error status still proves it reachable
    assert not p.connection_failed()
    assert p.connection_failed()
    assert p.suspect


def test_the_first_reprobe_is_soon_and_backs_off_up_to_the_interval():
    p = PassiveHealth()
    assert p.next_probe_s(10) == 10  # not suspect: the normal interval
    p.connection_failed(), p.connection_failed()
    delays = []
    for _ in range(8):
        delays.append(p.next_probe_s(10))
        p.probed(False)
    assert delays == [BASE_S, 1, 2, 4, 8, 10, 10, 10]
    p.probed(True)
    assert p.next_probe_s(10) == BASE_S


def test_after_a_mark_down_one_failure_is_enough_and_each_strike_waits_longer():
    p = PassiveHealth()
    p.connection_failed(), p.connection_failed()
    first = []
    for strike in range(1, 7):
        p.probed(True)  # the probe answers: the gateway takes it back
        first.append(p.next_probe_s(1.0))
        assert p.connection_failed()  # one request fails: down again at once
    assert first == [0.5, 1.0, 2.0, 4.0, 8.0, 8.0]  # capped at MAX_CAP_INTERVALS intervals
    assert MAX_CAP_INTERVALS == 8


def test_a_request_it_serves_clears_its_record():
    p = PassiveHealth()
    p.connection_failed(), p.connection_failed()
    p.answered(True)
    assert not p.suspect and not p.connection_failed()  # two in a row again


@given(st.lists(st.sampled_from(["fail", "error", "ok", "probe_ok", "probe_fail"]), max_size=200),
       st.floats(0.1, 600))
def test_delays_stay_between_the_base_and_the_cap(events, interval):
    p = PassiveHealth()
    for ev in events:
        if ev == "fail":
            p.connection_failed()
        elif ev == "error":
            p.answered(False)
        elif ev == "ok":
            p.answered(True)
        else:
            p.probed(ev == "probe_ok")
        d = p.next_probe_s(interval)
        if p.suspect:
            assert min(BASE_S, interval) <= d <= interval * MAX_CAP_INTERVALS
        else:
            assert d == interval
