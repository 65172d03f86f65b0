"""The relayed endpoints' own checks (surfaces/media/handler.py): documents, and voices in
every shape the TTS servers answer."""

from __future__ import annotations

import pytest

from homelab_frontend.errors import GatewayError
from homelab_frontend.surfaces.media.handler import _documents, _voice_list


def test_voices_from_kokoro_speaches_and_lists():
    assert _voice_list({"voices": ["af_bella"]}) == [{"id": "af_bella", "name": "af_bella"}]
    assert _voice_list({"voices": [{"voice_id": "v1", "name": "Vee"}]}) == [{"id": "v1", "name": "Vee"}]
    assert _voice_list({"data": [{"id": "x"}]}) == [{"id": "x", "name": "x"}]
    assert _voice_list(["a", 3, {"nope": 1}]) == [{"id": "a", "name": "a"}]
    assert _voice_list("garbage") == [] and _voice_list({"voices": "x"}) == []


def test_documents_strings_or_text_objects():
    assert _documents({"documents": ["a", {"text": "b"}]}) == ["a", {"text": "b"}]
    for doc, param in (({}, "documents"), ({"documents": []}, "documents"), ({"documents": "a"}, "documents"),
                       ({"documents": ["a", {"txt": "b"}]}, "documents[1]"), ({"documents": [1]}, "documents[0]")):
        with pytest.raises(GatewayError) as err:
            _documents(doc)
        assert err.value.param == param

