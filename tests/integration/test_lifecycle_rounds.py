"""The managed backends' loop is woken by a change in demand, not by every slot taken or given
back (lifecycle/fleet.py, `slot_event`): 16 concurrent requests on a ready managed stub, served at
once (16 slots) or through its queue (4 slots), cost the fleet a few rounds in all, counted by
the gateway's own `hlf_lifecycle_rounds_total`. (Before, every take and every release woke it:
up to two whole rounds per request.)"""

from __future__ import annotations

import re
import threading

import pytest

from gwproc import Gateway, config_for
from managed import backends, stub_backend, wait_state
from rawhttp import post_raw
from stubproc import wait_for

N = 16


def _rounds(gw) -> float:
    status, text = gw.get("/metrics")
    assert status == 200
    m = re.search(r"^hlf_lifecycle_rounds_total (\S+)$", text, re.M)
    assert m, "no hlf_lifecycle_rounds_total in /metrics"
    return float(m.group(1))


def _settled(gw) -> float:
    """The round count once the loop has nothing left to do (two reads alike, nothing held)."""
    last: list[float] = []

    def still():
        if backends(gw)["a"]["in_use"] or backends(gw)["a"]["waiting"]:
            return None
        last.append(_rounds(gw))
        return last[-1] if len(last) > 1 and last[-1] == last[-2] else None
    return wait_for(still, 20, 0.3)


@pytest.mark.parametrize("slots", [16, 4])
def test_sixteen_concurrent_requests_wake_the_fleet_a_few_times_not_twice_each(slots):
    cfg = config_for({"a": stub_backend("vllm", "--token-delay-ms", "30", slots=slots, preload=True)},
                     {"m": {"backend": "a"}}, resources={"gpu": 1})
    with Gateway(cfg) as gw:
        wait_state(gw, "a", "ready")
        before = _settled(gw)
        results: list[int] = []

        def one():
            status, _, _ = post_raw(gw.base + "/chat/completions",
                                    {"model": "m", "messages": [{"role": "user", "content": "[stub content=20]"}]},
                                    timeout=60)
            results.append(status)
        threads = [threading.Thread(target=one) for _ in range(N)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert results == [200] * N
        rounds = _settled(gw) - before
        print(f"slots={slots}: {rounds:g} fleet rounds for {N} concurrent requests "
              f"({rounds / N:.2f} per request)")
        assert rounds <= N / 2, f"{rounds:g} rounds for {N} requests"
