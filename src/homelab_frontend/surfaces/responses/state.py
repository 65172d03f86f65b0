"""The Responses surface's share of the gateway: the reasoning sealer and the response store,
made once per gateway (app/gateway.py) and read by the handler as `gw.responses`. Apart from the
handler so that `surfaces.context`, which declares it, imports no handler. Only glue (the
sealer and the stores have their own unit tests)."""

from __future__ import annotations

from typing import Any, Protocol

from ... import config as cfgmod
from ..signature import ThinkingSigner
from .sealed import ReasoningSealer
from .store import RedisStore, SqliteStore


class _Owner(Protocol):  # what of the gateway the state is made from
    cfg: cfgmod.Config
    signer: ThinkingSigner
    cluster: Any


class ResponsesState:
    def __init__(self, gw: _Owner) -> None:
        self.sealer = ReasoningSealer(gw.signer)
        cfg = gw.cfg.responses.store
        self.store = RedisStore(cfg, gw.cluster.client) if gw.cluster is not None else SqliteStore(cfg)

    async def close(self) -> None:
        await self.store.close()
