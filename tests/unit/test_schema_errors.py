"""schema_errors.read: msgspec's own errors (the oracle: real conversions, not sample strings) read
into kind, path, steps and the parts each kind names."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
import pytest

from homelab_frontend import schema_errors


class Inner(msgspec.Struct, forbid_unknown_fields=True):
    n: int
    size: Annotated[float, msgspec.Meta(gt=0, le=10)] = 1.0
    mode: Literal["a", "b"] = "a"


class Cat(msgspec.Struct, tag_field="x", tag="cat"):
    v: int = 0


class Dog(msgspec.Struct, tag_field="x", tag="dog"):
    v: int = 0


class Outer(msgspec.Struct, forbid_unknown_fields=True):
    items: list[Inner] = []
    by_name: dict[str, Inner] = {}
    tagged: list[Cat | Dog] = []


def error(raw: object, typ: type = Outer) -> schema_errors.SchemaError:
    with pytest.raises(msgspec.ValidationError) as ei:
        msgspec.convert(raw, typ, strict=True)
    return schema_errors.read(ei.value)


def test_expected_with_its_place_and_steps():
    e = error({"items": [{"n": 1}, {"n": "2"}]})
    assert (e.kind, e.want, e.got, e.path, e.steps) == ("expected", "int", "str", "items[1].n", ["items", 1, "n"])
    assert e.text == "Expected `int`, got `str`"


def test_a_dict_key_msgspec_does_not_name_is_none():
    e = error({"by_name": {"x": {"n": 1}, "y": {"n": 1, "mode": "c"}}})
    assert (e.kind, e.value, e.steps) == ("enum", "'c'", ["by_name", None, "mode"])


def test_missing_and_unknown_name_their_field():
    e = error({"items": [{}]})
    assert (e.kind, e.field, e.path, e.at(e.field)) == ("missing", "n", "items[0]", "items[0].n")
    e = error({"items": [{"n": 1, "m": 2}]})
    assert (e.kind, e.field, e.at(e.field)) == ("unknown", "m", "items[0].m")
    e = error({"nope": 1})
    assert (e.kind, e.field, e.path, e.steps, e.at("nope")) == ("unknown", "nope", "", [], "nope")


def test_a_tag_no_variant_has_is_an_invalid_value():
    e = error({"tagged": [{"x": "Other"}]})
    assert (e.kind, e.value, e.path) == ("value", "'Other'", "tagged[0].x")


def test_at_the_top_and_anything_else():
    e = error(3)
    assert (e.kind, e.path, e.steps, e.got) == ("expected", "", [], "int")
    e = schema_errors.read(msgspec.ValidationError("Something new"))
    assert (e.kind, e.text, e.path) == ("other", "Something new", "")


def test_a_constraint_names_its_bound():
    e = error({"items": [{"n": 1, "size": 0}]})
    assert (e.kind, e.want, e.op, e.bound, e.path) == ("bound", "float", ">", "0.0", "items[0].size")
    e = error({"items": [{"n": 1, "size": 11}]})
    assert (e.kind, e.op, e.bound) == ("bound", "<=", "10.0")
