"""The boxes a front gateway reaches (docs/several-boxes.md), as the admin API and the dashboard
show them: each `kind: peer` backend with whether it answered its last poll, how long ago it was
polled and last answered, its models with their state there, and its backends here
(`box/backend`, the children app/peers.py keeps). Pure: read off the backends' states."""

from __future__ import annotations

from typing import Mapping

from ..policy.routing import BackendState

__all__ = ["box_of", "boxes_view"]


def box_of(b: BackendState) -> str | None:
    """The box a backend here is one of (`box1` for `box1/gpu0`), or None: not a box's."""
    link = b.peer
    return link.parent if link is not None and link.backend else None


def _age(now: float, at: float | None) -> float | None:
    return round(now - at, 3) if at is not None else None


def boxes_view(backends: Mapping[str, BackendState], now: float) -> dict[str, dict]:
    """Box name -> its state. `now`: time.monotonic()."""
    out: dict[str, dict] = {}
    for name, b in backends.items():
        link = b.peer
        if link is None or link.backend or b.cfg.kind != "peer":
            continue
        children = sorted(n for n, c in backends.items() if box_of(c) == name)
        out[name] = {
            "reachable": b.up,
            "last_poll_s_ago": _age(now, link.polled_at),
            "last_answer_s_ago": _age(now, link.answered_at),
            "last_error": b.last_error,
            "models": {m: pm.state for m, pm in sorted(link.models.items())} if b.up else {},
            "backends": children,
        }
    return out
