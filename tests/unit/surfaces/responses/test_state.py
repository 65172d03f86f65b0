"""The Responses surface's share of the gateway (surfaces/responses/state.py): its reasoning
sealer keyed from the gateway's signer, and its store: SQLite on this box, Redis through the
cluster registry's client when there is a cluster."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from homelab_frontend import config as cfgmod
from homelab_frontend.surfaces.responses.sealed import ReasoningSealer
from homelab_frontend.surfaces.responses.state import ResponsesState
from homelab_frontend.surfaces.responses.store import RedisStore, SqliteStore
from homelab_frontend.surfaces.signature import ThinkingSigner


def _cfg(tmp_path) -> cfgmod.Config:
    return cfgmod.parse({"responses": {"store": {"path": str(tmp_path / "responses.sqlite3"), "ttl_s": 120}}})


def test_without_a_cluster_the_store_is_sqlite_at_the_configured_path(tmp_path):
    async def main() -> None:
        state = ResponsesState(SimpleNamespace(cfg=_cfg(tmp_path), signer=ThinkingSigner(b"k"), cluster=None))
        assert isinstance(state.store, SqliteStore)
        assert state.store.path == str(tmp_path / "responses.sqlite3") and state.store.ttl_s == 120
        await state.close()

    asyncio.run(main())


def test_the_sealer_is_keyed_by_the_gateways_secret(tmp_path):
    async def main() -> None:
        state = ResponsesState(SimpleNamespace(cfg=_cfg(tmp_path), signer=ThinkingSigner(b"k"), cluster=None))
        blob = state.sealer.seal("plan")
        assert ReasoningSealer(ThinkingSigner(b"k")).open(blob) == "plan"  # a replica with the same secret
        assert ReasoningSealer(ThinkingSigner(b"other")).open(blob) is None
        await state.close()

    asyncio.run(main())


class _RedisClient:
    """The cluster registry's client as the store uses it at construction: scripts registered."""

    def __init__(self) -> None:
        self.scripts: list[str] = []

    def register_script(self, source: str):
        self.scripts.append(source)
        return object()


def test_with_a_cluster_the_store_is_redis_on_the_registrys_client(tmp_path):
    async def main() -> None:
        client = _RedisClient()
        state = ResponsesState(SimpleNamespace(cfg=_cfg(tmp_path), signer=ThinkingSigner(b"k"),
                                               cluster=SimpleNamespace(client=client)))
        assert isinstance(state.store, RedisStore) and state.store.client is client
        assert state.store.ttl_ms == 120_000 and len(client.scripts) == 2
        await state.close()
        assert not (tmp_path / "responses.sqlite3").exists()  # no local store was made

    asyncio.run(main())
