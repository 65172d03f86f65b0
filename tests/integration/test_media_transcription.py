"""Speech to text through the gateway, over real sockets, against the stub's whisper.cpp,
speaches and vLLM flavours (stub/audio.py follows their servers): each response format with its
content type, whisper.cpp's /inference and its translate flag, a server without /v1/models kept
up by its health path, the upload streamed to the backend as it arrives (the backend counts
bytes before the client has sent them all), the upload limit answered 413 in OpenAI's shape,
bad forms, a client leaving mid-upload and mid-transcription judged by the stub's log, the slot
held and freed, and the ledger's audio seconds."""

from __future__ import annotations

import json
import threading

import pytest

from gwproc import Gateway, config_for
from stubproc import start_stub, wait_for
from support.media_client import form, upload, upload_and_vanish, wav

KEY, SUE, ADMIN = "sk-stt", "sk-sue-stt", "sk-admin-stt"
ENV = {"KEY": KEY, "SUE_KEY": SUE, "ADMIN_KEY": ADMIN}
AUTH = {"keys": [{"name": "sam", "key_env": "KEY"}, {"name": "sue", "key_env": "SUE_KEY", "models": ["stt-*"]}],
        "admin_key_env": "ADMIN_KEY"}
H = {"authorization": f"Bearer {KEY}"}
HA = {"authorization": f"Bearer {ADMIN}"}
LIMIT = 2 * 1024 * 1024
AUDIO = wav(2.0)  # 64 kB, 2 s


@pytest.fixture(scope="module")
def stubs():
    with start_stub("whispercpp") as whisper, start_stub("speaches") as speaches, \
            start_stub("vllm", "--model", "openai/whisper-tiny") as vllm:
        yield whisper, speaches, vllm


@pytest.fixture(scope="module")
def gw(stubs):
    whisper, speaches, vllm = stubs
    cfg = config_for({"w": {"url": whisper.url, "kind": "whispercpp", "slots": 1, "health_interval_s": 1},
                      "s": {"url": speaches.base, "kind": "openai", "slots": 2},
                      "v": {"url": vllm.base, "kind": "vllm", "slots": 2}},
                     {"whisper-1": {"backend": "w", "upstream_model": "ggml-tiny.en"},
                      "stt-s": {"backend": "s", "upstream_model": "Systran/faster-whisper-tiny.en"},
                      "stt-v": {"backend": "v", "upstream_model": "openai/whisper-tiny"}},
                     auth=AUTH, limits={"max_upload_bytes": LIMIT})
    with Gateway(cfg, env=ENV) as g:
        wait_for(lambda: all(b["up"] for b in g.admin(HA)["backends"].values()), 10)
        yield g


def _stt(gw, fields, path="/llm/v1/audio/transcriptions", audio=AUDIO, files_first=False, headers=H, **kw):
    body, ctype = form(fields, [("file", "speech.wav", audio, "audio/wav")], files_first=files_first)
    return upload(gw.url + path, body, ctype, headers=headers, **kw)


def test_a_whisper_server_without_v1_models_is_up_by_its_health_path(gw):
    backends = gw.admin(HA)["backends"]
    assert backends["w"]["up"] is True


@pytest.mark.parametrize("fmt, ctype, check", [
    ("json", "application/json", lambda b: json.loads(b)["text"]),
    ("text", "text/html", lambda b: b.strip() and not b.startswith(b"{")),
    ("srt", "application/x-subrip", lambda b: b.startswith(b"1\n00:00:00,000 --> ")),
    ("vtt", "text/vtt", lambda b: b.startswith(b"WEBVTT")),
    ("verbose_json", "application/json", lambda b: json.loads(b)["segments"] and json.loads(b)["duration"] == 2.0),
])
def test_each_response_format_comes_back_with_whisper_cpps_content_type(gw, stubs, fmt, ctype, check):
    whisper, _, _ = stubs
    status, headers, body = _stt(gw, [("model", "whisper-1"), ("response_format", fmt), ("language", "en"),
                                      ("temperature", "0"), ("timestamp_granularities[]", "segment")])
    assert status == 200, body
    assert headers["content-type"].startswith(ctype) and check(body)
    sent = whisper.requests()[-1]["body"]
    assert sent["model"] == "ggml-tiny.en" and sent["response_format"] == fmt
    assert sent["files"]["file"][0]["bytes"] == len(AUDIO)  # the file went whole, byte for byte


