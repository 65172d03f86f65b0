"""Failover and timeouts for the relayed calls, against real stub processes behind a real
gateway: a backend that cannot be reached is failed over before the answer begins (a rerank, an
upload whose file had not gone out yet), an upload part of which a failing backend had already
read is never sent to a second one, a speech whose first byte never comes is a 504 that stops the
backend, and a backend that breaks off mid-audio cuts the client's answer short rather than
ending it as if whole."""

from __future__ import annotations

import http.client
import json
from urllib.parse import urlsplit

import pytest

from gwproc import Gateway, config_for
from rawhttp import post_raw
from stubproc import start_stub, wait_for
from support.media_client import form, upload, wav


def _up(gw) -> dict:
    return {n: b["up"] for n, b in gw.admin()["backends"].items()}


def test_a_rerank_and_an_upload_fail_over_from_a_backend_that_is_gone():
    with start_stub("vllm", "--model", "rr") as gone, start_stub("vllm", "--model", "rr") as v, \
            start_stub("whispercpp") as wgone, start_stub("whispercpp") as w:
        cfg = config_for({"gone": {"url": gone.base, "kind": "vllm", "health_interval_s": 60},
                          "v": {"url": v.base, "kind": "vllm", "health_interval_s": 60},
                          "wgone": {"url": wgone.url, "kind": "whispercpp", "health_interval_s": 60},
                          "w": {"url": w.url, "kind": "whispercpp", "health_interval_s": 60}},
                         {"rr": {"backends": ["gone", "v"], "affinity": False},
                          "whisper-1": {"backends": ["wgone", "w"], "affinity": False}})
        with Gateway(cfg) as gw:
            wait_for(lambda: all(_up(gw).values()), 10)
            gone.stop()
            wgone.stop()
            status, _, raw = post_raw(gw.url + "/v1/rerank", {"model": "rr", "query": "q", "documents": ["a", "b"]})
            assert status == 200 and json.loads(raw)["results"], raw
            body, ctype = form([("model", "whisper-1")], [("file", "a.wav", wav(20.0), "audio/wav")])
            status, _, raw = upload(gw.url + "/v1/audio/transcriptions", body, ctype)
            assert status == 200 and json.loads(raw)["text"], raw
            assert w.requests()[-1]["body"]["files"]["file"][0]["bytes"] == len(wav(20.0))
            recs = [r for r in gw.access_log() if r["status"] == 200 and r["failovers"]]
            assert {r["dialect"] for r in recs} == {"rerank", "transcription"}
            assert all(r["backends_tried"][-1] in ("v", "w") for r in recs)


def test_an_upload_a_failing_backend_had_read_is_not_sent_to_another():
    with start_stub("whispercpp") as w1, start_stub("whispercpp") as w2:
        cfg = config_for({"w1": {"url": w1.url, "kind": "whispercpp"}, "w2": {"url": w2.url, "kind": "whispercpp"}},
                         {"whisper-1": {"backends": ["w1", "w2"], "affinity": False}})
        with Gateway(cfg) as gw:
            wait_for(lambda: all(_up(gw).values()), 10)
            # w1 reads the whole file, then answers 503 (a status another backend could answer)
            body, ctype = form([("model", "whisper-1"), ("prompt", "[stub status=503]")],
                               [("file", "a.wav", wav(30.0), "audio/wav")])
            status, _, raw = upload(gw.url + "/v1/audio/transcriptions", body, ctype)
            assert status == 503 and "'w1'" in json.loads(raw)["error"]["message"]
            assert len(w1.requests()) == 1 and w2.requests() == []
            # a form small enough to have been read whole before routing can be sent again: it
            # fails over (and w2, given the same directive, refuses it too, naming itself)
            small, ctype = form([("model", "whisper-1"), ("prompt", "[stub status=503]")],
                                [("file", "a.wav", wav(0.2), "audio/wav")])
            status, _, raw = upload(gw.url + "/v1/audio/transcriptions", small, ctype)
            assert status == 503 and "'w2'" in json.loads(raw)["error"]["message"]
            assert len(w1.requests()) == 2 and len(w2.requests()) == 1
            assert w2.requests()[-1]["body"]["files"]["file"][0]["bytes"] == len(wav(0.2))
            wait_for(lambda: gw.admin()["backends"]["w1"]["in_use"] == gw.admin()["backends"]["w2"]["in_use"] == 0, 2)


