"""Gemini wire rules the stream encoder (stream.py) and the whole-answer assembler (assemble.py)
share, so that an answer read with `streamGenerateContent` and one read with `generateContent`
cannot drift apart: finish reasons, usage metadata, function-call ids and arguments, the
reasoning signature, and the JSON escaping.

Finish reasons (canonical -> Gemini `finishReason`)
    stop, tool_calls, stop_sequence -> STOP (Google ends a function call and a stop sequence with
    STOP too), length -> MAX_TOKENS, content_filter -> SAFETY.
usageMetadata
    promptTokenCount = the upstream's prompt tokens (cached ones included, as Google counts
    them), cachedContentTokenCount = its cached tokens when it reported them,
    candidatesTokenCount = its completion tokens less the reasoning ones, thoughtsTokenCount = the
    reasoning ones, when it reported them and they are not 0 (vLLM's
    completion_tokens_details.reasoning_tokens: Google counts the thoughts apart from the
    candidates, and sends no thoughtsTokenCount for an answer without thinking),
    totalTokenCount = prompt + completion tokens (the thoughts included, as Google adds them).
    A count the upstream never reported is left out, never a 0.
Function calls
    `id`: the upstream's id when it has one not yet used in this answer, else `call_` + 24 random
    hex digits; clients echo it back in `functionResponse.id` (request.py matches it). `args`:
    the argument text parsed as JSON; empty or null -> `{}`; anything but a JSON object (cut off by
    MAX_TOKENS, malformed by a small model) -> `{"_raw_arguments": "<the text>"}`, as the other
    surfaces do (one function for all: surfaces/assembly.py), so the client reports a bad call back
    to the model instead of the turn failing.
thoughtSignature
    Gemini clients never send thought parts back (Gemini CLI keeps only the signatures, on the
    part that carries them), so the signature itself must carry the reasoning: it is
    `base64(signer.seal(reasoning))`, the gateway's sealed box (surfaces/signature.py: encrypted,
    authenticated, only this gateway's secret opens it). It is standard, padded base64 because
    the field is `bytes` to the SDKs: the Python SDK decodes it on the way in and encodes it again
    on the way out, so only a valid base64 text comes back byte for byte. `reasoning_from` opens
    it; a forged, foreign (Google's own) or altered signature yields None and is dropped.
Escaping
    every frame goes through surfaces/one_line.py (U+0085, U+2028, U+2029 escaped: line readers
    of both SDKs' generations split on them).
"""

from __future__ import annotations

import base64
import binascii
import secrets
from typing import Any

from ... import canonical as c
from ..signature import ThinkingSigner

FINISH_REASONS: dict[str, str] = {
    "stop": "STOP",
    "tool_calls": "STOP",
    "stop_sequence": "STOP",
    "length": "MAX_TOKENS",
    "content_filter": "SAFETY",
}

_MAX_SIGNATURE_CHARS = 12 * 1024 * 1024  # a bound before any work on client input


def finish_reason(finish: c.Finish | None) -> str:
    return FINISH_REASONS.get(finish.reason, "STOP") if finish is not None else "STOP"


def usage_metadata(u: c.Usage) -> dict[str, int] | None:
    out: dict[str, int] = {}
    if u.input_tokens is not None:
        out["promptTokenCount"] = u.input_tokens
    # a backend's reasoning count never exceeds its completion count as sent here (clamped: a
    # broken upstream must not make candidates negative), and a zero is not sent, as Google does not
    thoughts = min(u.reasoning_tokens or 0, u.output_tokens or 0)
    if u.output_tokens is not None:
        # Google counts the thoughts apart: candidates are the answer alone, and the total both
        out["candidatesTokenCount"] = u.output_tokens - thoughts
    if thoughts:
        out["thoughtsTokenCount"] = thoughts
    if u.input_tokens is not None or u.output_tokens is not None:
        out["totalTokenCount"] = (u.input_tokens or 0) + (u.output_tokens or 0)
    if u.cached_input_tokens is not None:
        out["cachedContentTokenCount"] = u.cached_input_tokens
    return out or None


def new_response_id() -> str:
    return secrets.token_urlsafe(16)


def new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


def call_id(upstream_id: str | None, used: set[str], new=new_call_id) -> str:
    """The id a functionCall gets: the upstream's when present and unused here, else a fresh one."""
    cid = upstream_id if upstream_id and upstream_id not in used else new()
    used.add(cid)
    return cid


def signature_for(signer: ThinkingSigner, reasoning: str) -> str:
    return base64.b64encode(signer.seal(reasoning).encode()).decode()


def reasoning_from(signer: ThinkingSigner, signature: Any) -> str | None:
    """The reasoning a gateway-made thoughtSignature carries; None for any other value."""
    if not isinstance(signature, str) or not signature or len(signature) > _MAX_SIGNATURE_CHARS:
        return None
    try:
        sealed = base64.b64decode(signature, validate=True).decode("ascii")
    except (binascii.Error, ValueError, UnicodeDecodeError):
        return None
    return signer.unseal(sealed)

