"""One finished request, as the ledger counts it, read from the request record (`Tracked`) when
the request is observed. Pure.

Which figures are exact: a backend that reports usage (every kind does at the end of an answer,
and vLLM on every chunk when asked) sets the record's `tokens_in`, and its `tokens_out` then
comes from that same report: both are exact. Without a report (a stream cancelled, or failed,
before the upstream's final usage chunk) the output is the gateway's own count of content
chunks, one token each for the backends it fronts, and the input an estimate of one token per
4 bytes of request body: both are marked estimated. A request that never reached a backend
(refused, cancelled while queued, or answered with an error status at once) used nothing:
zeros, exact.

What else counts: a relayed call (rerank, speech, images: surfaces/media/units.py) carries its
own units beside its tokens: `audio_seconds` of audio transcribed, `characters` of speech input,
`documents` reranked or scored, `images` made. Tokens it reports (a reranker's usage) are its
`tokens_in`, so budgets count them as a chat's.

Which requests count: those that went to admission on a route (`upstream_model` is set there)
and those refused before it (`rejected_*`: a budget, a key's max_concurrent); not model
listings, stored-response reads or token counts, which generate nothing.
"""

from __future__ import annotations

from typing import Protocol

import msgspec

BYTES_PER_TOKEN_ESTIMATE = 4
_NOTHING_RAN = ("error_upstream_error", "error_upstream_unreachable", "error_invalid_request")


class Record(Protocol):
    """What the ledger reads of a request record (request/tracker.py `Tracked`)."""

    key_name: str | None
    model: str
    upstream_model: str | None
    backend: str | None
    dialect: str
    tokens_in: int | None
    tokens_out: int
    tokens_cached: int | None
    slot_seconds: float
    queue_wait: float | None
    load_wait: float  # of queue_wait, the wait for a managed server to start
    body_bytes: int | None
    upstream_headers: float | None  # None: the backend never answered (it ran nothing)
    units: dict[str, float] | None  # a relayed call's own units (surfaces/media/units.py)

    @property
    def outcome(self) -> str: ...  # the record's own, read-only (request/outcome.py)


class Entry(msgspec.Struct, array_like=True):
    ts: float  # when it finished (Unix seconds): its hour, day and month
    key: str  # the key's name; "" when the gateway has no keys
    model: str  # the client's name for the model
    upstream: str
    backend: str
    dialect: str
    outcome: str
    input_tokens: int
    cached_tokens: int
    output_tokens: int
    input_exact: bool
    output_exact: bool
    slot_seconds: float
    queue_seconds: float
    load_seconds: float
    # a relayed call's units (the defaults keep an entry written before them decodable)
    characters: int = 0
    documents: int = 0
    images: int = 0
    audio_seconds: float = 0.0

    @property
    def tokens(self) -> int:
        """What a budget counts: input + output (cached input included, as the backend's
        prompt_tokens reports it)."""
        return self.input_tokens + self.output_tokens


def entry_of(t: Record, now: float) -> Entry | None:
    if not t.model:
        return None
    if t.upstream_model is None and not t.outcome.startswith("rejected_"):
        return None
    reached = t.slot_seconds > 0 and not (
        # the backend refused at once (an error status) or was never reached: it ran nothing
        t.upstream_headers is None and t.outcome in _NOTHING_RAN)
    reported = t.tokens_in is not None
    if reported:
        tin, tout, in_exact, out_exact = t.tokens_in or 0, t.tokens_out or 0, True, True
    elif reached:
        tin = (t.body_bytes or 0) // BYTES_PER_TOKEN_ESTIMATE
        tout, in_exact, out_exact = t.tokens_out or 0, False, False
    else:
        tin = tout = 0
        in_exact = out_exact = True
    units = (t.units or {}) if reached or t.outcome == "ok" else {}
    return Entry(
        ts=now, key=t.key_name or "", model=t.model, upstream=t.upstream_model or "",
        backend=t.backend or "", dialect=t.dialect, outcome=t.outcome,
        input_tokens=tin, cached_tokens=(t.tokens_cached or 0) if reported else 0, output_tokens=tout,
        input_exact=in_exact, output_exact=out_exact, slot_seconds=t.slot_seconds or 0.0,
        queue_seconds=t.queue_wait or 0.0, load_seconds=t.load_wait,
        characters=int(units.get("characters", 0)), documents=int(units.get("documents", 0)),
        images=int(units.get("images", 0)), audio_seconds=float(units.get("audio_seconds", 0.0)),
    )
