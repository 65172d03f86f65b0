"""The configuration reference, generated from the schema: every key of `config.Config`, its
type, its default, its constraints and its meaning, read off the msgspec structs themselves.

The structs are the one source: a field's meaning is its attribute docstring (the string right
below it in config.py), a section's its class docstring; types and defaults come from msgspec's
own view of the structs, constraints from their `msgspec.Meta` where a field has one. A field
without a docstring is an error here, so a new key cannot reach the page undocumented.
`homelab-frontend config-reference --write docs/configuration.md` (`make config-reference`)
rewrites the page's generated part; tests/unit/ops/test_config_reference.py fails while the
committed page differs from what the schema generates.
"""

from __future__ import annotations

import ast
import inspect
from types import ModuleType, NoneType, UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import msgspec

from .. import config as cfgmod

BEGIN = "<!-- BEGIN config-reference: generated from src/homelab_frontend/config.py by `make config-reference`; do not edit -->"
END = "<!-- END config-reference -->"
_BEGIN_PREFIX = "<!-- BEGIN config-reference"


class Undocumented(Exception):
    """A struct or field without its docstring."""


def _field_docs(module: ModuleType) -> dict[str, dict[str, str]]:
    """Per struct class name: each field's attribute docstring (the string statement after it)."""
    tree = ast.parse(inspect.getsource(module))
    out: dict[str, dict[str, str]] = {}
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        docs: dict[str, str] = {}
        for stmt, nxt in zip(node.body, [*node.body[1:], None]):
            if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
                    and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                    and isinstance(nxt.value.value, str)):
                docs[stmt.target.id] = " ".join(inspect.cleandoc(nxt.value.value).split())
        out[node.name] = docs
    return out


def _is_struct(t: Any) -> bool:
    return isinstance(t, type) and issubclass(t, msgspec.Struct)


def _bare(t: Any) -> Any:
    """The type without its `Annotated[..., msgspec.Meta(...)]` (constraints are read apart)."""
    return get_args(t)[0] if get_origin(t) is Annotated else t


def _parts(t: Any) -> tuple[Any, ...]:
    t = _bare(t)
    return tuple(_bare(a) for a in get_args(t)) if get_origin(t) in (Union, UnionType) else (t,)


def _type(t: Any) -> str:
    t = _bare(t)
    if t is NoneType:
        return "null"
    if get_origin(t) in (Union, UnionType):
        return " or ".join(_type(a) for a in get_args(t))
    if get_origin(t) is Literal:
        return " \\| ".join(f"`{v}`" for v in get_args(t))
    if get_origin(t) is list:
        return f"list of {_type(get_args(t)[0])}"
    if get_origin(t) is dict:
        return f"mapping of name to {_type(get_args(t)[1])}"
    if _is_struct(t):
        return "section"
    return {str: "string", int: "integer", float: "number", bool: "boolean"}.get(t, getattr(t, "__name__", str(t)))


def _value(v: Any) -> str:
    if v is None:
        return "`null`"
    if isinstance(v, bool):
        return f"`{str(v).lower()}`"
    if isinstance(v, float) and v.is_integer():
        return f"`{int(v)}`"
    if isinstance(v, (int, float, str)):
        return f"`{v}`"
    if isinstance(v, (dict, list)) and not v:
        return "`{}`" if isinstance(v, dict) else "`[]`"
    if isinstance(v, msgspec.Struct):
        return "(its defaults)"
    return f"`{msgspec.json.encode(v).decode()}`"


def _default(f: msgspec.structs.FieldInfo) -> str:
    if f.default is not msgspec.NODEFAULT:
        return _value(f.default)
    if f.default_factory is not msgspec.NODEFAULT:
        return _value(f.default_factory())
    return "required"


_BOUNDS = (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<"), ("min_length", "length ≥"), ("max_length", "length ≤"))


def _constraints(t: msgspec.inspect.Type) -> str:
    """What a field's `msgspec.Meta` demands (ge, gt, le, lt, lengths, pattern), where it has one."""
    found = []
    for alt in (t.types if isinstance(t, msgspec.inspect.UnionType) else (t,)):
        if isinstance(alt, msgspec.inspect.DictType):
            inner = _constraints(alt.value_type)
            found += [f"each {inner}"] if inner else []
            continue
        for attr, sign in _BOUNDS:
            if getattr(alt, attr, None) is not None:
                found.append(f"{sign} {getattr(alt, attr)}")
        if isinstance(alt, msgspec.inspect.StrType) and alt.pattern:
            found.append(f"matches `{alt.pattern}`")
    return ", ".join(found)


def _sections(cls: type, path: str, docs: dict[str, dict[str, str]], out: list[tuple[str, type]]) -> None:
    """Every struct reachable from `cls`, with the key path it sits at, depth first."""
    out.append((path, cls))
    for f in msgspec.structs.fields(cls):
        here = f"{path}.{f.encode_name}" if path else f.encode_name
        for part in _parts(f.type):
            if _is_struct(part):
                _sections(part, here, docs, out)
            elif get_origin(part) is dict and _is_struct(get_args(part)[1]):
                _sections(get_args(part)[1], f"{here}.NAME", docs, out)
            elif get_origin(part) is list and _is_struct(get_args(part)[0]):
                _sections(get_args(part)[0], f"{here}[]", docs, out)


def generate(root: type = cfgmod.Config, module: ModuleType = cfgmod) -> str:
    """The reference as Markdown, between the BEGIN and END markers, for `root` and the structs
    it reaches, whose docstrings are in `module`'s source. Raises Undocumented."""
    docs = _field_docs(module)
    sections: list[tuple[str, type]] = []
    _sections(root, "", docs, sections)
    missing = [f"{cls.__name__}.{f.name}" for _, cls in sections for f in msgspec.structs.fields(cls)
               if f.name not in docs.get(cls.__name__, {})]
    missing += [cls.__name__ for _, cls in sections if not (cls.__doc__ or "").strip()]
    if missing:
        raise Undocumented(f"undocumented in {module.__name__}: {', '.join(dict.fromkeys(missing))} "
                           "(give each a docstring below it, then run `make config-reference`)")
    lines = [BEGIN, ""]
    for path, cls in sections:
        struct = msgspec.inspect.type_info(cls)
        assert isinstance(struct, msgspec.inspect.StructType)  # _sections collects structs
        info = {f.name: f for f in struct.fields}
        lines += [f"### {'`' + path + '`' if path else 'The top level'}", "",
                  " ".join(inspect.cleandoc(cls.__doc__ or "").split()), "",
                  "| key | type | default | meaning |", "|---|---|---|---|"]
        for f in msgspec.structs.fields(cls):
            key = f"{path}.{f.encode_name}" if path else f.encode_name
            bounds = _constraints(info[f.name].type)
            kind = _type(f.type) + (f" ({bounds})" if bounds else "")
            meaning = docs[cls.__name__][f.name].replace("|", "\\|")
            lines.append(f"| `{key}` | {kind} | {_default(f)} | {meaning} |")
        lines.append("")
    lines.append(END)
    return "\n".join(lines) + "\n"


def rewrite(page: str, block: str) -> str:
    """`page` with its generated part (from a BEGIN marker, whatever it says, to END) replaced by
    `block`; appended when it has none yet."""
    start, end = page.find(_BEGIN_PREFIX), page.find(END)
    if start < 0 or end < start:
        return page.rstrip("\n") + "\n\n" + block
    return page[:start] + block.rstrip("\n") + page[end + len(END):]
