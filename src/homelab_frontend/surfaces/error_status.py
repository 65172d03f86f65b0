"""The HTTP status a client sees for a `GatewayError`, shared by both dialects' error renderers.

Client-side kinds (invalid_request, authentication, ...) have fixed statuses, chosen by the
renderer of each dialect. For the upstream kinds (`upstream_unreachable`, `upstream_error`,
`timeout`), `err.status` holds what the backend answered (or 502), and it is passed on when it
means the same thing to our client as it meant to us (kind `timeout` is always 504):

    400, 422      -> 400  the request was refused as invalid (e.g. context length exceeded)
    404, 413, 429 -> kept (model unknown upstream, request too large, upstream rate limit)
    408           -> 504  the upstream timed out
    5xx           -> kept (503 is rendered as "overloaded", 504 as a timeout); 529, Anthropic's
                     "overloaded", only for the dialect that has it (`keep_529`): every other
                     dialect's clients know 503 for that
    401, 403, any other status -> 502: the gateway's own credentials or wiring toward its
                     backend failed. Passing a 401 on would tell the *client* its key is bad (Claude
                     Code would ask the user to log in again).
"""

from __future__ import annotations

import math

from ..errors import GatewayError

UPSTREAM_KINDS = frozenset({"upstream_unreachable", "upstream_error", "upstream_too_large", "upstream_malformed",
                            "timeout"})


def upstream_client_status(err: GatewayError, *, keep_529: bool = False) -> int:
    """The status to show the client for an error of one of the UPSTREAM_KINDS."""
    s = err.status
    if err.kind == "timeout":
        return 504
    if s in (400, 422):
        return 400
    if s in (404, 413, 429):
        return s
    if s == 408:
        return 504
    if s == 529 and not keep_529:
        return 503
    if 500 <= s <= 599:
        return s
    return 502


def retry_after_headers(err: GatewayError) -> dict[str, str]:
    """`retry-after` in whole seconds (rounded up, at least 1) when the error carries one."""
    ra = err.retry_after
    if ra is None:
        return {}
    try:
        seconds = float(ra)
    except (TypeError, ValueError):
        return {}
    if not math.isfinite(seconds):
        return {}
    return {"retry-after": str(max(1, math.ceil(seconds)))}
