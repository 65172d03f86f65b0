"""Reading a client's JSON by hand, for every dialect that walks its body itself (Gemini, Ollama,
Responses) or names a field msgspec refused (OpenAI, Anthropic): one vocabulary of refusals, each
`GatewayError("invalid_request", "<path>: <what>", param=<path>)`, so the dialects cannot drift
apart on how they say what is wrong. Pure.

    invalid(path, detail)       the refusal itself (no path: the body as a whole)
    kind_of(value)              what a JSON value is, in words ("a list", "null", ...)
    as_obj / as_list            the value, or a refusal naming it
    string / boolean            raw[key] when present and of the type, None when absent or null
    number / integer            a value (None stays None); an integer may be written 2.0
    function_tool               OpenAI's {name, description, parameters}, which Ollama's tools
                                and Responses' function tools share
"""

from __future__ import annotations

import math
from typing import Any, Literal, overload

from .. import canonical as c
from ..errors import GatewayError


def invalid(path: str | None, detail: str) -> GatewayError:
    return GatewayError("invalid_request", f"{path}: {detail}" if path else detail, param=path or None)


def kind_of(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "an object"


def as_obj(value: Any, path: str) -> dict:
    if not isinstance(value, dict):
        raise invalid(path, f"expected an object, got {kind_of(value)}")
    return value


def as_list(value: Any, path: str) -> list:
    if not isinstance(value, list):
        raise invalid(path, f"expected a list, got {kind_of(value)}")
    return value


@overload
def string(raw: dict, key: str, path: str, *, required: Literal[True]) -> str: ...
@overload
def string(raw: dict, key: str, path: str, *, required: bool = False) -> str | None: ...
def string(raw: dict, key: str, path: str, *, required: bool = False) -> str | None:
    v = raw.get(key)
    if v is None:
        if required:
            raise invalid(path, "required string field is missing")
        return None
    if not isinstance(v, str):
        raise invalid(path, f"expected a string, got {kind_of(v)}")
    return v


def boolean(raw: dict, key: str, path: str) -> bool | None:
    v = raw.get(key)
    if v is None:
        return None
    if not isinstance(v, bool):
        raise invalid(path, f"expected true or false, got {kind_of(v)}")
    return v


def number(value: Any, path: str) -> float | None:
    """A JSON number as sent (an int stays an int); JSON has no NaN or infinity, so a value that
    is one did not come from a client's JSON and is refused too."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise invalid(path, f"expected a number, got {kind_of(value)}")
    if isinstance(value, float) and not math.isfinite(value):
        raise invalid(path, "must be a finite number")
    return value


def integer(value: Any, path: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise invalid(path, f"expected an integer, got {kind_of(value)}")
    if isinstance(value, float) and not value.is_integer():
        raise invalid(path, f"expected an integer, got {value}")
    return int(value)


def function_tool(fn: dict, path: str) -> c.Tool:
    """A function declaration: a name (non-empty), an optional description, an optional JSON
    schema object for its parameters; `path` names the declaration."""
    name = string(fn, "name", f"{path}.name", required=True)
    if not name:
        raise invalid(f"{path}.name", "must not be empty")
    params = fn.get("parameters")
    if params is not None and not isinstance(params, dict):
        raise invalid(f"{path}.parameters", f"expected a JSON schema object, got {kind_of(params)}")
    return c.Tool(name, string(fn, "description", f"{path}.description"), params or {})
