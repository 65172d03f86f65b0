"""Google's Schema -> JSON Schema (surfaces/gemini/schema.py): pure."""

from __future__ import annotations

import pytest

from homelab_frontend.surfaces.gemini.schema import to_json_schema


def test_schema_normalisation_touches_keywords_only():
    google = {"type": "OBJECT", "propertyOrdering": ["type"], "properties": {
        "type": {"type": "STRING", "format": "enum", "enum": ["a", "b"], "nullable": True},
        "min_items": {"type": "ARRAY", "items": {"type": "INTEGER"}, "max_items": 3, "example": [1]},
        "either": {"any_of": [{"type": "STRING"}, {"type": "NUMBER"}], "nullable": True},
        "free": {"type": "TYPE_UNSPECIFIED", "default": {"type": "OBJECT"}}}}
    assert to_json_schema(google) == {"type": "object", "properties": {
        "type": {"type": ["string", "null"], "enum": ["a", "b", None]},
        "min_items": {"type": "array", "items": {"type": "integer"}, "maxItems": 3},
        "either": {"anyOf": [{"type": "string"}, {"type": "number"}, {"type": "null"}]},
        "free": {"default": {"type": "OBJECT"}}}}
    js = {"type": "object", "$defs": {"X": {"type": "STRING"}}, "properties": {"x": {"$ref": "#/$defs/X"}}, "additionalProperties": False}
    assert to_json_schema(js) == {"type": "object", "$defs": {"X": {"type": "string"}}, "properties": {"x": {"$ref": "#/$defs/X"}},
                                  "additionalProperties": False}


@pytest.mark.parametrize("google,json_schema", [
    ({"type": "STRING"}, {"type": "string"}),
    ({"type": "string"}, {"type": "string"}),  # already JSON Schema: kept
    ({"type": ["STRING", "NULL"]}, {"type": ["string", "null"]}),
    ({"type": "TYPE_UNSPECIFIED", "description": "d"}, {"description": "d"}),
    ({"type": "Custom"}, {"type": "Custom"}),  # not one of Google's names: left for the upstream to judge
])
def test_type_names_are_lower_cased_only_when_they_are_googles(google, json_schema):
    assert to_json_schema(google) == json_schema


def test_nullable_adds_null_once_and_only_when_true():
    assert to_json_schema({"type": ["STRING", "NULL"], "nullable": True}) == {"type": ["string", "null"]}
    assert to_json_schema({"type": "NULL", "nullable": True}) == {"type": "null"}
    assert to_json_schema({"type": "STRING", "nullable": False}) == {"type": "string"}
    assert to_json_schema({"enum": ["a", None], "type": "STRING", "nullable": True}) == {
        "enum": ["a", None], "type": ["string", "null"]}
    either = {"anyOf": [{"type": "STRING"}, {"type": "NULL"}], "nullable": True}
    assert to_json_schema(either) == {"anyOf": [{"type": "string"}, {"type": "null"}]}


def test_nested_schemas_are_rewritten_wherever_json_schema_puts_a_schema():
    google = {"type": "ARRAY", "prefix_items": [{"type": "INTEGER"}],
              "items": {"type": "OBJECT", "additional_properties": {"type": "BOOLEAN"}},
              "not": {"type": "NUMBER", "multiple_of": 2}, "definitions": {"D": {"min_length": 1}}}
    assert to_json_schema(google) == {"type": "array", "prefixItems": [{"type": "integer"}],
                                      "items": {"type": "object", "additionalProperties": {"type": "boolean"}},
                                      "not": {"type": "number", "multipleOf": 2}, "definitions": {"D": {"minLength": 1}}}


def test_values_under_enum_const_default_and_examples_stay_as_sent():
    schema = {"type": "OBJECT", "const": {"type": "OBJECT", "nullable": True},
              "examples": [{"min_items": 1}], "enum": ["OBJECT", "TYPE_UNSPECIFIED"]}
    assert to_json_schema(schema) == {"type": "object", "const": {"type": "OBJECT", "nullable": True},
                                      "examples": [{"min_items": 1}], "enum": ["OBJECT", "TYPE_UNSPECIFIED"]}


@pytest.mark.parametrize("schema", [True, False, None, "STRING", 3])
def test_a_schema_that_is_not_an_object_is_passed_on(schema):
    assert to_json_schema(schema) == schema
