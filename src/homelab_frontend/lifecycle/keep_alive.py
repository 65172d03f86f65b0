"""A client's `keep_alive` for a managed backend: how long its server stays up idle. Pure.

Ollama's clients say how long their model should stay loaded after a request: `keep_alive`, a
number of seconds or a Go duration ("5m", "1h30m", "300ms"), negative for forever, 0 to unload
now. Ollama honours it only on its own API (its `/v1` ignores it: ollama#11458, #9355), so clients
that want it there send it in the body anyway; the gateway reads it in every dialect's body
(surfaces/keep_alive.py) and it means the same everywhere.

What it does (policy.py's idle stop reads the result as the unit's `idle_ttl_s`):
- a duration replaces the backend's `run.idle_ttl_s` from this request on, until a request says
  otherwise (a request without `keep_alive` leaves it as it is: one client's lifetime is not
  undone by another client that never heard of the field); counted, like `idle_ttl_s`, from the
  end of the last request;
- negative: no idle stop (it is still swapped out to make room, or stopped by the operator);
- 0 with a prompt: stopped as soon as it is idle after this request (a TTL of 0); 0 without one
  (Ollama's unload, Open WebUI's `{"prompt": "", "keep_alive": 0}`): drained and stopped now;
- the operator bounds it per backend (`run.client_keep_alive`): `max_s` caps what a client may ask
  (forever included), `honour: false` ignores the field altogether. The cap is applied when the
  TTL is read, so a reload that lowers it takes effect on a value asked before.
"""

from __future__ import annotations

import re

from ..config import ClientKeepAlive

_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


class Forever:
    """A negative keep_alive: no idle stop."""

    def __repr__(self) -> str:
        return "FOREVER"


FOREVER = Forever()


def seconds(v: object) -> float | Forever:
    """Ollama's keep_alive in seconds: a number, or a Go duration string ("5m", "1h30m", "-1",
    "300ms"); FOREVER when negative. ValueError (its message says what is accepted) otherwise."""
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        raise ValueError(f'expected a duration ("5m", "1h") or a number of seconds, got {type(v).__name__}')
    if isinstance(v, str):
        text = v.strip()
        try:
            v = float(text)
        except ValueError:
            sign = -1.0 if text.startswith("-") else 1.0
            body = text.lstrip("+-")
            parts = _DURATION.findall(body)
            if not body or "".join(n + u for n, u in parts) != body:
                raise ValueError(f'expected a duration such as "5m", "1h30m", "300ms" or "-1", got {v!r}'[:200]) from None
            v = sign * sum(float(n) * _UNIT_S[u] for n, u in parts)
    if v != v or v in (float("inf"), float("-inf")):
        raise ValueError(f"expected a finite number of seconds, got {v}")
    return FOREVER if v < 0 else float(v)


def idle_ttl(asked: float | Forever | None, rule: ClientKeepAlive, default: float | None) -> float | None:
    """The idle time a backend gets: `default` (its `run.idle_ttl_s`) when no client asked or the
    operator ignores clients, else what was asked within `rule.max_s`. None: no idle stop."""
    if asked is None or not rule.honour:
        return default
    if isinstance(asked, Forever):
        return rule.max_s
    return asked if rule.max_s is None else min(asked, rule.max_s)


def unloads(asked: float | Forever | None, rule: ClientKeepAlive, *, prompt: bool) -> bool:
    """Whether this request unloads the model now: `keep_alive: 0` without a prompt (Ollama's
    unload), when the operator honours clients."""
    return rule.honour and not prompt and asked == 0
