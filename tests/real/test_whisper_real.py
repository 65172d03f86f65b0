"""Speech to text through the gateway against whisper.cpp's real whisper-server (Whisper tiny.en,
tests/whisperproc.py), hearing real speech: espeak-ng says a sentence into a WAV file.

What is proved, by the server's own evidence where it matters:
- the transcription is right: the sentence espeak-ng spoke comes back, word for word but for
  punctuation and case (tiny.en hears this one exactly; the test allows one word of slack);
- each response format is whisper-server's own, relayed with its content type, through both
  /v1/audio/transcriptions and /llm/v1/...; the same bytes the server gives a direct client
  (but for verbose_json's timings, which vary with load);
- translations reach whisper.cpp's one endpoint as well (an English model answers in English);
- one slot: a second request waits in the gateway while whisper-server decodes the first, and
  the ledger counts the audio seconds whisper-server itself reports (verbose_json's duration);
- a client that leaves mid-transcription stops it: whisper-server itself logs that it aborted
  ("client disconnected, aborted processing"), the gateway frees the slot, and the next request
  is answered.
"""

from __future__ import annotations

import json
import re
import threading

import pytest

from gwproc import Gateway
from stubproc import wait_for
from support.media_client import form, upload, upload_and_vanish
from whisperproc import MODEL, WhisperServer, require_whisper, speak, whisper_config

pytestmark = [pytest.mark.xdist_group("whisper"), pytest.mark.timeout(600)]

SENTENCE = "Please send the report to the office tomorrow morning."


def words(text: str) -> list[str]:
    return re.findall(r"[a-z]+", text.lower())


@pytest.fixture(scope="module")
def whisper():
    require_whisper()
    with WhisperServer(threads=2) as server:
        print(f"whisper-server ready in {server.start_seconds:.2f} s")
        yield server


@pytest.fixture(scope="module")
def gw(whisper):
    with Gateway(whisper_config(whisper.url)) as g:
        wait_for(lambda: all(b["up"] for b in g.admin()["backends"].values()), 30)
        yield g


@pytest.fixture(scope="module")
def speech(tmp_path_factory):
    return speak(SENTENCE, tmp_path_factory.mktemp("speech") / "sentence.wav").read_bytes()


def _transcribe(url: str, audio: bytes, fields: list[tuple[str, str]], path: str = "/v1/audio/transcriptions"):
    body, ctype = form(fields, [("file", "sentence.wav", audio, "audio/wav")])
    return upload(url + path, body, ctype, timeout=300)


def test_the_real_whisper_hears_espeaks_sentence_through_the_gateway(gw, speech):
    status, headers, body = _transcribe(gw.url, speech, [("model", MODEL), ("response_format", "json")])
    assert status == 200, body
    assert headers["content-type"].startswith("application/json")
    heard = words(json.loads(body)["text"])
    said = words(SENTENCE)
    missed = [w for w in said if w not in heard]
    assert len(missed) <= 1, f"whisper heard {heard!r} for {said!r}"


@pytest.mark.parametrize("fmt, ctype", [("text", "text/html; charset=utf-8"), ("srt", "application/x-subrip"),
                                        ("vtt", "text/vtt"), ("verbose_json", "application/json")])
def test_each_format_is_whisper_servers_own_with_its_content_type(gw, whisper, speech, fmt, ctype):
    fields = [("model", MODEL), ("response_format", fmt), ("temperature", "0")]
    status, headers, body = _transcribe(gw.url, speech, fields, path="/llm/v1/audio/transcriptions")
    assert status == 200, body
    assert headers["content-type"] == ctype
    d_status, d_headers, direct = _transcribe(whisper.url, speech, fields, path="/inference")
    assert d_status == 200 and d_headers["content-type"] == ctype
    if fmt == "verbose_json":
        got, want = json.loads(body), json.loads(direct)
        assert got["text"] == want["text"] and got["task"] == "transcribe"
        assert got["duration"] == pytest.approx(want["duration"]) and got["duration"] > 2
        assert [s["text"] for s in got["segments"]] == [s["text"] for s in want["segments"]]
    else:
        assert body == direct  # greedy decoding at temperature 0: the same answer, relayed byte for byte
    if fmt == "vtt":
        assert body.startswith(b"WEBVTT")
    if fmt == "srt":
        assert body.startswith(b"1\n00:00:00,000 --> ")


def test_a_translation_reaches_whisper_cpps_one_endpoint(gw, speech):
    status, _, body = _transcribe(gw.url, speech, [("model", MODEL)], path="/v1/audio/translations")
    assert status == 200, body
    assert "report" in words(json.loads(body)["text"])


def test_a_client_gone_mid_transcription_is_aborted_by_whisper_itself(gw, whisper, tmp_path, speech):
    long_audio = speak(" ".join([SENTENCE] * 12), tmp_path / "long.wav").read_bytes()  # ~40 s of speech
    body, ctype = form([("model", MODEL), ("response_format", "json")],
                       [("file", "long.wav", long_audio, "audio/wav")])
    received, aborted = whisper.received(), whisper.aborted()
    # Gone once whisper-server has taken the whole upload in and begun decoding it (its own log).
    upload_and_vanish(gw.url + "/v1/audio/transcriptions", body, ctype, send=len(body),
                      when=lambda: whisper.received() > received, timeout_s=120)
    wait_for(lambda: whisper.aborted() > aborted, timeout=120, interval=0.25)
    assert whisper.aborted() == aborted + 1
    wait_for(lambda: all(b["in_use"] == 0 for b in gw.admin()["backends"].values()), timeout=30)
    status, _, answer = _transcribe(gw.url, speech, [("model", MODEL)])
    assert status == 200 and "report" in words(json.loads(answer)["text"])


def test_one_slot_queues_the_second_and_the_ledger_counts_whispers_own_duration(gw, whisper, speech):
    def seconds() -> float:
        status, doc = gw.get(f"/admin/usage?model={MODEL}")
        assert status == 200, doc
        return sum(r.get("audio_seconds", 0) for r in doc["rows"])

    before = seconds()
    answers: list[tuple[int, bytes]] = []
    fields = [("model", MODEL), ("response_format", "verbose_json")]
    threads = [threading.Thread(target=lambda: answers.append(_transcribe(gw.url, speech, fields)[::2]))
               for _ in range(2)]
    for t in threads:
        t.start()
    # the gateway holds the second back while whisper-server decodes the first (one slot)
    wait_for(lambda: gw.admin()["backends"]["whisper"]["queued"] == 1, timeout=60, interval=0.05)
    for t in threads:
        t.join(300)
    assert [s for s, _ in answers] == [200, 200]
    durations = [json.loads(b)["duration"] for _, b in answers]
    wait_for(lambda: seconds() == pytest.approx(before + sum(durations), abs=0.01), timeout=10)
