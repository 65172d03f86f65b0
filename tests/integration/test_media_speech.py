"""Text to speech through the gateway, over real sockets, against the stub's kokoro-fastapi and
speaches flavours (stub/audio.py follows their routers): audio streamed to the client as the
backend makes it (the first bytes arrive while the backend is still speaking), each format's
content type, speaches' SSE, the pickers' /audio/models and /audio/voices from the configured
backends, a client that leaves mid-speech stopping the backend, the slot, and the ledger's
characters."""

from __future__ import annotations

import base64
import http.client
import json
import time
from urllib.parse import urlsplit

import pytest

from gwproc import Gateway, config_for
from rawhttp import post_and_vanish, post_raw
from stubproc import start_stub, wait_for

KEY, ADMIN = "sk-speech", "sk-admin-speech"
ENV = {"KEY": KEY, "ADMIN_KEY": ADMIN}
AUTH = {"keys": [{"name": "ann", "key_env": "KEY"}], "admin_key_env": "ADMIN_KEY"}
H = {"authorization": f"Bearer {KEY}"}
HA = {"authorization": f"Bearer {ADMIN}"}


@pytest.fixture(scope="module")
def stubs():
    with start_stub("kokoro") as kokoro, start_stub("speaches") as speaches:
        yield kokoro, speaches


@pytest.fixture(scope="module")
def gw(stubs):
    kokoro, speaches = stubs
    cfg = config_for({"k": {"url": kokoro.base, "kind": "openai", "slots": 1},
                      "s": {"url": speaches.base, "kind": "openai", "slots": 2}},
                     {"tts": {"backend": "k", "upstream_model": "kokoro", "capabilities": ["speech"]},
                      "tts-s": {"backend": "s", "upstream_model": "speaches-ai/Kokoro-82M-v1.0-ONNX",
                                "capabilities": ["speech"]},
                      "whisper": {"backend": "s", "upstream_model": "Systran/faster-whisper-tiny.en"}},
                     auth=AUTH)
    with Gateway(cfg, env=ENV) as g:
        wait_for(lambda: all(b["up"] for b in g.admin(HA)["backends"].values()), 10)
        yield g