def test_translations_go_to_inference_with_its_translate_flag(gw, stubs):
    whisper, _, _ = stubs
    status, _, body = _stt(gw, [("model", "whisper-1")], path="/v1/audio/translations")
    assert status == 200 and json.loads(body)["text"]
    assert whisper.requests()[-1]["body"]["translate"] == "true"


def test_a_model_field_after_a_small_file_is_still_found(gw, stubs):
    whisper, _, _ = stubs
    status, _, body = _stt(gw, [("model", "whisper-1"), ("response_format", "json")], files_first=True)
    assert status == 200, body
    assert whisper.requests()[-1]["body"]["model"] == "ggml-tiny.en"


def test_a_big_file_sent_before_the_model_is_routed_by_the_model_after_it(gw, stubs):
    """OpenAI's JS SDK writes `file` before `model`: a file larger than the form head's bound
    (1 MiB) goes to disk while the model is looked for, then to the backend whole."""
    whisper, _, _ = stubs
    big = wav(50.0)  # 1.6 MB
    status, _, body = _stt(gw, [("model", "whisper-1"), ("response_format", "verbose_json")], audio=big,
                           files_first=True)
    assert status == 200, body
    assert json.loads(body)["duration"] == 50.0
    sent = whisper.requests()[-1]["body"]
    assert sent["model"] == "ggml-tiny.en" and sent["files"]["file"][0]["bytes"] == len(big)


def test_openai_style_servers_speaches_and_vllm_and_their_streams(gw):
    status, headers, body = _stt(gw, [("model", "stt-s"), ("response_format", "json")])
    assert status == 200 and json.loads(body)["text"]
    status, headers, body = _stt(gw, [("model", "stt-s"), ("stream", "true")])
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    events = [json.loads(x[6:]) for x in body.decode().split("\n") if x.startswith("data: ")]
    assert events[-1]["type"] == "transcript.text.done" and events[0]["type"] == "transcript.text.delta"
    status, headers, body = _stt(gw, [("model", "stt-v"), ("stream", "true"), ("stream_include_usage", "true")])
    assert status == 200 and body.rstrip().endswith(b"data: [DONE]")
    status, _, body = _stt(gw, [("model", "stt-v"), ("response_format", "srt")])
    assert status == 400 and "response_format" in json.loads(body)["error"]["message"]  # vLLM's own refusal


def test_the_upload_is_streamed_to_the_backend_as_it_arrives(gw, stubs):
    whisper, _, _ = stubs
    big = wav(40.0)  # 1.28 MB
    whisper.reset()
    seen = []

    def between(sent: int) -> None:
        if sent == 640 * 1024:  # half of it sent: the backend must already be reading it
            seen.append(wait_for(lambda: whisper.stats()["upload_bytes"] >= 256 * 1024, 10))

    status, _, body = _stt(gw, [("model", "whisper-1"), ("response_format", "verbose_json")], audio=big,
                           piece=64 * 1024, between=between)
    assert status == 200, body
    assert seen, "the test never paused half-way"
    assert json.loads(body)["duration"] == 40.0


def test_the_upload_limit_is_a_413_in_openais_shape_said_or_counted(gw, stubs):
    whisper, _, _ = stubs
    big = b"\0" * (LIMIT + 1024)
    status, _, body = _stt(gw, [("model", "whisper-1")], audio=big)
    err = json.loads(body)["error"]
    assert status == 413 and err["code"] == "request_too_large" and str(LIMIT) in err["message"]
    before = whisper.log_text().count("cancelled")
    status, _, body = _stt(gw, [("model", "whisper-1")], audio=big, chunked=True)
    assert status == 413 and json.loads(body)["error"]["code"] == "request_too_large"
    # the backend got the part that was sent and saw it end; it stays up (the client's fault)
    wait_for(lambda: whisper.log_text().count("cancelled") == before + 1, 2)
    wait_for(lambda: gw.admin(HA)["backends"]["w"]["in_use"] == 0, 2)
    assert gw.admin(HA)["backends"]["w"]["up"] is True


