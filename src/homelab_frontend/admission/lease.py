"""A slot lease: what a slot store's `acquire` hands its caller and its `release` takes back.

The lease is the only link between a held slot and the request holding it. Nothing in admission
looks a request up by its asyncio task: the task that happens to run an `acquire` is not always
the request's own (Python 3.11's `asyncio.wait_for` runs its awaitable in a task of its own), so
a binding by task can tie a slot to nobody, give back another request's slot, or leave a request
that must be stopped out of reach. The caller passes its request record (`Holder`) in, keeps the
lease, and gives back exactly that lease, once (a second release is a no-op).
"""

from __future__ import annotations

from typing import Protocol

# The request record's phases while it waits (request.tracker uses the same words).
QUEUED = "queued"
LOADING = "loading"  # its managed backend is starting


class Holder(Protocol):
    """The request a slot is taken for (request.tracker.Tracked): its id names a shared lease, its
    phase shows where it waits, its load wait is counted, and a lease that can no longer be
    vouched for stops it (`cancel`). Declared here: admission does not import the request layer."""

    id: str
    phase: str
    load_wait: float

    def cancel(self, reason: str, message: str = "") -> bool: ...


class Lease:
    """One held slot. `member` names it in a shared store (redis_leases.py); `valid_from` is the
    loop time the last take or renewal covering it was sent (the lease ends no earlier than
    valid_from + lease_s); `bound` is set once the slot is the request's; `fenced` once the
    request was stopped for a lease that could not be vouched for."""

    __slots__ = ("holder", "member", "valid_from", "bound", "fenced", "released")

    def __init__(self, holder: Holder | None, member: str = "", valid_from: float = 0.0) -> None:
        self.holder = holder
        self.member = member
        self.valid_from = valid_from
        self.bound = True
        self.fenced = False
        self.released = False

    def __repr__(self) -> str:
        who = self.holder.id if self.holder is not None else "?"
        return f"<Lease {self.member or 'local'} for {who}{' released' if self.released else ''}>"
