"""Canonical events -> one `generateContent` answer (a GenerateContentResponse as a dict). Pure.

The parts are parts.py's, exactly those a stream of the same events would carry, merged the way
a client merges a streamed answer: neighbouring thought parts into one, neighbouring text parts
into one unless the later one carries a signature (it would be lost in the merge). Then

    {"candidates": [{"content": {"parts": [...], "role": "model"}, "finishReason": ..., "index": 0}],
     "usageMetadata": {...}, "modelVersion": <the client's name>, "responseId": ...}

An `UpstreamError` makes `result()` raise `GatewayError`: `timeout_error` -> kind `timeout`
(504 DEADLINE_EXCEEDED), `overloaded_error` -> `upstream_error` with status 503 (UNAVAILABLE),
anything else -> `upstream_error` (502).
"""

from __future__ import annotations

from typing import Any, Callable

from ... import canonical as c
from ..assembly import upstream_failure
from ..signature import ThinkingSigner
from .parts import CALL, PartMachine, part_json
from .rules import finish_reason, new_call_id, usage_metadata


class ResponseAssembler:
    def __init__(self, *, model: str, response_id: str, signer: ThinkingSigner, include_thoughts: bool,
                 new_call_id: Callable[[], str] = new_call_id) -> None:
        self._model = model
        self._id = response_id
        self._pm = PartMachine(signer=signer, include_thoughts=include_thoughts, new_call_id=new_call_id)
        self._parts: list[tuple] = []

    @property
    def usage(self) -> c.Usage:
        return self._pm.usage

    def feed(self, event: c.Event) -> None:
        self._parts.extend(self._pm.feed(event))

    def result(self) -> dict[str, Any]:
        pm = self._pm
        if pm.error is not None:
            raise upstream_failure(pm.error)
        parts = _merged(self._parts + pm.end())
        candidate: dict = {"content": {"parts": parts, "role": "model"} if parts else {"role": "model"},
                           "finishReason": finish_reason(pm.finish), "index": 0}
        out: dict[str, Any] = {"candidates": [candidate]}
        usage = usage_metadata(pm.usage)
        if usage is not None:
            out["usageMetadata"] = usage
        out["modelVersion"] = self._model
        out["responseId"] = self._id
        return out


def _merged(parts: list[tuple]) -> list[dict]:
    out: list[dict] = []
    last_kind = None
    for p in parts:
        kind, payload, sig = p
        if out and kind is not CALL and kind is last_kind and sig is None:
            out[-1]["text"] += payload
            continue
        out.append(part_json(p))
        last_kind = kind
    return [p for p in out if p.get("text", True) != "" or len(p) > 1]


__all__ = ["ResponseAssembler"]
