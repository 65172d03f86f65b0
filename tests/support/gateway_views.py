"""The gateway as the layers above it see it: surfaces/context.py and ops/context.py each declare a
Protocol of what they read of app.gateway.Gateway, their one implementation. A unit test makes a
real Gateway (no socket, no backend reached) and checks that it has every declared member."""

from __future__ import annotations

import asyncio
import typing
from collections.abc import Iterator
from pathlib import Path

from homelab_frontend import config as cfgmod
from homelab_frontend.app.gateway import Gateway


def a_gateway(tmp_path: Path) -> Iterator[Gateway]:
    """A fixture's body: a Gateway over one unreachable backend, closed afterwards."""
    cfg = cfgmod.parse({
        "backends": {"gpu0": {"url": "http://127.0.0.1:9/gpu0/v1", "slots": 2}},
        "models": {"m": {"backends": ["gpu0"]}},
        "responses": {"store": {"path": str(tmp_path / "responses.sqlite3")}},
    })

    async def make() -> Gateway:
        return Gateway(cfg)
    loop = asyncio.new_event_loop()
    g = loop.run_until_complete(make())
    yield g
    loop.run_until_complete(g.close())
    loop.close()


def declared(protocol: type) -> set[str]:
    """The fields and the public methods and properties a Protocol declares."""
    # names a Protocol imports only for the checker (TYPE_CHECKING) resolve to anything here
    names = set(typing.get_type_hints(protocol, include_extras=False, localns={
        "ResponsesState": object, "Metrics": object, "Registry": object}))
    return names | {n for n, v in vars(protocol).items()
                    if (callable(v) or isinstance(v, property)) and not n.startswith("_")}
