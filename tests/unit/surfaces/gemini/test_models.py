"""models.py: Google's model entries, the two countTokens forms, embedding bodies and answers."""

from __future__ import annotations

import pytest

from homelab_frontend.errors import GatewayError
from homelab_frontend.surfaces.embeddings import vectors_of as embeddings
from homelab_frontend.surfaces.gemini.models import count_request, embed_inputs, model_entry, model_name


def test_a_model_entry():
    """(tests/integration/test_gemini.py reads these with the SDK's models.list / models.get)"""
    entry = model_entry("gemini-2.5-flash", "gemma", 8192)
    assert entry["name"] == "models/gemini-2.5-flash" and entry["inputTokenLimit"] == entry["outputTokenLimit"] == 8192
    assert "gemma" in entry["displayName"] and entry["thinking"] is True
    assert {"generateContent", "streamGenerateContent", "countTokens"} <= set(entry["supportedGenerationMethods"])
    assert "inputTokenLimit" not in model_entry("m", "m", None) and model_entry("m", "m", None)["displayName"] == "m"


def test_model_names_in_paths():
    assert model_name("gemini-2.5-flash") == "gemini-2.5-flash"
    assert model_name("models/qwen2.5:3b") == "qwen2.5:3b"
    with pytest.raises(GatewayError) as info:
        model_name("models/")
    assert info.value.kind == "not_found"


def test_count_tokens_takes_both_forms():
    inner = {"contents": [{"parts": [{"text": "x"}]}]}
    assert count_request(inner) is inner
    assert count_request({"generateContentRequest": inner}) is inner
    assert count_request({"generate_content_request": inner}) is inner


def test_embedding_bodies_and_answers():
    assert embed_inputs({"content": {"parts": [{"text": "a"}, {"text": "b"}]}}, batch=False) == ["a\nb"]
    assert embed_inputs({"requests": [{"content": {"parts": [{"text": "a"}]}}, {"content": {"parts": [{"text": "c"}]}}]},
                        batch=True) == ["a", "c"]
    for body, batch, field in (({}, False, "content"), ({"requests": []}, True, "requests"),
                               ({"content": {"parts": [{"inlineData": {}}]}}, False, "content.parts[0]")):
        with pytest.raises(GatewayError) as info:
            embed_inputs(body, batch)
        assert info.value.param == field
    data = [{"index": 1, "embedding": [0.5]}, {"index": 0, "embedding": [1, 2]}]
    assert embeddings(data, 2) == [[1, 2], [0.5]]
    with pytest.raises(ValueError):
        embeddings([{"index": 0, "embedding": "base64=="}], 1)
    with pytest.raises(ValueError):
        embeddings(data, 3)


def test_a_media_model_lists_no_generation_methods():
    from homelab_frontend.surfaces.gemini.models import model_entry as entry

    for caps in (("rerank",), ("speech",), ("transcription",), ("image",)):
        assert entry("m", "m", None, caps)["supportedGenerationMethods"] == []
    assert "generateContent" in entry("m", "m", None, ("completion", "speech"))["supportedGenerationMethods"]
