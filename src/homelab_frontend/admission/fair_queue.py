"""Who goes next: the pure fair queue in front of a backend's slots (no I/O, no clock, no slots).

Highest priority first; within a priority, round-robin between keys (a key that was just served
goes behind the others, so one key's burst cannot starve another); FIFO within a key. The slot
stores (`slots.SlotPool` in process, `redis_slot_pool.RedisSlotPool` across replicas) decide *when*
a slot is free and perform the grant; this decides only *whom* it goes to.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from typing import Generic, Hashable, Iterator, Protocol, TypeVar


class Queued(Protocol):
    key: Hashable  # an API key's name ("" for anonymous)
    priority: int


W = TypeVar("W", bound=Queued)


class FairQueue(Generic[W]):
    __slots__ = ("_by_prio", "_len")

    def __init__(self) -> None:
        # priority -> key -> that key's waiters; keys rotate to the back when served
        self._by_prio: dict[int, OrderedDict[Hashable, deque[W]]] = {}
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def push(self, w: W) -> None:
        by_key = self._by_prio.get(w.priority)
        if by_key is None:
            by_key = self._by_prio[w.priority] = OrderedDict()
        by_key.setdefault(w.key, deque()).append(w)
        self._len += 1

    def remove(self, w: W) -> bool:
        """Take `w` out wherever it waits (it left: a timeout, a cancel). False if not queued."""
        by_key = self._by_prio.get(w.priority)
        if by_key is None or w.key not in by_key:
            return False
        d = by_key[w.key]
        try:
            d.remove(w)
        except ValueError:
            return False
        self._len -= 1
        if not d:
            del by_key[w.key]
            if not by_key:
                del self._by_prio[w.priority]
        return True

    def peek(self) -> W | None:
        """The one `pop` would return, left in place."""
        if not self._by_prio:
            return None
        by_key = self._by_prio[max(self._by_prio)]
        return next(iter(by_key.values()))[0]

    def pop(self) -> W | None:
        if not self._by_prio:
            return None
        prio = max(self._by_prio)
        by_key = self._by_prio[prio]
        key, d = next(iter(by_key.items()))
        w = d.popleft()
        self._len -= 1
        if d:
            by_key.move_to_end(key)  # round-robin: this key waits behind the others now
        else:
            del by_key[key]
            if not by_key:
                del self._by_prio[prio]
        return w

    def __iter__(self) -> Iterator[W]:
        """Every waiter, in no promised order (for failing them all)."""
        for by_key in self._by_prio.values():
            for d in by_key.values():
                yield from d
