"""One JSON line per request: who, what, where, how it ended, how long each part took.
Never message text, never keys (a key's name only). `client` is the client's address as
believed: behind a proxy listed in `connections.trusted_proxies`, the one it forwards for."""

from __future__ import annotations

import logging
import sys
import time

import msgspec

from ..request.tracker import Tracked

_encode = msgspec.json.Encoder().encode


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 2)


class AccessLog:
    """To a file: each line one unbuffered binary write (one syscall, no text layer, nothing
    held in a buffer if the process dies). To stderr: through its text stream, so the lines stay
    in order with the log's own."""

    def __init__(self, path: str | None = None) -> None:
        self._file = open(path, "ab", buffering=0) if path else None
        self._stream = sys.stderr

    def write(self, t: Tracked, path: str) -> None:
        line = {
            "ts": round(time.time(), 3),
            "id": t.id,
            "path": path,
            "endpoint": t.endpoint,  # the route's family (a model in the path as `{model}`)
            "client": t.client,  # the client's address as believed (policy/forwarded.py)
            "dialect": t.dialect,
            "model": t.model or None,
            "backend": t.backend,
            "backends_tried": t.tried(),  # more than one: it failed over (request/failover.py)
            "failovers": [{"backend": b, "cause": c} for b, c in t.failovers] if t.failovers else None,
            "served_model": t.served_model,
            "key": t.key_name,
            "stream": t.stream,
            "status": t.status,
            "outcome": t.outcome,
            "queue_wait_ms": _ms(t.queue_wait),
            "ttft_ms": _ms(t.ttft),
            "duration_ms": _ms(time.monotonic() - t.started),
            "tokens_in": t.tokens_in,
            "tokens_out": t.tokens_out,
            "tokens_cached": t.tokens_cached,
            "affinity": t.affinity,
        }
        if t.drained is not None:  # on_client_gone: drain (request/drain.py): how the upstream ended
            line["drained"] = t.drained
        try:
            if self._file is not None:
                self._file.write(_encode(line) + b"\n")
            else:
                self._stream.write(_encode(line).decode() + "\n")
                self._stream.flush()
        except (OSError, ValueError):
            logging.getLogger("homelab_frontend").warning("access log write failed")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
