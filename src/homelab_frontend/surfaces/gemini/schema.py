"""Google's Schema (the OpenAPI subset in `parameters` and `responseSchema`) -> JSON Schema.

Pure. Google clients send schema types upper-case (`OBJECT`, `STRING`, in `parameters`,
`responseSchema` and even `parametersJsonSchema` / `responseJsonSchema`), keyword names in
snake_case when the Python SDK passes a dict through (`max_items`, `any_of`), `nullable: true`
instead of a null type, and Google-only keywords (`propertyOrdering`, `format: "enum"`). vLLM's
guided decoding and the chat templates take JSON Schema only, so every schema the surface passes
on goes through `to_json_schema`:

* `type` values are lower-cased when they are one of Google's type names; `TYPE_UNSPECIFIED` is
  dropped (no constraint); a list of types is lower-cased item by item.
* `nullable: true` becomes a `"null"` member of `type` (or of `anyOf`, and of `enum` when there is
  one); `nullable` is dropped.
* snake_case keyword names become JSON Schema's camelCase (`min_items` -> `minItems`).
* `propertyOrdering`, `example` and `format: "enum"` are dropped (annotations with no JSON Schema
  meaning; `example` is not the JSON Schema `examples`).

Only keyword positions are rewritten: the names inside `properties`, `$defs` / `definitions`
and every value under `enum`, `const`, `default` and `examples` stay exactly as sent (a
property may well be called `type` or `min_items`). Anything else is kept as it is.
"""

from __future__ import annotations

from typing import Any

_TYPES = {"OBJECT": "object", "STRING": "string", "NUMBER": "number", "INTEGER": "integer",
          "BOOLEAN": "boolean", "ARRAY": "array", "NULL": "null"}
_KEYWORDS = {
    "any_of": "anyOf", "one_of": "oneOf", "all_of": "allOf", "min_items": "minItems",
    "max_items": "maxItems", "min_length": "minLength", "max_length": "maxLength",
    "min_properties": "minProperties", "max_properties": "maxProperties",
    "additional_properties": "additionalProperties", "prefix_items": "prefixItems",
    "unique_items": "uniqueItems", "exclusive_minimum": "exclusiveMinimum",
    "exclusive_maximum": "exclusiveMaximum", "multiple_of": "multipleOf",
    "property_ordering": "propertyOrdering", "min_contains": "minContains",
    "max_contains": "maxContains", "dependent_required": "dependentRequired",
    "pattern_properties": "patternProperties", "property_names": "propertyNames",
}
_DROPPED = frozenset({"propertyOrdering", "example", "nullable"})
_SCHEMA_MAPS = frozenset({"properties", "$defs", "definitions", "patternProperties", "dependentSchemas"})
_SCHEMA_LISTS = frozenset({"anyOf", "oneOf", "allOf", "prefixItems"})
_SCHEMA_ONE = frozenset({"items", "additionalProperties", "not", "contains", "propertyNames", "if", "then",
                         "else", "unevaluatedProperties", "unevaluatedItems"})


def _type(value: Any) -> Any:
    if isinstance(value, str):
        return _TYPES.get(value.upper(), value)
    if isinstance(value, list):
        return [_type(v) for v in value]
    return value


def to_json_schema(schema: Any) -> Any:
    """A JSON Schema for a Google schema (or for a JSON Schema with Google's habits)."""
    if not isinstance(schema, dict):
        return schema  # `true` / `false` schemas, or something the upstream will judge
    out: dict[str, Any] = {}
    nullable = False
    name: str  # a JSON object's keys are strings
    for name, value in schema.items():
        key = _KEYWORDS.get(name, name)
        if key == "nullable":
            nullable = value is True
            continue
        if key in _DROPPED:
            continue
        if key == "type":
            if isinstance(value, str) and value.upper() == "TYPE_UNSPECIFIED":
                continue
            out["type"] = _type(value)
        elif key == "format" and isinstance(value, str) and value.lower() == "enum":
            continue
        elif key in _SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: to_json_schema(sub) for name, sub in value.items()}
        elif key in _SCHEMA_LISTS and isinstance(value, list):
            out[key] = [to_json_schema(sub) for sub in value]
        elif key in _SCHEMA_ONE:
            out[key] = to_json_schema(value)
        else:
            out[key] = value
    if nullable:
        t = out.get("type")
        if isinstance(t, str) and t != "null":
            out["type"] = [t, "null"]
        elif isinstance(t, list) and "null" not in t:
            out["type"] = [*t, "null"]
        elif t is None and isinstance(out.get("anyOf"), list):
            if {"type": "null"} not in out["anyOf"]:
                out["anyOf"] = [*out["anyOf"], {"type": "null"}]
        if isinstance(out.get("enum"), list) and None not in out["enum"]:
            out["enum"] = [*out["enum"], None]  # nullable admits null, enum or not
    return out
