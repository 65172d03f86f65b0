"""What the operator endpoints see of the gateway (ops/context.py): the Protocol declares nothing
that app.gateway.Gateway lacks, and a handler finds the gateway under OPS_GATEWAY."""

from __future__ import annotations

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from support.gateway_views import a_gateway, declared

from homelab_frontend.ops.context import OPS_GATEWAY, OpsGateway, gateway


@pytest.fixture
def gw(tmp_path):
    yield from a_gateway(tmp_path)


def test_the_gateway_has_everything_the_protocol_declares(gw):
    names = declared(OpsGateway)
    assert {"cfg", "tracker", "usage", "fleet", "metrics", "reload", "refresh_running"} <= names  # the fields and the methods both read
    missing = {n for n in names if not hasattr(gw, n)}
    assert not missing, missing


def test_a_handler_finds_the_gateway_its_app_was_given(gw):
    app = web.Application()
    app[OPS_GATEWAY] = gw
    assert gateway(make_mocked_request("GET", "/admin/requests", app=app)) is gw
    with pytest.raises(KeyError):
        gateway(make_mocked_request("GET", "/admin/requests", app=web.Application()))
