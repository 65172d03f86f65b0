"""Late is not gone (app/probes.py): a backend whose health probe gets no answer in time is marked
down only after `health.LATE_PROBES` late probes in a row, never on one, and is served meanwhile;
a backend silent for that many probes is down (a clear 503) and taken back when it answers.

The backend is tests/hostile_upstream.py, told to answer its next N `GET /v1/models` late
(`POST /late-models`); its `/stats` counts the asks, so each wait is on what the server saw. A
CI run failed this way (tests/real/test_lifecycle_llama.py): a llama-server busy generating
answered one 1 s probe late, was marked down, and the stream sent to it got a 503."""

from __future__ import annotations

import json
import urllib.request

import pytest

from gwproc import Gateway, config_for
from rawhttp import post_raw
from stubproc import wait_for
from support.hostile import Hostile

from homelab_frontend.ops.health import LATE_PROBES

INTERVAL_S = 2  # the probe's timeout too (min(5, health_interval_s))
LATE_S = 3.0  # how late a late answer comes: past the timeout on any machine


@pytest.fixture(scope="module")
def hostile():
    h = Hostile()
    yield h
    h.stop()


def _config(base: str) -> dict:
    b = {"url": base, "slots": 2, "kind": "openai", "health_interval_s": INTERVAL_S,
         "timeouts": {"connect_s": 2, "first_token_s": 10, "idle_s": 10, "nonstream_s": 10}}
    return config_for({"h": b}, {"m": {"backend": "h", "upstream_model": "good"}})


def _late(h: Hostile, n: int) -> int:
    """The next `n` answers to /models come late. -> how many asks the server has seen so far."""
    req = urllib.request.Request(h.url + "/late-models", data=json.dumps({"late": n, "delay_s": LATE_S}).encode(),
                                 method="POST")
    urllib.request.urlopen(req, timeout=5).close()
    return h.get("/stats")["models_asked"]


def _chat(gw: Gateway) -> tuple[int, bytes]:
    status, _, raw = post_raw(gw.url + "/llm/v1/chat/completions",
                              {"model": "m", "messages": [{"role": "user", "content": "hi"}]}, timeout=30)
    return status, raw


def test_a_backend_late_for_fewer_probes_than_the_limit_stays_up_and_serves(hostile):
    late = LATE_PROBES - 1
    with Gateway(_config(hostile.base)) as gw:
        wait_for(lambda: hostile.get("/stats")["models_asked"] >= 1, 30)  # the first probe, on time
        asked = _late(hostile, late)
        wait_for(lambda: gw.stderr().count("backend h is late") >= 1, 30)
        status, raw = _chat(gw)  # while its probes are late, its requests are served
        assert status == 200, raw
        # every late answer used, then one on time: the server's own count of asks
        wait_for(lambda: hostile.get("/stats")["models_asked"] >= asked + late + 1, 60)
        wait_for(lambda: f"backend h answered its probe again after {late} late" in gw.stderr(), 30)
        log = gw.stderr()
        assert log.count("backend h is late") == late
        assert "marked down" not in log
        assert gw.admin()["backends"]["h"]["up"] is True
        assert _chat(gw)[0] == 200


def test_a_backend_late_for_the_limit_is_down_then_taken_back_when_it_answers(hostile):
    with Gateway(_config(hostile.base)) as gw:
        wait_for(lambda: hostile.get("/stats")["models_asked"] >= 1, 30)
        asked = _late(hostile, LATE_PROBES)
        wait_for(lambda: "marked down" in gw.stderr(), 60)
        log = gw.stderr()
        assert log.count("backend h is late") == LATE_PROBES - 1  # the last late one marks it down
        assert f"marked down: backend 'h' did not answer /models within {INTERVAL_S} s" in log
        assert hostile.get("/stats")["models_asked"] >= asked + LATE_PROBES
        status, raw = _chat(gw)
        assert status == 503, raw
        assert "backend 'h' did not answer /models" in json.loads(raw)["error"]["message"]
        wait_for(lambda: "backend h is up again" in gw.stderr(), 60)  # the next probe is on time
        assert _chat(gw)[0] == 200
