"""Reading Google's JSON by hand: a field under either spelling, typed accessors whose errors
name the field (`GatewayError("invalid_request", "<path>: <what>", param=<path>)`). Pure."""

from __future__ import annotations

from typing import Any

from ...errors import GatewayError


def invalid(path: str | None, detail: str) -> GatewayError:
    return GatewayError("invalid_request", f"{path}: {detail}" if path else detail, param=path or None)


def _snake(name: str) -> str:
    return "".join("_" + ch.lower() if ch.isupper() else ch for ch in name)


_SNAKE: dict[str, str] = {}


def get(d: dict, name: str) -> Any:
    """`d[name]` under Google's camelCase or the Python SDK's snake_case spelling."""
    value = d.get(name)
    if value is None:
        snake = _SNAKE.get(name)
        if snake is None:
            snake = _SNAKE[name] = _snake(name)
        if snake != name:
            value = d.get(snake)
    return value


def as_obj(value: Any, path: str) -> dict:
    if not isinstance(value, dict):
        raise invalid(path, f"expected an object, got {kind_of(value)}")
    return value


def as_list(value: Any, path: str) -> list:
    if not isinstance(value, list):
        raise invalid(path, f"expected a list, got {kind_of(value)}")
    return value


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
