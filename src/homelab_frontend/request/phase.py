"""A request's phases as a table: which phase may follow which. Pure, no clock, no I/O.

The request's record (tracker.Tracked) is the one owner of its phase: every other module moves
it through the record's methods (`queued`, `loading`, `connecting`, `answering`, `streaming`,
`generating`, `draining`), each of which looks the move up here; a move the table does not hold
raises `IllegalPhase`, so a wrong move is a loud bug where it happens, not a dashboard row or a
`cancelled_<phase>` outcome nothing expects (as lifecycle/machine.py does for managed units).

    queued ──▶ loading ──▶ queued            (a managed backend starting, then its turn)
    queued | loading ──▶ connecting ──▶ first_token (streaming) | generating (whole answer)
    first_token ──▶ streaming                (the first token written)
    first_token | generating ──▶ generating  (a whole answer read from an upstream stream)
    generating ──▶ streaming                 (that stream's first token, counted for TTFT)
    connecting | first_token | generating | streaming ──▶ queued      (failover: another backend)
    connecting | first_token | generating | streaming ──▶ connecting  (asked again: the clamp's
                                                                        retry, the prompt count)
    connecting | first_token | generating | streaming ──▶ draining    (on_client_gone: drain)

`draining` is the last phase: the client has gone and a task of its own reads the upstream
answer to its end (drain.py). A request ends in whatever phase it is in; how it ended is the
outcome (outcome.py), named after that phase when the client left.
"""

from __future__ import annotations

from enum import StrEnum


class Phase(StrEnum):
    """Its value is what the admin API, the dashboard, the metrics' `phase` label and a
    `cancelled_<phase>` outcome show."""

    QUEUED = "queued"  # waiting for a slot
    LOADING = "loading"  # waiting for its managed backend to start (admission/slots.py)
    CONNECTING = "connecting"  # slot held, waiting for the upstream's response headers
    FIRST_TOKEN = "first_token"  # headers in, waiting for the first generated token
    STREAMING = "streaming"  # tokens flowing to the client
    GENERATING = "generating"  # non-streaming: the upstream is generating the whole answer
    DRAINING = "draining"  # the client left; the upstream answer is read to its end (drain.py)


P = Phase

MOVES: dict[Phase, frozenset[Phase]] = {
    P.QUEUED: frozenset({P.QUEUED, P.LOADING, P.CONNECTING}),
    P.LOADING: frozenset({P.LOADING, P.QUEUED, P.CONNECTING}),
    P.CONNECTING: frozenset({P.CONNECTING, P.FIRST_TOKEN, P.GENERATING, P.QUEUED, P.DRAINING}),
    P.FIRST_TOKEN: frozenset({P.STREAMING, P.GENERATING, P.QUEUED, P.CONNECTING, P.DRAINING}),
    P.GENERATING: frozenset({P.GENERATING, P.STREAMING, P.QUEUED, P.CONNECTING, P.DRAINING}),
    P.STREAMING: frozenset({P.STREAMING, P.QUEUED, P.CONNECTING, P.DRAINING}),
    P.DRAINING: frozenset(),
}

START = Phase.QUEUED
FINAL = frozenset(p for p, after in MOVES.items() if not after)  # no move out: draining


class IllegalPhase(RuntimeError):
    def __init__(self, rid: str, phase: Phase, to: Phase) -> None:
        super().__init__(f"request {rid}: no move from phase {phase.value!r} to {to.value!r}")
        self.phase, self.to = phase, to


def next_phase(rid: str, phase: Phase, to: Phase) -> Phase:
    """`to`, if the table allows the move from `phase`; else IllegalPhase."""
    if to not in MOVES[phase]:
        raise IllegalPhase(rid, phase, to)
    return to