def test_speech_without_a_first_byte_in_time_is_a_504_and_a_backend_that_breaks_off_cuts_the_answer():
    with start_stub("kokoro") as k:
        cfg = config_for({"k": {"url": k.base, "kind": "openai", "timeouts": {"first_token_s": 0.5}}},
                         {"tts-1": {"backend": "k", "upstream_model": "kokoro"}})
        with Gateway(cfg) as gw:
            wait_for(lambda: all(_up(gw).values()), 10)
            before = k.log_text().count("cancelled")
            status, _, raw = post_raw(gw.url + "/v1/audio/speech", {"model": "tts-1", "input": "[stub headers_ms=5000] hi"})
            err = json.loads(raw)["error"]
            assert status == 504 and "first" in err["message"], raw
            wait_for(lambda: k.log_text().count("cancelled") == before + 1, 2)
            wait_for(lambda: gw.admin()["backends"]["k"]["in_use"] == 0, 2)
            # the backend drops its connection after 3 of 10 chunks: the client's answer is cut,
            # never ended as if whole
            u = urlsplit(gw.url)
            conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
            conn.request("POST", "/v1/audio/speech",
                         json.dumps({"model": "tts-1", "input": "[stub chunks=10 chunk_bytes=1000 fail_after=3] hi"}),
                         {"content-type": "application/json"})
            resp = conn.getresponse()
            assert resp.status == 200
            with pytest.raises(http.client.IncompleteRead) as cut:
                resp.read()
            conn.close()
            assert len(cut.value.partial) == 3000
            rec = wait_for(lambda: [r for r in gw.access_log() if r["outcome"] == "error_upstream_midstream"], 2)
            assert rec[-1]["dialect"] == "speech" and rec[-1]["status"] == 200
            wait_for(lambda: gw.admin()["backends"]["k"]["in_use"] == 0, 2)


def test_a_client_that_stalls_mid_upload_is_let_go_after_the_idle_timeout():
    """A client that stops sending half-way would hold the slot (and the backend, reading) until
    the whole request's timeout: after the backend's idle_s without a byte it gets a 400 saying
    so, the backend sees its request end, the slot is free."""
    import socket
    import time

    from support.media_client import _head

    with start_stub("whispercpp") as w:
        cfg = config_for({"w": {"url": w.url, "kind": "whispercpp", "slots": 1, "timeouts": {"idle_s": 1.0}}},
                         {"whisper-1": {"backend": "w"}})
        with Gateway(cfg) as gw:
            wait_for(lambda: all(_up(gw).values()), 10)
            body, ctype = form([("model", "whisper-1")], [("file", "a.wav", wav(20.0), "audio/wav")])
            addr, head = _head(gw.url + "/v1/audio/transcriptions", ctype, len(body), None)
            before = w.log_text().count("cancelled")
            with socket.create_connection(addr, timeout=30) as s:
                s.sendall(head + body[: len(body) // 2])  # and then nothing more
                t0 = time.monotonic()
                answer = b""
                while not answer.endswith(b"}"):  # the whole error (the server then lingers, reading)
                    answer += s.recv(65536)
                waited = time.monotonic() - t0
            assert waited < 5, waited
            status = int(answer.split(b" ", 2)[1])
            doc = json.loads(answer.partition(b"\r\n\r\n")[2])
            assert status == 400 and "stalled" in doc["error"]["message"]
            wait_for(lambda: w.log_text().count("cancelled") == before + 1, 2)
            wait_for(lambda: gw.admin()["backends"]["w"]["in_use"] == 0, 2)
