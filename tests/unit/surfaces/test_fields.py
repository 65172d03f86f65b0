"""surfaces/fields.py: the typed accessors every hand-walking dialect shares; each refusal names
the field (message and param) and says what came instead."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, strategies as st

from homelab_frontend.errors import GatewayError
from homelab_frontend.surfaces.fields import as_list, as_obj, boolean, integer, invalid, kind_of, number, string

_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
                     | st.text(max_size=5), lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(st.text(max_size=3), inner, max_size=3), max_leaves=8)


def _refused(fn, *args) -> GatewayError:
    with pytest.raises(GatewayError) as e:
        fn(*args)
    assert e.value.kind == "invalid_request"
    return e.value


def test_accessors_name_the_field():
    assert as_obj({}, "x") == {} and as_list([], "x") == []
    e = _refused(as_obj, [1], "generationConfig")
    assert e.param == "generationConfig" and e.message == "generationConfig: expected an object, got a list"
    assert _refused(as_list, "s", "contents").message == "contents: expected a list, got a string"
    assert [kind_of(v) for v in (None, True, 1, 1.5, "s", [], {})] == [
        "null", "a boolean", "a number", "a number", "a string", "a list", "an object"]


def test_invalid_without_a_path_is_about_the_body():
    e = invalid(None, "request body is empty")
    assert e.message == "request body is empty" and e.param is None
    assert invalid("", "x").param is None


def test_strings_and_booleans():
    assert string({"a": "x"}, "a", "m[0].a") == "x" and string({}, "a", "a") is None
    assert string({"a": None}, "a", "a") is None
    assert _refused(lambda: string({}, "name", "tools[1].name", required=True)).message == \
        "tools[1].name: required string field is missing"
    e = _refused(string, {"a": 3}, "a", "m[0].a")
    assert e.param == "m[0].a" and e.message == "m[0].a: expected a string, got a number"
    assert boolean({"s": False}, "s", "s") is False and boolean({}, "s", "s") is None
    assert _refused(boolean, {"s": "yes"}, "s", "stream").message == "stream: expected true or false, got a string"


def test_numbers_and_integers():
    assert number(None, "t") is None and number(0.5, "t") == 0.5 and type(number(1, "t")) is int
    assert _refused(number, True, "t").message == "t: expected a number, got a boolean"
    assert _refused(number, "1", "t").message == "t: expected a number, got a string"
    assert _refused(number, math.inf, "t").message == "t: must be a finite number"
    assert integer(None, "k") is None and integer(3, "k") == 3 and integer(2.0, "k") == 2
    assert _refused(integer, 2.5, "topK").message == "topK: expected an integer, got 2.5"
    assert _refused(integer, False, "topK").message == "topK: expected an integer, got a boolean"


@given(_json)
def test_any_json_value_is_taken_or_refused_by_name(value):
    for fn in (number, integer):
        try:
            got = fn(value, "p")
        except GatewayError as e:
            assert e.param == "p" and e.message.startswith("p: ")
        else:
            assert got is None or (isinstance(got, (int, float)) and not isinstance(got, bool))
    for fn in (string, boolean):
        try:
            fn({"k": value}, "k", "p")
        except GatewayError as e:
            assert e.param == "p" and kind_of(value) in e.message


def test_a_function_declaration_names_what_is_wrong():
    from homelab_frontend.surfaces.fields import function_tool

    tool = function_tool({"name": "f", "description": "d", "parameters": {"type": "object"}}, "tools[0]")
    assert (tool.name, tool.description, tool.parameters) == ("f", "d", {"type": "object"})
    assert function_tool({"name": "g"}, "tools[1].function").parameters == {}
    assert _refused(function_tool, {"name": ""}, "tools[0]").message == "tools[0].name: must not be empty"
    e = _refused(function_tool, {"name": "f", "parameters": []}, "tools[2].function")
    assert e.param == "tools[2].function.parameters" and e.message.endswith("expected a JSON schema object, got a list")
    assert _refused(function_tool, {"name": "f", "description": 3}, "tools[0]").param == "tools[0].description"
