"""fields.py: both spellings, typed accessors whose errors name the field."""

from __future__ import annotations

import pytest

from homelab_frontend.errors import GatewayError
from homelab_frontend.surfaces.gemini.fields import as_list, as_obj, get, kind_of


def test_camel_case_first_then_snake_case():
    assert get({"includeThoughts": True, "include_thoughts": False}, "includeThoughts") is True
    assert get({"include_thoughts": False}, "includeThoughts") is False
    assert get({"parameters_json_schema": {}}, "parametersJsonSchema") == {}
    assert get({"text": "a"}, "text") == "a" and get({}, "topK") is None


def test_accessors_name_the_field():
    assert as_obj({}, "x") == {} and as_list([], "x") == []
    with pytest.raises(GatewayError) as e:
        as_obj([1], "generationConfig")
    assert e.value.param == "generationConfig" and e.value.message == "generationConfig: expected an object, got a list"
    with pytest.raises(GatewayError) as e:
        as_list("s", "contents")
    assert e.value.message == "contents: expected a list, got a string"
    assert [kind_of(v) for v in (None, True, 1, 1.5, "s", [], {})] == [
        "null", "a boolean", "a number", "a number", "a string", "a list", "an object"]
