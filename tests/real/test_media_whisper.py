"""Speech to text through the gateway against whisper.cpp's real `whisper-server` (Whisper
tiny.en, tests/whisperproc.py), hearing espeak-ng's speech: the gateway finds the server up by
its /health (it has no /v1/models), relays the upload to /inference and each format back with
the server's own content type, byte for byte what the server answers directly; the ledger counts
the seconds the server reports; a client that leaves mid-inference makes the server abort it (its
own log says so) and frees the slot."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gwproc import Gateway
from stubproc import wait_for
from support.media_client import form, upload, upload_and_vanish
from whisperproc import MODEL, speak, whisper_config, whisper_server  # noqa: F401 (the fixture)

SENTENCE = "The quick brown fox jumps over the lazy dog."


@pytest.fixture(scope="module")
def fox(tmp_path_factory) -> bytes:
    return speak(SENTENCE, Path(tmp_path_factory.mktemp("speech")) / "fox.wav").read_bytes()


@pytest.fixture(scope="module")
def gw(whisper_server):  # noqa: F811
    with Gateway(whisper_config(whisper_server.url)) as g:
        wait_for(lambda: g.admin()["backends"]["whisper"]["up"], 30)
        yield g


def _form(audio: bytes, **fields: str):
    return form([("model", MODEL), *fields.items()], [("file", "fox.wav", audio, "audio/wav")])


def test_whisper_hears_the_sentence_through_the_gateway_in_every_format_the_server_has(gw, whisper_server, fox):  # noqa: F811
    body, ctype = _form(fox, response_format="json")
    status, headers, raw = upload(gw.url + "/llm/v1/audio/transcriptions", body, ctype, timeout=300)
    assert status == 200, raw
    text = json.loads(raw)["text"].lower()
    assert "quick" in text and "lazy" in text
    for fmt in ("srt", "verbose_json"):
        body, ctype = _form(fox, response_format=fmt)
        through = upload(gw.url + "/v1/audio/transcriptions", body, ctype, timeout=300)
        direct = upload(whisper_server.url + "/inference", body, ctype, timeout=300)
        assert through[0] == direct[0] == 200
        assert through[1]["content-type"] == direct[1]["content-type"]
        assert through[2] == direct[2]  # tiny.en at temperature 0 is deterministic: the same bytes
    doc = json.loads(through[2])
    assert doc["duration"] == pytest.approx(len(fox) / (22050 * 2), abs=0.1)

    def seconds() -> float:
        return sum(r["audio_seconds"] for r in gw.get(f"/admin/usage?model={MODEL}")[1]["rows"])

    wait_for(lambda: seconds() >= doc["duration"] - 0.01, 5)


def test_a_client_that_leaves_mid_inference_makes_whisper_abort_it(gw, whisper_server, tmp_path):  # noqa: F811
    long = speak(" ".join([SENTENCE] * 12), tmp_path / "long.wav").read_bytes()  # about 35 s of speech
    # its stderr (unbuffered) says when it starts on a file; "Received request" goes to a
    # buffered stdout, which a file may hold back for a long while
    def started() -> int:
        return whisper_server.log_text().count("processing '")

    before, aborted = started(), whisper_server.aborted()
    body, ctype = _form(long)
    upload_and_vanish(gw.url + "/v1/audio/transcriptions", body, ctype, send=len(body),
                      when=lambda: started() == before + 1, timeout_s=30)
    wait_for(lambda: whisper_server.aborted() == aborted + 1, 60, 0.1)
    wait_for(lambda: gw.admin()["backends"]["whisper"]["in_use"] == 0, 5)
    rec = wait_for(lambda: [r for r in gw.access_log() if r["dialect"] == "transcription"
                            and r["outcome"].startswith("cancelled")], 5)
    assert rec[-1]["status"] == 499
