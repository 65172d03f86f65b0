"""Passive health: a backend's real requests say it is down before its probe does.

The probe (ops/health.py, every `health_interval_s`) is slow to notice a backend that died: until
then every request chosen for it fails (or fails over, request/failover.py). So connection
failures on real requests count too:

- `THRESHOLD` (2) consecutive connection failures (refused, unreachable, a connect timeout, or a
  reset right after connecting) mark the backend down at once. One is not enough: a single dropped
  connection (a keep-alive race, a listener's backlog overflowing) is not a dead server. Any answer
  from the backend (whatever its status) proves it reachable and clears the count.
- A backend marked down that way is probed again soon, with backoff: `BASE_S`, doubled per probe
  that still fails, capped at its `health_interval_s`. It is taken back when a probe answers.

Hysteresis, so a backend that answers its probe but fails every request does not flap the pool:
each mark-down is a strike, kept when the probe brings the backend back. With a strike on its
record, one failure (not two) marks it down again, and each strike doubles the first re-probe's
delay (and raises its cap, to at most 8 health intervals). Only a real request that the backend
answered with a success clears the strikes. Such a backend is then given one request (which fails
over elsewhere) per ever longer down period, instead of failing every other request.

Pure: no clock, no I/O; the gateway's probe loop (app/gateway.py) asks `next_probe_s` how long to
wait, and tells `probed` what the probe found.
"""

from __future__ import annotations

THRESHOLD = 2  # consecutive connection failures on requests that mark a backend down
BASE_S = 0.5  # the first re-probe after a mark-down
MAX_CAP_INTERVALS = 8  # strikes raise the re-probe cap to at most this many health intervals


class PassiveHealth:
    __slots__ = ("threshold", "fails", "strikes", "probe_fails")

    def __init__(self, threshold: int = THRESHOLD) -> None:
        self.threshold = threshold
        self.fails = 0  # consecutive connection failures on requests
        self.strikes = 0  # mark-downs since a request last succeeded there
        self.probe_fails = 0  # failed probes since the last mark-down

    @property
    def suspect(self) -> bool:
        """Marked down by its requests at least once since one last succeeded."""
        return self.strikes > 0

    def connection_failed(self) -> bool:
        """A request could not connect (or was reset before an answer). -> True when this marks
        the backend down now."""
        self.fails += 1
        if self.fails < (1 if self.strikes else self.threshold):
            return False
        self.fails = 0
        self.strikes += 1
        self.probe_fails = 0
        return True

    def answered(self, ok: bool) -> None:
        """The backend answered a request: with a success (`ok`), or an error status, which
        proves it reachable but not that it serves."""
        self.fails = 0
        if ok:
            self.strikes = 0

    def probed(self, ok: bool) -> None:
        self.probe_fails = 0 if ok else self.probe_fails + 1

    def next_probe_s(self, interval_s: float) -> float:
        """How long until the next probe of a backend its requests marked down."""
        if not self.strikes:
            return interval_s
        cap = interval_s * min(2 ** (self.strikes - 1), MAX_CAP_INTERVALS)
        return min(cap, BASE_S * 2 ** min(self.probe_fails + self.strikes - 1, 30))
