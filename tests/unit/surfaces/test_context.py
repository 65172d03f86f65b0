"""What a surface handler sees of the gateway (surfaces/context.py): the Protocol declares
nothing that app.gateway.Gateway, its one implementation, lacks."""

from __future__ import annotations

import asyncio
import typing

import pytest

from homelab_frontend import config as cfgmod
from homelab_frontend.app.gateway import Gateway
from homelab_frontend.surfaces.context import Gateway as SurfaceGateway


def _cfg(tmp_path) -> cfgmod.Config:
    return cfgmod.parse({
        "backends": {"gpu0": {"url": "http://127.0.0.1:9/gpu0/v1", "slots": 2}},
        "models": {"m": {"backends": ["gpu0"]}},
        "responses": {"store": {"path": str(tmp_path / "responses.sqlite3")}},
    })


@pytest.fixture
def gw(tmp_path):
    async def make():
        return Gateway(_cfg(tmp_path))
    loop = asyncio.new_event_loop()
    g = loop.run_until_complete(make())
    yield g
    loop.run_until_complete(g.close())
    loop.close()


def test_the_gateway_has_everything_the_protocol_declares(gw):
    protocol = SurfaceGateway
    # names a Protocol imports only for the checker (TYPE_CHECKING) resolve to anything here
    declared = set(typing.get_type_hints(protocol, include_extras=False, localns={
        "ResponsesState": object, "Metrics": object, "Registry": object}))
    declared |= {n for n, v in vars(protocol).items()
                 if (callable(v) or isinstance(v, property)) and not n.startswith("_")}
    assert {"cfg", "tracker", "signer", "responses", "hold", "parse"} <= declared  # the fields and the methods both read
    missing = {n for n in declared if not hasattr(gw, n)}
    assert not missing, missing
