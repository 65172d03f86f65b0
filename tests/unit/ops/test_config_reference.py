"""The configuration reference is generated from the schema (ops/config_reference.py): the
committed page is what the structs generate, every key of every section is on it, and a field
without a docstring stops the generator instead of reaching the page undocumented."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Literal

import msgspec
import pytest

from homelab_frontend import config as cfgmod
from homelab_frontend.ops import config_reference as ref

PAGE = Path(__file__).resolve().parents[3] / "docs" / "configuration.md"


def test_the_committed_page_is_what_the_schema_generates():
    page = PAGE.read_text(encoding="utf-8")
    assert ref.BEGIN in page and ref.END in page
    assert ref.rewrite(page, ref.generate()) == page, (
        "docs/configuration.md differs from the config schema (src/homelab_frontend/config.py): "
        "run `make config-reference` and commit the page")


def _keys(cls: type, path: str, out: set[str]) -> None:
    """Every key path of the schema, walked independently of the generator."""
    for f in msgspec.structs.fields(cls):
        here = f"{path}.{f.encode_name}" if path else f.encode_name
        out.add(here)
        t = msgspec.inspect.type_info(f.type)
        for alt in (t.types if isinstance(t, msgspec.inspect.UnionType) else (t,)):
            if isinstance(alt, msgspec.inspect.StructType):
                _keys(alt.cls, here, out)
            elif isinstance(alt, msgspec.inspect.DictType) and isinstance(alt.value_type, msgspec.inspect.StructType):
                _keys(alt.value_type.cls, f"{here}.NAME", out)
            elif isinstance(alt, msgspec.inspect.ListType) and isinstance(alt.item_type, msgspec.inspect.StructType):
                _keys(alt.item_type.cls, f"{here}[]", out)


def test_every_key_of_the_schema_is_a_row_with_its_default():
    text = ref.generate()
    keys: set[str] = set()
    _keys(cfgmod.Config, "", keys)
    assert len(keys) > 100
    for key in keys:
        assert f"| `{key}` |" in text, key
    # the sections the hand-written page once missed
    for key in ("auth.keys[].budget.tokens_per_day", "usage.retention_days", "completions.default_model",
                "resources", "lifecycle.swap_after_s", "backends.NAME.run.cmd", "models.NAME.fim.order",
                "models.NAME.supersede", "models.NAME.priority", "models.NAME.capabilities", "cluster.redis_url"):
        assert f"| `{key}` |" in text, key
    assert "| `backends.NAME.slots` | integer (≥ 1) | `8` |" in text
    assert "| `backends.NAME.timeouts.total_s` | number or null (> 0) | `null` |" in text
    assert "| `resources` | mapping of name to number (each ≥ 0) | `{}` |" in text
    assert "| `backends.NAME.url` | string | required |" in text
    assert "| `backends.NAME.kind` | `vllm` \\| `ollama` \\| `llamacpp` \\| `openai` \\| `whispercpp` \\| `peer` or null | `null` |" in text
    assert "| `responses.store.ttl_s` | number (> 0) | `2592000` |" in text


class Inner(msgspec.Struct):
    """An inner section."""

    depth: Annotated[int, msgspec.Meta(ge=1, le=64)] = 4
    """How deep."""


class Documented(msgspec.Struct):
    """A schema for this test."""

    mode: Literal["a", "b"] = "a"
    """Which mode."""
    inner: Inner = msgspec.field(default_factory=Inner)
    """The inner section."""
    names: list[str] = msgspec.field(default_factory=list)
    """Some names."""


class Undocumented(msgspec.Struct):
    """Has a field without its docstring."""

    fine: int = 1
    """Documented."""
    forgotten: bool = False


def test_constraints_come_from_the_fields_meta():
    text = ref.generate(Documented, sys.modules[__name__])
    assert "| `inner.depth` | integer (≥ 1, ≤ 64) | `4` | How deep. |" in text
    assert "| `mode` | `a` \\| `b` | `a` | Which mode. |" in text
    assert "| `names` | list of string | `[]` | Some names. |" in text
    assert "### `inner`\n\nAn inner section." in text


def test_a_field_without_a_docstring_stops_the_generator_naming_it():
    with pytest.raises(ref.Undocumented, match=r"Undocumented\.forgotten") as ei:
        ref.generate(Undocumented, sys.modules[__name__])
    assert "fine" not in str(ei.value)


def test_rewrite_replaces_only_the_generated_part():
    page = f"# T\n\nprose\n\n{ref.BEGIN}\nold\n{ref.END}\n\nafter\n"
    block = f"{ref.BEGIN}\nnew\n{ref.END}\n"
    assert ref.rewrite(page, block) == f"# T\n\nprose\n\n{ref.BEGIN}\nnew\n{ref.END}\n\nafter\n"
    assert ref.rewrite("# T\n", block) == f"# T\n\n{block}"
