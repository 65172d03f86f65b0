"""What a relayed call cost, in the units of its kind, for the ledger (usage/record.py). Pure.

| kind           | unit           | from                                                             |
|----------------|----------------|------------------------------------------------------------------|
| rerank, score  | documents      | the request's documents (score: its `text_2` items)              |
|                | tokens (input) | the answer's `usage` (`prompt_tokens`, else `total_tokens`)      |
| transcription  | audio_seconds  | the answer's `duration` (verbose_json), its `usage.seconds`      |
|                |                | (`type: duration`), else the WAV file's own header and size      |
|                | tokens         | the answer's `usage.input_tokens` / `output_tokens` (token-billed |
|                |                | transcribers)                                                    |
| speech         | characters     | the request's `input`                                            |
| images         | images         | the answer's `data` items; tokens from its `usage` where given   |

Tokens reported by the backend are the record's `tokens_in` / `tokens_out`, so budgets count
them as they count a chat's; the other units are counted beside them.
"""

from __future__ import annotations

import struct

__all__ = ["answer_units", "wav_seconds"]


def _num(x: object) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and x >= 0 else None


def _int(x: object) -> int | None:
    return x if isinstance(x, int) and not isinstance(x, bool) and x >= 0 else None


def answer_units(endpoint: str, doc: dict) -> tuple[dict[str, float], int | None, int | None]:
    """(units, tokens in, tokens out) a whole JSON answer reports."""
    units: dict[str, float] = {}
    reported = doc.get("usage")
    usage = reported if isinstance(reported, dict) else {}
    tin = _int(usage.get("prompt_tokens")) if usage.get("prompt_tokens") is not None else _int(usage.get("input_tokens"))
    if tin is None and endpoint in ("rerank", "rerank_v2", "score"):
        tin = _int(usage.get("total_tokens"))
    tout = _int(usage.get("output_tokens")) if usage.get("output_tokens") is not None else _int(usage.get("completion_tokens"))
    if endpoint in ("transcriptions", "translations"):
        seconds = _num(doc.get("duration"))
        if seconds is None and usage.get("type") == "duration":
            seconds = _num(usage.get("seconds"))
        if seconds is not None:
            units["audio_seconds"] = seconds
    elif endpoint in ("image_generations", "image_edits"):
        data = doc.get("data")
        if isinstance(data, list):
            units["images"] = float(len(data))
    return units, tin, tout


def wav_seconds(head: bytes, size: int) -> float | None:
    """The length of a WAV file of `size` bytes from its first bytes (RIFF header, `fmt ` chunk
    with the byte rate): an estimate (the data chunk is taken as the rest of the file)."""
    if len(head) < 36 or head[:4] != b"RIFF" or head[8:12] != b"WAVE":
        return None
    pos = 12
    while pos + 8 <= len(head):
        cid, clen = head[pos:pos + 4], struct.unpack_from("<I", head, pos + 4)[0]
        if cid == b"fmt " and pos + 8 + 12 <= len(head):
            byte_rate = struct.unpack_from("<I", head, pos + 8 + 8)[0]
            if byte_rate <= 0:
                return None
            return max(0.0, (size - 44) / byte_rate)
        pos += 8 + clen + (clen & 1)
    return None