def _open(gw, body: dict) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    u = urlsplit(gw.url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    conn.request("POST", "/llm/v1/audio/speech", json.dumps(body), {**H, "content-type": "application/json"})
    return conn, conn.getresponse()


@pytest.mark.parametrize("fmt, ctype", [("mp3", "audio/mpeg"), ("wav", "audio/wav"), ("pcm", "audio/pcm"),
                                        ("opus", "audio/opus")])
def test_speech_comes_back_whole_with_its_content_type(gw, stubs, fmt, ctype):
    kokoro, _ = stubs
    conn, resp = _open(gw, {"model": "tts", "input": "Hello there. [stub chunks=4 chunk_bytes=1000]",
                            "voice": "af_heart", "response_format": fmt})
    data = resp.read()
    conn.close()
    assert resp.status == 200 and resp.headers["content-type"].startswith(ctype)
    assert len(data) == 4000 + (44 if fmt == "wav" else 0)
    assert kokoro.requests()[-1]["body"]["model"] == "kokoro"  # upstream_model


def test_audio_is_streamed_as_the_backend_makes_it(gw, stubs):
    kokoro, _ = stubs
    conn, resp = _open(gw, {"model": "tts", "input": "[stub chunks=12 delay_ms=150 chunk_bytes=2000] a long one",
                            "voice": "af_heart"})
    first = resp.read1(65536)
    # the first audio is here while the backend is still making the rest: nothing was collected
    assert first and kokoro.stats()["in_flight"] == 1
    assert resp.headers["x-accel-buffering"] == "no"  # and an nginx in front would not hold it back
    rest = resp.read()
    conn.close()
    assert len(first) + len(rest) == 12 * 2000
    wait_for(lambda: kokoro.stats()["in_flight"] == 0, 2)


def test_speaches_sse_stream_format_is_relayed_as_events(gw):
    status, headers, raw = post_raw(gw.url + "/v1/audio/speech",
                                    {"model": "tts-s", "input": "hi [stub chunks=3 chunk_bytes=10]", "voice": "af_heart",
                                     "stream_format": "sse"}, H)
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    events = [json.loads(line[6:]) for line in raw.decode().split("\n") if line.startswith("data: ")]
    assert [e["type"] for e in events] == ["speech.audio.delta"] * 3 + ["speech.audio.done"]
    assert len(base64.b64decode(events[0]["audio"])) == 10


def test_the_pickers_list_the_speech_models_and_their_backends_voices(gw):
    status, doc = gw.get("/llm/v1/audio/models", H)
    assert status == 200 and [m["id"] for m in doc["models"]] == ["tts", "tts-s"]
    status, doc = gw.get("/llm/v1/audio/voices", H)
    assert status == 200
    ids = [v["id"] for v in doc["voices"]]
    assert "af_heart" in ids and len(ids) == len(set(ids)) and all(v["name"] for v in doc["voices"])
    status, doc = gw.get("/v1/audio/voices?model=tts", H)
    assert status == 200 and doc["voices"]
    status, doc = gw.get("/v1/audio/voices?model=nope", H)
    assert status == 404


def test_bad_input_and_the_backends_refusal(gw):
    status, _, raw = post_raw(gw.url + "/v1/audio/speech", {"model": "tts", "voice": "af_heart"}, H)
    assert status == 400 and json.loads(raw)["error"]["param"] == "input"
    status, _, raw = post_raw(gw.url + "/v1/audio/speech", {"model": "tts", "input": "x", "response_format": "ogg"}, H)
    assert status == 400, raw  # kokoro's 422 (FastAPI's validation) as OpenAI's 400, its message kept
    assert json.loads(raw)["error"]["message"]
    status, _, raw = post_raw(gw.url + "/v1/audio/speech", {"model": "tts", "input": "[stub status=500] x"}, H)
    assert status >= 500 and "'k'" in json.loads(raw)["error"]["message"]


def test_a_client_that_leaves_mid_speech_stops_the_backend_and_frees_the_slot(gw, stubs):
    kokoro, _ = stubs
    before = kokoro.log_text().count("cancelled")
    post_and_vanish(gw.url + "/v1/audio/speech", {"model": "tts", "input": "[stub chunks=200 delay_ms=50] words",
                                                 "voice": "af_heart"},
                    headers=H, after_bytes=20000)
    gone = time.monotonic()
    wait_for(lambda: kokoro.log_text().count("cancelled") == before + 1, 2)
    assert time.monotonic() - gone < 2
    wait_for(lambda: kokoro.stats()["in_flight"] == 0, 2)
    wait_for(lambda: gw.admin(HA)["backends"]["k"]["in_use"] == 0, 2)
    rec = wait_for(lambda: [r for r in gw.access_log() if r["dialect"] == "speech"
                            and r["outcome"] == "cancelled_streaming"], 2)
    assert rec[-1]["status"] == 499


def test_one_slot_one_speaker_and_the_ledger_counts_characters(gw, stubs):
    kokoro, _ = stubs
    kokoro.reset()
    text = "[stub chunks=5 delay_ms=100] twenty-six characters"
    import threading

    statuses = []
    threads = [threading.Thread(target=lambda: statuses.append(
        post_raw(gw.url + "/v1/audio/speech", {"model": "tts", "input": text}, H)[0])) for _ in range(2)]
    for t in threads:
        t.start()
    wait_for(lambda: gw.admin(HA)["backends"]["k"]["queued"] == 1, 10)
    for t in threads:
        t.join(30)
    assert statuses == [200, 200] and kokoro.stats()["max_in_flight"] == 1

    def chars():
        status, doc = gw.get("/admin/usage?model=tts", HA)
        return sum(r["characters"] for r in doc["rows"])

    wait_for(lambda: chars() >= 2 * len(text), 5)
    # metrics per endpoint family: the dialect label
    status, text_metrics = gw.get("/metrics", HA)
    assert status == 200
    assert any(line.startswith("hlf_requests_total{") and 'dialect="speech"' in line and 'outcome="ok"' in line
               for line in text_metrics.splitlines())
