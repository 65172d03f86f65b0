"""JSON that stays one line for every line reader: the escaping of the characters Python's
`str.splitlines` (httpx's `iter_lines`, so the Ollama and older GenAI Python libraries) and
JavaScript line readers take for line breaks besides CR and LF: U+0085, U+2028 and U+2029.

msgspec writes them raw; they can only stand inside JSON strings, where `\\u2028` is the same
text, so escaping them changes no value. Used by every frame of the line-framed dialects: Ollama's
NDJSON and Gemini's SSE. Pure.
"""

from __future__ import annotations

_NEL = b"\xc2\x85"  # U+0085 in UTF-8
_LS_PS = b"\xe2\x80"  # the lead bytes of U+2028 / U+2029 (and of other U+20xx: a cheap pre-check)


def one_line(data: bytes) -> bytes:
    if _LS_PS not in data and _NEL not in data:  # the common case: nothing to do
        return data
    return data.replace(_NEL, b"\\u0085").replace(b"\xe2\x80\xa8", b"\\u2028").replace(b"\xe2\x80\xa9", b"\\u2029")
