"""The `Server-Timing` header: what the gateway added to an answer, in parts."""

from __future__ import annotations

import time

from ..request.tracker import Tracked


def server_timing(t: Tracked) -> str:
    """The `Server-Timing` header (ms), so a client can see what the gateway added to an answer:
    `queue` waiting for a slot, `upstream` from sending the upstream request to its response
    headers, `gw` the rest of the time until these headers (reading and parsing the request,
    routing, building the upstream body). Parts the request never reached are left out."""
    own = time.monotonic() - t.started
    parts = []
    if t.queue_wait is not None:
        parts.append(f"queue;dur={t.queue_wait * 1000:.3f}")
        own -= t.queue_wait
    if t.upstream_headers is not None:
        parts.append(f"upstream;dur={t.upstream_headers * 1000:.3f}")
        own -= t.upstream_headers
    parts.append(f"gw;dur={max(own, 0.0) * 1000:.3f}")
    return ", ".join(parts)
