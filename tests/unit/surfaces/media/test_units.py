"""What a relayed call cost, read off its answer (surfaces/media/units.py)."""

from __future__ import annotations

import io
import wave

import pytest

from homelab_frontend.surfaces.media.units import answer_units, wav_seconds


def test_rerank_tokens_from_vllm_and_llamacpp_usage():
    assert answer_units("rerank", {"usage": {"total_tokens": 31}, "results": []}) == ({}, 31, None)  # vLLM
    assert answer_units("rerank", {"usage": {"prompt_tokens": 30, "total_tokens": 30}}) == ({}, 30, None)  # llama.cpp
    assert answer_units("score", {"usage": {"prompt_tokens": 5, "total_tokens": 5}}) == ({}, 5, None)


def test_transcription_seconds_from_verbose_json_or_usage():
    assert answer_units("transcriptions", {"text": "hi", "duration": 3.25}) == ({"audio_seconds": 3.25}, None, None)
    assert answer_units("translations", {"text": "hi", "usage": {"type": "duration", "seconds": 7}}) == \
        ({"audio_seconds": 7.0}, None, None)
    # token-billed transcribers (gpt-4o-transcribe's shape)
    assert answer_units("transcriptions", {"text": "hi", "usage": {"type": "tokens", "input_tokens": 40,
                                                                   "output_tokens": 3}}) == ({}, 40, 3)


def test_images_made():
    assert answer_units("image_generations", {"data": [{"b64_json": "x"}, {"b64_json": "y"}]}) == ({"images": 2.0}, None, None)
    assert answer_units("image_edits", {"data": []}) == ({"images": 0.0}, None, None)


@pytest.mark.parametrize("doc", [{"usage": "x"}, {"usage": {"total_tokens": -1}}, {"usage": {"total_tokens": True}},
                                 {"duration": "long"}, {"data": "many"}])
def test_nonsense_counts_nothing(doc):
    for endpoint in ("rerank", "transcriptions", "image_generations"):
        units, tin, tout = answer_units(endpoint, doc)
        assert tin is None and tout is None and all(isinstance(v, float) for v in units.values())
        assert "audio_seconds" not in units


def test_wav_seconds_from_the_files_own_header():
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(b"\0\0" * 16000 * 3)
    data = buf.getvalue()
    assert wav_seconds(data[:64], len(data)) == pytest.approx(3.0)
    assert wav_seconds(b"ID3" + data[3:64], len(data)) is None  # an mp3 says nothing
    assert wav_seconds(data[:20], len(data)) is None
