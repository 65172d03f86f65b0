"""surfaces/error_status.py: which upstream statuses a client sees as themselves."""

from __future__ import annotations

import pytest

from homelab_frontend.errors import GatewayError
from homelab_frontend.surfaces.error_status import upstream_client_status


@pytest.mark.parametrize("kind, status, shown", [
    ("timeout", None, 504),
    ("timeout", 500, 504),
    ("upstream_error", 400, 400),
    ("upstream_error", 422, 400),
    ("upstream_error", 404, 404),
    ("upstream_error", 413, 413),
    ("upstream_error", 429, 429),
    ("upstream_error", 408, 504),
    ("upstream_error", 503, 503),
    ("upstream_error", 401, 502),  # the gateway's own credentials: never the client's 401
    ("upstream_error", 403, 502),
    ("upstream_error", 302, 502),
])
def test_statuses(kind, status, shown):
    assert upstream_client_status(GatewayError(kind, "x", status=status)) == shown
