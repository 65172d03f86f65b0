"""Google's JSON spelled two ways: a field under Google's camelCase or the Python SDK's
snake_case. The typed accessors and refusals are every dialect's (surfaces/fields.py). Pure."""

from __future__ import annotations

from typing import Any


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
