"""How a request ended, named once: the table from (stage, cause) to the outcome the access log,
the metrics and the dashboard show.

Every place that decides how a request ended says so with `Tracked.end(cause, kind)`; this module
alone turns that into the outcome string. The first cause recorded wins (a timeout that then
makes the write fail stays a timeout), except where a caller knows better and overrides (the
client leaving ends the request whatever was recorded before; an upstream that fails mid-answer
replaces the provisional cause).

| stage (has the answer begun?) | cause     | outcome                                          |
|-------------------------------|-----------|--------------------------------------------------|
| any                           | DONE      | `ok`                                             |
| any                           | LEFT      | `cancelled_<phase>` (the phase it was in)         |
| any                           | STALLED   | `cancelled_client_stalled` (it stopped reading)   |
| any                           | SUPERSEDED | `cancelled_superseded` (a newer completion of its client replaced it) |
| before the answer             | FAILED    | `rejected_<kind>` for overloaded and rate_limit, else `error_<kind>` |
| answering                     | FAILED    | `error_<kind>` (`upstream_midstream`, `timeout`, `upstream_too_large`...) |
"""

from __future__ import annotations

OK = "ok"

DONE = "done"  # the answer was written whole
LEFT = "left"  # the client went away
STALLED = "stalled"  # the client stopped reading: the gateway gave up on it
SUPERSEDED = "superseded"  # admission/supersede.py: its client's newer completion replaced it
FAILED = "failed"  # a GatewayError (or an upstream failure of that kind) ended it

REFUSALS = frozenset({"overloaded", "rate_limit"})  # "try later", not a failure, when said up front


def outcome_of(phase: str, cause: str, kind: str = "", begun: bool = True) -> str:
    if cause == DONE:
        return OK
    if cause == LEFT:
        return f"cancelled_{phase}"
    if cause == STALLED:
        return "cancelled_client_stalled"
    if cause == SUPERSEDED:
        return "cancelled_superseded"
    if cause == FAILED:
        if not kind:
            raise ValueError("a failure needs its kind")
        return f"rejected_{kind}" if not begun and kind in REFUSALS else f"error_{kind}"
    raise ValueError(f"unknown cause {cause!r}")
