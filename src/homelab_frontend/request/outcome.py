"""How a request ended, named once: the table from (stage, cause) to the outcome the access log,
the metrics and the dashboard show.

Every place that decides how a request ended says so with `Tracked.end(cause, kind)`, which keeps
it as a typed `Ending` (the `Cause`, the `phase.Phase` it was in, the kind); this module alone
turns that into the outcome string, so a label is only ever made of a phase the table knows. The first cause recorded wins (a timeout that then
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

from enum import StrEnum
from typing import NamedTuple

from .phase import Phase

OK = "ok"


class Cause(StrEnum):
    DONE = "done"  # the answer was written whole
    LEFT = "left"  # the client went away
    STALLED = "stalled"  # the client stopped reading: the gateway gave up on it
    SUPERSEDED = "superseded"  # admission/supersede.py: its client's newer completion replaced it
    FAILED = "failed"  # a GatewayError (or an upstream failure of that kind) ended it


DONE, LEFT, STALLED, SUPERSEDED, FAILED = Cause.DONE, Cause.LEFT, Cause.STALLED, Cause.SUPERSEDED, Cause.FAILED

REFUSALS = frozenset({"overloaded", "rate_limit"})  # "try later", not a failure, when said up front


class Ending(NamedTuple):
    """How a request ended, as recorded (Tracked.end): the cause, the phase it was in, the
    failure's kind and whether its answer had begun. `outcome` is the one string made of it."""

    cause: Cause
    phase: Phase
    kind: str = ""
    begun: bool = True

    @property
    def outcome(self) -> str:
        return outcome_of(self.phase, self.cause, self.kind, self.begun)


def outcome_of(phase: Phase, cause: str, kind: str = "", begun: bool = True) -> str:
    if cause == DONE:
        return OK
    if cause == LEFT:
        return f"cancelled_{Phase(phase).value}"
    if cause == STALLED:
        return "cancelled_client_stalled"
    if cause == SUPERSEDED:
        return "cancelled_superseded"
    if cause == FAILED:
        if not kind:
            raise ValueError("a failure needs its kind")
        return f"rejected_{kind}" if not begun and kind in REFUSALS else f"error_{kind}"
    raise ValueError(f"unknown cause {cause!r}")
