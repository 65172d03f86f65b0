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

class Holder(Protocol):
    """The request a slot is taken for (request.tracker.Tracked): its id names a shared lease, the
    queue moves its phase (`queued`, `loading`: the record owns the phase and checks each move),
    its load wait is counted, and a lease that can no longer be vouched for stops it (`cancel`).
    Declared here: admission does not import the request layer."""

    id: str
    load_wait: float

    def queued(self) -> None:
        """Waiting for a slot (not, or no longer, for its managed backend to start)."""

    def loading(self) -> None:
        """Waiting for its managed backend to start."""

    def cancel(self, reason: str, message: str = "") -> bool: ...


class Lease:
    """One held slot, for `holder`; `released` once given back (a second release is a no-op).
    Kept small: the in-process store makes one per request on the hot path."""

    __slots__ = ("holder", "released")

    def __init__(self, holder: Holder | None) -> None:
        self.holder = holder
        self.released = False

    def __repr__(self) -> str:
        who = self.holder.id if self.holder is not None else "?"
        return f"<Lease for {who}{' released' if self.released else ''}>"


class SharedLease(Lease):
    """A slot held in a store shared between replicas (redis_registry.py). `member` names it there;
    `valid_from` is the loop time the last take or renewal covering it was sent (the lease ends no
    earlier than valid_from + lease_s); `bound` is set once the slot is the request's; `fenced`
    once the request was stopped for a lease that could not be vouched for."""

    __slots__ = ("member", "valid_from", "bound", "fenced")

    def __init__(self, holder: Holder | None, member: str, valid_from: float) -> None:
        super().__init__(holder)
        self.member = member
        self.valid_from = valid_from
        self.bound = False
        self.fenced = False

    def __repr__(self) -> str:
        who = self.holder.id if self.holder is not None else "?"
        return f"<Lease {self.member} for {who}{' released' if self.released else ''}>"