def test_bad_forms_say_what_is_wrong(gw):
    body, ctype = form([("model", "whisper-1")])
    status, _, raw = upload(gw.url + "/v1/audio/transcriptions", body, ctype, headers=H)
    assert status == 400 and json.loads(raw)["error"]["param"] == "file"
    status, _, raw = upload(gw.url + "/v1/audio/transcriptions", b'{"model": "whisper-1"}', "application/json",
                            headers=H)
    assert status == 400 and "multipart/form-data" in json.loads(raw)["error"]["message"]
    status, _, raw = _stt(gw, [("model", "nope")])
    assert status == 404 and "whisper-1" in json.loads(raw)["error"]["message"]
    status, _, raw = _stt(gw, [("language", "en")])
    assert status == 400 and json.loads(raw)["error"]["param"] == "model"
    status, _, raw = _stt(gw, [("model", "whisper-1")], audio=b"ID3 not a wav")
    assert status == 400 and "failed to read audio data" in json.loads(raw)["error"]["message"]


def test_a_keys_model_list_applies_before_the_file_is_read(gw, stubs):
    whisper, _, _ = stubs
    before = len(whisper.requests())
    status, _, raw = _stt(gw, [("model", "whisper-1")], headers={"authorization": f"Bearer {SUE}"})
    assert status == 403 and json.loads(raw)["error"]["param"] == "model"
    status, _, raw = _stt(gw, [("model", "whisper-1")], headers={"authorization": "Bearer sk-nobody"})
    assert status == 401
    assert len(whisper.requests()) == before  # nothing reached the backend
    status, _, raw = _stt(gw, [("model", "stt-s")], headers={"authorization": f"Bearer {SUE}"})
    assert status == 200, raw


def test_a_client_that_leaves_mid_upload_stops_the_backend_and_frees_the_slot(gw, stubs):
    whisper, _, _ = stubs
    whisper.reset()
    before = whisper.log_text().count("cancelled")
    body, ctype = form([("model", "whisper-1")], [("file", "a.wav", wav(30.0), "audio/wav")])
    upload_and_vanish(gw.url + "/v1/audio/transcriptions", body, ctype, send=len(body) // 2, headers=H,
                      when=lambda: whisper.stats()["upload_bytes"] > 0)
    wait_for(lambda: whisper.log_text().count("cancelled") == before + 1, 2)
    wait_for(lambda: whisper.stats()["in_flight"] == 0, 2)
    wait_for(lambda: gw.admin(HA)["backends"]["w"]["in_use"] == 0, 2)
    rec = wait_for(lambda: [r for r in gw.access_log() if r["dialect"] == "transcription"
                            and r["outcome"].startswith("cancelled")], 2)
    assert rec[-1]["status"] == 499


def test_a_client_that_leaves_mid_transcription_stops_it(gw, stubs):
    whisper, _, _ = stubs
    before = whisper.log_text().count("cancelled")
    uploads = whisper.log_text().count("upload bytes=")
    body, ctype = form([("model", "whisper-1"), ("prompt", "[stub delay_ms=400 chunks=10]")],
                       [("file", "a.wav", AUDIO, "audio/wav")])
    # the whole upload is in the backend's hands and it is transcribing: then the client goes
    upload_and_vanish(gw.url + "/v1/audio/transcriptions", body, ctype, send=len(body), headers=H,
                      when=lambda: whisper.log_text().count("upload bytes=") == uploads + 1)
    wait_for(lambda: whisper.log_text().count("cancelled") == before + 1, 2)
    wait_for(lambda: gw.admin(HA)["backends"]["w"]["in_use"] == 0, 2)


def test_one_slot_queues_the_second_and_the_ledger_counts_audio_seconds(gw, stubs):
    whisper, _, _ = stubs
    whisper.reset()

    def seconds() -> float:
        status, doc = gw.get("/admin/usage?model=whisper-1", HA)
        return sum(r["audio_seconds"] for r in doc["rows"])

    before = seconds()
    statuses = []
    fields = [("model", "whisper-1"), ("response_format", "verbose_json"), ("prompt", "[stub delay_ms=200]")]
    threads = [threading.Thread(target=lambda: statuses.append(_stt(gw, fields)[0])) for _ in range(2)]
    for t in threads:
        t.start()
    wait_for(lambda: gw.admin(HA)["backends"]["w"]["queued"] == 1, 10)
    for t in threads:
        t.join(30)
    assert statuses == [200, 200] and whisper.stats()["max_in_flight"] == 1
    wait_for(lambda: seconds() == pytest.approx(before + 4.0), 5)
    # a format that says no duration (text): the WAV's own header counts it
    _stt(gw, [("model", "whisper-1"), ("response_format", "text")])
    wait_for(lambda: seconds() == pytest.approx(before + 6.0, abs=0.01), 5)
