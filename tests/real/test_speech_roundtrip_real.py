"""Text to speech and back through one gateway, against real engines on both sides: Piper
(local-tts-studio's OpenAI-compatible /v1/audio/speech, tests/piperproc.py) speaks a sentence,
and whisper.cpp's whisper-server (tests/whisperproc.py) hears what it said.

What is proved: the gateway relays a real TTS server's audio intact (a WAV whose header and length
are Piper's own, with its content type), and that audio is speech: Whisper transcribes it back to
the sentence that was sent. local-tts-studio renders the whole answer before sending it, so the
streaming of speech chunk by chunk is proved against the stubs (tests/integration/).
"""

from __future__ import annotations

import json
import re
import struct
import urllib.request

import pytest

from gwproc import Gateway, config_for
from piperproc import MODEL as TTS, SERVED as TTS_SERVED, PiperServer, require_piper
from stubproc import wait_for
from support.media_client import form, upload
from whisperproc import MODEL as STT, UPSTREAM as STT_SERVED, WhisperServer, require_whisper

pytestmark = [pytest.mark.xdist_group("whisper"), pytest.mark.timeout(600)]

SENTENCE = "Please send the report to the office tomorrow morning."


def words(text: str) -> list[str]:
    return re.findall(r"[a-z]+", text.lower())


@pytest.fixture(scope="module")
def servers():
    require_piper()
    require_whisper()
    with PiperServer() as piper, WhisperServer(threads=2) as whisper:
        yield piper, whisper


@pytest.fixture(scope="module")
def gw(servers):
    piper, whisper = servers
    cfg = config_for({"piper": {"url": piper.base, "kind": "openai", "slots": 1, "health_interval_s": 1},
                      "whisper": {"url": whisper.url, "kind": "whispercpp", "slots": 1, "health_interval_s": 1}},
                     {TTS: {"backend": "piper", "upstream_model": TTS_SERVED, "capabilities": ["speech"]},
                      STT: {"backend": "whisper", "upstream_model": STT_SERVED}})
    with Gateway(cfg) as g:
        wait_for(lambda: all(b["up"] for b in g.admin()["backends"].values()), 30)
        yield g


def test_piper_speaks_through_the_gateway_and_whisper_hears_it_back(gw, servers):
    piper, _ = servers
    req = urllib.request.Request(gw.url + "/v1/audio/speech", method="POST",
                                 data=json.dumps({"model": TTS, "input": SENTENCE, "voice": "alloy",
                                                  "response_format": "wav"}).encode(),
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        ctype, audio = r.headers["content-type"], r.read()
    assert ctype == "audio/wav"
    assert audio[:4] == b"RIFF" and audio[8:12] == b"WAVE"
    assert struct.unpack_from("<I", audio, 24)[0] == 22050  # Piper's joe-medium rate, as Piper wrote it
    assert len(audio) > 22050  # over half a second of 22 kHz 16-bit speech
    body, ctype = form([("model", STT), ("response_format", "json")], [("file", "piper.wav", audio, "audio/wav")])
    status, _, answer = upload(gw.url + "/v1/audio/transcriptions", body, ctype, timeout=300)
    assert status == 200, answer
    heard, said = words(json.loads(answer)["text"]), words(SENTENCE)
    assert len([w for w in said if w not in heard]) <= 1, f"whisper heard {heard!r} for {said!r}"
