"""An upstream's `Retry-After` header (RFC 9110 10.2.3) -> seconds from now, or None.

Two forms: delay-seconds (`120`) and an HTTP-date (`Fri, 31 Dec 1999 23:59:59 GMT`; the obsolete
RFC 850 and asctime forms are accepted too, as email.utils parses them). A date in the past is
0 s. Anything else (negative, fractional, garbage, absurdly far) is None: a header we cannot
read is not passed on, rather than passed on wrong. The value is capped at a day, so a hostile
upstream cannot tell clients to go away for a year.
"""

from __future__ import annotations

import time
from email.utils import parsedate_to_datetime

MAX_S = 86_400.0


def retry_after_seconds(value: str | None, now: float | None = None) -> float | None:
    if value is None:
        return None
    value = value.strip()
    if not value or len(value) > 64:
        return None
    if value.isdigit() and value.isascii():
        return min(float(value), MAX_S)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when is None or when.tzinfo is None:
        return None  # an HTTP-date is always GMT; one without a zone is not an HTTP-date
    delta = when.timestamp() - (time.time() if now is None else now)
    return min(max(0.0, delta), MAX_S)
