"""The pure fair queue (admission/fair_queue.py), alone: priority first, round-robin between
keys, FIFO within a key, and removal from anywhere."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from homelab_frontend.admission.fair_queue import FairQueue


class W:
    def __init__(self, key: str, priority: int = 0, n: int = 0) -> None:
        self.key, self.priority, self.n = key, priority, n

    def __repr__(self) -> str:
        return f"{self.key}{self.n}@{self.priority}"


def _drain(q: FairQueue) -> list:
    out = []
    while (w := q.pop()) is not None:
        out.append(w)
    return out


def test_round_robin_between_keys_fifo_within():
    q: FairQueue[W] = FairQueue()
    for w in [W("a", n=1), W("a", n=2), W("a", n=3), W("b", n=1), W("c", n=1), W("b", n=2)]:
        q.push(w)
    assert len(q) == 6 and q.peek() is not None and q.peek().n == 1 and q.peek().key == "a"
    assert [repr(w) for w in _drain(q)] == ["a1@0", "b1@0", "c1@0", "a2@0", "b2@0", "a3@0"]
    assert len(q) == 0 and q.peek() is None and q.pop() is None


def test_priority_first():
    q: FairQueue[W] = FairQueue()
    for w in [W("a", 0, 1), W("b", 5, 1), W("c", 1, 1), W("b", 5, 2)]:
        q.push(w)
    assert [repr(w) for w in _drain(q)] == ["b1@5", "b2@5", "c1@1", "a1@0"]


def test_remove_from_anywhere():
    q: FairQueue[W] = FairQueue()
    ws = [W("a", n=1), W("b", n=1), W("a", n=2)]
    for w in ws:
        q.push(w)
    assert q.remove(ws[1]) and not q.remove(ws[1])  # once
    assert not q.remove(W("zz"))
    assert len(q) == 2 and set(q) == {ws[0], ws[2]}
    assert _drain(q) == [ws[0], ws[2]]


@given(st.lists(st.tuples(st.sampled_from("abcd"), st.integers(0, 2), st.booleans()), max_size=40))
def test_invariants(plan):
    q: FairQueue[W] = FairQueue()
    pushed, removed = [], set()
    for i, (key, prio, drop) in enumerate(plan):
        w = W(key, prio, i)
        q.push(w)
        pushed.append(w)
        if drop and i % 3 == 0:
            assert q.remove(w)
            removed.add(w)
    left = [w for w in pushed if w not in removed]
    assert len(q) == len(left)
    out = _drain(q)
    assert sorted(out, key=id) == sorted(left, key=id)  # every waiter once
    assert [w.priority for w in out] == sorted((w.priority for w in out), reverse=True)  # priority first
    for key in "abcd":  # FIFO within a key and priority
        for prio in range(3):
            mine = [w.n for w in out if w.key == key and w.priority == prio]
            assert mine == sorted(mine)
    # round-robin: within one priority, no key is served twice while another key of that
    # priority, queued before that second serve, still waits
    for prio in range(3):
        seq = [w.key for w in out if w.priority == prio]
        keys = set(seq)
        for i in range(len(seq) - 1):
            if seq[i] == seq[i + 1]:
                assert set(seq[i + 1:]) == {seq[i]} or len(keys) == 1
