"""The token strings of a GGUF file (`tokenizer.ggml.tokens`), read with the standard library: a
check of FIM presets against a model family's own vocabulary needs no numpy and no gguf package."""

from __future__ import annotations

import struct
from typing import BinaryIO

_FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9


def _u32(f: BinaryIO) -> int:
    return struct.unpack("<I", f.read(4))[0]


def _u64(f: BinaryIO) -> int:
    return struct.unpack("<Q", f.read(8))[0]


def _string(f: BinaryIO) -> str:
    return f.read(_u64(f)).decode("utf-8", "replace")


def _value(f: BinaryIO, kind: int, keep: bool):
    if kind in _FIXED:
        f.read(_FIXED[kind])
        return None
    if kind == _STRING:
        return _string(f)
    if kind == _ARRAY:
        inner, n = _u32(f), _u64(f)
        if inner in _FIXED:
            f.read(_FIXED[inner] * n)
            return None
        items = [_value(f, inner, keep) for _ in range(n)]
        return items if keep else None
    raise ValueError(f"unknown GGUF value type {kind}")


def tokens(path: str) -> list[str]:
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise ValueError(f"{path}: not a GGUF file")
        _u32(f)  # version
        _u64(f)  # tensors
        for _ in range(_u64(f)):
            key = _string(f)
            kind = _u32(f)
            value = _value(f, kind, key == "tokenizer.ggml.tokens")
            if key == "tokenizer.ggml.tokens":
                return value
    raise ValueError(f"{path}: no tokenizer.ggml.tokens")
