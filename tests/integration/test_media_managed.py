"""Managed servers for the relayed calls (`run:`): a whisper.cpp server (no /v1/models: ready by
its /health), a TTS server and an image server started on demand by the gateway itself, swapped
within `resources` like LLM servers (one GPU: the next starts only once the last has stopped),
and stopped when idle; judged by the processes' own evidence (pids, ports, the stub's log)."""

from __future__ import annotations

import json
import time

from gwproc import Gateway, config_for
from managed import alive, backends, port_closed, stub_backend, wait_gone, wait_state
from rawhttp import post_raw
from support.media_client import form, upload, wav


def _port(backend: dict) -> int:
    return int(backend["url"].rsplit(":", 1)[1].split("/")[0])


def test_speech_servers_start_on_demand_swap_within_resources_and_stop_when_idle():
    whisper = stub_backend("whispercpp", "--start-delay-s", "0.3", model="ggml-tiny.en", idle_ttl_s=2)
    tts = stub_backend("kokoro", model="kokoro")
    sd = stub_backend("sdcpp", model="sd-cpp-local")
    cfg = config_for({"w": whisper, "k": tts, "sd": sd},
                     {"whisper-1": {"backend": "w"}, "tts-1": {"backend": "k", "upstream_model": "kokoro"},
                      "sd": {"backend": "sd", "upstream_model": "sd-cpp-local"}},
                     resources={"gpu": 1})
    with Gateway(cfg) as gw:
        view = backends(gw)
        assert all(view[n]["state"] == "stopped" for n in ("w", "k", "sd"))
        # a transcription starts whisper.cpp's server: ready by /health, it has no /v1/models
        body, ctype = form([("model", "whisper-1")], [("file", "a.wav", wav(1.0), "audio/wav")])
        status, _, raw = upload(gw.url + "/v1/audio/transcriptions", body, ctype)
        assert status == 200 and json.loads(raw)["text"], raw
        w = backends(gw)["w"]
        assert w["state"] == "ready" and alive(w["pid"])
        # speech needs the GPU: whisper is stopped first, then the TTS server starts
        status, headers, audio = post_raw(gw.url + "/v1/audio/speech", {"model": "tts-1", "input": "hi"})
        assert status == 200 and headers["content-type"].startswith("audio/") and audio
        wait_gone(w["pid"])
        k = backends(gw)["k"]
        assert k["state"] == "ready" and backends(gw)["w"]["state"] == "stopped"
        log = gw.stderr()
        assert log.index("backend w: stopping -> stopped") < log.index("backend k: stopped -> starting")
        # and an image swaps the TTS server out the same way
        status, _, raw = post_raw(gw.url + "/v1/images/generations", {"model": "sd", "prompt": "a boat"})
        assert status == 200 and json.loads(raw)["data"], raw
        wait_gone(k["pid"])
        # whisper again, then left idle: stopped after its idle_ttl_s, its port closed
        status, _, raw = upload(gw.url + "/v1/audio/transcriptions", body, ctype)
        assert status == 200
        pid = backends(gw)["w"]["pid"]
        wait_state(gw, "w", "stopped", timeout=15)
        wait_gone(pid)
        assert port_closed(_port(whisper))
