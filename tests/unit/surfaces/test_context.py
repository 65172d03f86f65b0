"""What a surface handler sees of the gateway (surfaces/context.py): the Protocol declares
nothing that app.gateway.Gateway, its one implementation, lacks."""

from __future__ import annotations

import pytest

from support.gateway_views import a_gateway, declared

from homelab_frontend.surfaces.context import Gateway as SurfaceGateway


@pytest.fixture
def gw(tmp_path):
    yield from a_gateway(tmp_path)


def test_the_gateway_has_everything_the_protocol_declares(gw):
    names = declared(SurfaceGateway)
    assert {"cfg", "tracker", "signer", "responses", "hold", "parse"} <= names  # the fields and the methods both read
    missing = {n for n in names if not hasattr(gw, n)}
    assert not missing, missing
