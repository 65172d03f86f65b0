"""admission/lease.py: the lease is the one link between a held slot and its request. What the
in-process store does with it is the contract every store keeps: the lease names its holder (the
request record, not whichever task ran `acquire`), and giving back a lease twice gives back one
slot, never a slot another request holds."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from homelab_frontend.admission.lease import Lease, SharedLease
from homelab_frontend.admission.slots import SlotPool


class _Holder:
    def __init__(self, rid: str) -> None:
        self.id = rid
        self.phase = "queued"
        self.load_wait = 0.0

    def queued(self) -> None:
        self.phase = "queued"

    def loading(self) -> None:
        self.phase = "loading"

    def cancel(self, reason: str, message: str = "") -> bool:
        return True


def test_a_lease_names_its_holder_and_says_when_it_was_given_back():
    lease = Lease(_Holder("req_1"))
    assert lease.holder.id == "req_1" and not lease.released
    assert repr(lease) == "<Lease for req_1>"
    lease.released = True
    assert repr(lease) == "<Lease for req_1 released>"
    assert repr(Lease(None)) == "<Lease for ?>"


def test_a_shared_lease_starts_unbound_and_unfenced_and_names_its_member():
    lease = SharedLease(_Holder("req_2"), "replica-a:7", 12.5)
    assert (lease.member, lease.valid_from, lease.bound, lease.fenced, lease.released) == ("replica-a:7", 12.5, False, False, False)
    assert repr(lease) == "<Lease replica-a:7 for req_2>"


def test_the_holder_passed_to_acquire_rides_on_the_lease_whatever_task_runs_it():
    async def main():
        pool = SlotPool("b", 1, 4, 5.0)
        holder = _Holder("req_3")
        # wait_for runs the acquire in a task of its own: the lease still names the request
        return await asyncio.wait_for(pool.acquire("k", 0, holder), 1.0), holder

    lease, holder = asyncio.run(main())
    assert lease.holder is holder


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["take", "give"]), st.integers(0, 5)), max_size=30))
def test_a_lease_given_back_any_number_of_times_frees_exactly_one_slot(ops):
    async def main():
        pool = SlotPool("b", 6, 0, 5.0)
        leases: list[Lease] = []
        for op, i in ops:
            if op == "take" and pool.in_use < pool.slots:
                leases.append(await pool.acquire("k", 0, _Holder(f"req_{len(leases)}")))
            elif op == "give" and leases:
                pool.release(leases[i % len(leases)])
            assert pool.in_use == sum(not lease.released for lease in leases)

    asyncio.run(main())
