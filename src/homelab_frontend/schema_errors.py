"""msgspec's validation errors, read once: the one parser of their text.

msgspec says what is wrong in English with the place appended (`Expected `int`, got `str` - at
`$.messages[0].max_tokens``). Whoever renders such an error in its own words (the config's key
paths, a client dialect's error body) reads it through `read`, so that a change in msgspec's
wording is mended here and nowhere else. A dict key msgspec does not name comes out as `[...]`
in its path and None in `steps`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

import msgspec

Kind = Literal["expected", "bound", "missing", "unknown", "enum", "value", "other"]

_AT = re.compile(r"^(?P<what>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.S)
_FORMS: tuple[tuple[Kind, re.Pattern[str]], ...] = (
    # a `msgspec.Meta` constraint: "Expected `int` >= 1", "Expected `float` > 0.0"
    ("bound", re.compile(r"^Expected `(?P<want>[^`]*)` (?P<op>>=|<=|>|<) (?P<bound>\S+)$")),
    ("expected", re.compile(r"^Expected `(?P<want>[^`]*)`, got `(?P<got>[^`]*)`$")),
    ("missing", re.compile(r"^Object missing required field `(?P<field>[^`]*)`$")),
    ("unknown", re.compile(r"^Object contains unknown field `(?P<field>[^`]*)`$")),
    ("enum", re.compile(r"^Invalid enum value (?P<value>.*)$", re.S)),
    ("value", re.compile(r"^Invalid value (?P<value>.*)$", re.S)),
)
_STEP = re.compile(r"\.([^.\[]+)|\[(\d+|\.\.\.)\]")


@dataclass(frozen=True)
class SchemaError:
    kind: Kind
    text: str  # msgspec's sentence without the place
    path: str = ""  # as msgspec writes it, without `$.`: "messages[0].content", "" at the top
    steps: list[str | int | None] = field(default_factory=list)  # ["messages", 0, "content"]
    want: str = ""  # expected, bound: the type(s) wanted, msgspec's names ("str | array")
    op: str = ""  # bound: >=, >, <=, <
    bound: str = ""  # bound: the limit, as msgspec writes it ("1", "0.0")
    got: str = ""  # expected: the type given
    field: str = ""  # missing, unknown: the field's name
    value: str = ""  # enum, value: the value given, as msgspec quotes it

    def at(self, name: str) -> str:
        """The path of the field this error names inside its place (missing, unknown)."""
        return f"{self.path}.{name}" if self.path else name


def read(err: msgspec.ValidationError) -> SchemaError:
    m = _AT.match(str(err))
    assert m is not None  # the pattern matches any text
    what, raw_path = m.group("what"), m.group("path") or ""
    steps: list[str | int | None] = [
        name if name else (None if index == "..." else int(index)) for name, index in _STEP.findall(raw_path)]
    base = {"text": what, "path": raw_path.lstrip("."), "steps": steps}
    for kind, form in _FORMS:
        found = form.match(what)
        if found:
            return SchemaError(kind, **base, **found.groupdict())  # type: ignore[arg-type]
    return SchemaError("other", **base)  # type: ignore[arg-type]
