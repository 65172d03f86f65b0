"""fields.py: a field under both of Google's spellings."""

from __future__ import annotations

from homelab_frontend.surfaces.gemini.fields import get


def test_camel_case_first_then_snake_case():
    assert get({"includeThoughts": True, "include_thoughts": False}, "includeThoughts") is True
    assert get({"include_thoughts": False}, "includeThoughts") is False
    assert get({"parameters_json_schema": {}}, "parametersJsonSchema") == {}
    assert get({"text": "a"}, "text") == "a" and get({}, "topK") is None
