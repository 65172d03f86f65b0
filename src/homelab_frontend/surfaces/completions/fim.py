"""Fill-in-the-middle: a prefix and a suffix -> one prompt, through a model's template (pure).

A template (config.Fim, or a preset) gives the tokens around the prefix P and the suffix S:
`psm` order renders prefix + P + suffix + S + middle, `spm` (Codestral) suffix + S + prefix + P
+ middle; the model then writes the middle. Extra context (llama.cpp's `input_extra`, files the
editor has open) goes before all of it, one file after another, so the stable part of the prompt
comes first (the backend's prefix cache keeps it across keystrokes).
"""

from __future__ import annotations

from ...config import Fim


def render(fim: Fim, prefix: str, suffix: str, extra: str = "") -> str:
    if fim.order == "spm":
        return f"{extra}{fim.suffix}{suffix}{fim.prefix}{prefix}{fim.middle}"
    return f"{extra}{fim.prefix}{prefix}{fim.suffix}{suffix}{fim.middle}"


def extra_text(chunks: list[dict]) -> str:
    """llama.cpp's `input_extra` chunks ({filename?, text}) as plain text before the FIM prompt:
    each file's name on a line of its own (when given), then its text."""
    out = []
    for ch in chunks:
        name = ch.get("filename")
        text = ch.get("text", "")
        if name:
            out.append(f"{name}\n")
        out.append(text if text.endswith("\n") or not text else text + "\n")
    return "".join(out)
