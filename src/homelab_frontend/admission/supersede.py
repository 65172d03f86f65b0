"""Latest wins: a client's new completion on a `supersede: true` model replaces its previous one.

An editor sends a completion at every pause in typing, and each one makes the one before it stale.
Whether or not the editor aborts the old request, it must not keep a slot (or a queue place) in
front of the one the user now waits for. So admission keeps, per (client, model), the cancel
handle of that client's newest completion; a new one cancels the previous handle before it asks
for a slot itself.

The cancel is the request's own cancellation path (request/exchange.py: the handler task is
cancelled with a reason): a request still queued leaves the queue (slots.WaitQueue.wait takes it
out) and never reaches the backend; one generating has its upstream connection closed at once
(leaving the Exchange), which is how the backend learns to stop, and its slot goes back. The
old request's client gets an error in its dialect saying it was superseded (a 400: an SDK must not
retry it, which would supersede the newer one in turn).

A client is its API key's name and its address together (the address as believed: behind a
reverse proxy listed in `connections.trusted_proxies`, the one the proxy forwards for, never the
proxy's own; policy/forwarded.py): two people sharing a key, or behind one proxy, are two clients
(surfaces/completions/handler.py `client_of` says why, and what it gives up). Only the completion
surfaces register here: chat and agent requests are never superseded.

This is the rule within one gateway process. With a `cluster:` section, redis_supersede.py applies
it across replicas (a newer completion on any replica cancels the older one wherever it runs).
"""

from __future__ import annotations

import asyncio
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, AsyncIterator, Protocol

MESSAGE = "superseded: a newer completion from the same client replaced this one"


# How long a new completion waits for the one it cancelled to end, at most. The old one gives
# back its key's concurrency hold (`max_concurrent`) and its slot as it ends, which the new one
# needs anyway; a queued one ends at once, a generating one once its upstream is closed.
END_WAIT_S = 1.0


class Cancellable(Protocol):
    """What a request's record offers (request.tracker.Tracked): its `id` for the log, `cancel`,
    and the `task` running it (None: nothing to wait for), which `wait_ended` waits on."""

    @property
    def id(self) -> str: ...

    @property
    def task(self) -> asyncio.Task[Any] | None: ...

    def cancel(self, reason: str, message: str = "") -> bool: ...


class LatestWins(Protocol):
    """What a completion surface registers with: this class, or, with a `cluster:` section,
    redis_supersede.SharedSupersede (the same rule across replicas)."""

    def latest(self, client: str, model: str, handle: Cancellable) -> AbstractAsyncContextManager[None]: ...


async def wait_ended(prev: Cancellable) -> None:
    """Let the cancelled `prev` end (at most END_WAIT_S): see `Supersede.latest`."""
    task = prev.task
    if task is not None and not task.done() and task is not asyncio.current_task():
        await asyncio.wait((task,), timeout=END_WAIT_S)
    else:
        await asyncio.sleep(0)


class Supersede:
    """(client, model) -> the newest completion's cancel handle. Holds only running requests:
    each one forgets itself when it ends (if it is still the newest)."""

    __slots__ = ("_latest", "superseded")

    def __init__(self) -> None:
        self._latest: dict[tuple[str, str], Cancellable] = {}
        self.superseded = 0  # how many requests were cancelled this way (a figure for the operator)

    def __len__(self) -> int:
        return len(self._latest)

    def replace(self, client: str, model: str, handle: Cancellable) -> Cancellable | None:
        """Record `handle` as the client's newest completion on `model`; cancel the one before
        it, if it still runs. -> the one cancelled, if any (`latest` waits for it to end)."""
        key = (client, model)
        prev = self._latest.get(key)
        self._latest[key] = handle
        if prev is None or prev is handle:
            return None
        if prev.cancel("superseded", MESSAGE):
            self.superseded += 1
            return prev
        return None

    def done(self, client: str, model: str, handle: Cancellable) -> None:
        key = (client, model)
        if self._latest.get(key) is handle:
            del self._latest[key]

    @asynccontextmanager
    async def latest(self, client: str, model: str, handle: Cancellable) -> AsyncIterator[None]:
        """For the block: `handle` is the newest; the previous one is cancelled first, and this
        one goes on once it has ended (at most END_WAIT_S): a queued one has left the queue, a
        generating one has given back its slot and its key's concurrency hold, so this one
        queues behind no stale work and is not refused for the key's `max_concurrent`."""
        prev = self.replace(client, model, handle)
        if prev is not None:
            await wait_ended(prev)
        try:
            yield
        finally:
            self.done(client, model, handle)
