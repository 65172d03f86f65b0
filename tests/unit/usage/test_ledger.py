"""usage/ledger.py: the budgets the ledger checks at admission and reports, over a store that
answers what a key has used (a stand-in here: the stores have their own tests)."""

from __future__ import annotations

import asyncio

import pytest

from homelab_frontend import config as cfgmod
from homelab_frontend.errors import GatewayError
from homelab_frontend.usage.ledger import Ledger


class UsedStore:
    """What the ledger asks of a store for budgets: tokens used today and this month, per key."""

    def __init__(self, used: dict[str, tuple[int, int]]) -> None:
        self.used = used

    async def used_tokens(self, key: str, now: float) -> tuple[int, int]:
        return self.used.get(key, (0, 0))


def _ledger(tmp_path, used) -> Ledger:
    cfg = cfgmod.parse({
        "backends": {"b": {"url": "http://127.0.0.1:9/v1"}}, "models": {"m": {"backend": "b"}},
        "usage": {"path": str(tmp_path / "usage.sqlite3")},
        "auth": {"keys": [
            {"name": "daily", "key": "k1", "budget": {"tokens_per_day": 1000}},
            {"name": "monthly", "key": "k2", "budget": {"tokens_per_month": 5000}},
            {"name": "free", "key": "k3"},
            {"name": "zero", "key": "k4", "budget": {}},  # a budget of nothing is no budget
        ]},
    })
    ledger = Ledger(cfg)
    ledger.store = UsedStore(used)
    return ledger


def test_only_keys_with_a_limit_are_budgeted(tmp_path):
    ledger = _ledger(tmp_path, {})
    assert [k for k in ("daily", "monthly", "free", "zero") if ledger.budgeted(k)] == ["daily", "monthly"]


def test_a_key_past_its_budget_gets_the_429_others_pass(tmp_path):
    ledger = _ledger(tmp_path, {"daily": (1000, 1000), "monthly": (0, 4999), "free": (10**9, 10**9)})

    async def main():
        with pytest.raises(GatewayError) as e:
            await ledger.check("daily")
        assert e.value.kind == "rate_limit" and e.value.retry_after and 0 < e.value.retry_after <= 86400
        await ledger.check("monthly")  # one token left
        await ledger.check("free")  # no budget, however much it used
        await ledger.check("nobody")

    asyncio.run(main())


def test_budget_status_lists_the_budgeted_keys_or_one(tmp_path):
    ledger = _ledger(tmp_path, {"daily": (250, 900), "monthly": (10, 4200)})

    async def main():
        every = await ledger.budget_status()
        assert [(s["key"], s["used_today"], s["used_this_month"]) for s in every] == \
            [("daily", 250, 900), ("monthly", 10, 4200)]
        assert [s["key"] for s in await ledger.budget_status("monthly")] == ["monthly"]
        assert await ledger.budget_status("free") == []

    asyncio.run(main())


def test_a_reload_changes_the_budgets_not_the_counts(tmp_path):
    ledger = _ledger(tmp_path, {"free": (700, 700)})
    store = ledger.store
    ledger.configure(cfgmod.parse({
        "backends": {"b": {"url": "http://127.0.0.1:9/v1"}}, "models": {"m": {"backend": "b"}},
        "auth": {"keys": [{"name": "free", "key": "k3", "budget": {"tokens_per_day": 500}}]},
    }))
    assert ledger.store is store and ledger.budgeted("free") and not ledger.budgeted("daily")
    with pytest.raises(GatewayError):
        asyncio.run(ledger.check("free"))
