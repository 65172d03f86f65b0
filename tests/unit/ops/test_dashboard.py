"""The dashboard page (ops/dashboard.py): shipped in the package, self-contained, locked down."""

from __future__ import annotations

import asyncio
import re

from aiohttp.test_utils import make_mocked_request

from homelab_frontend.ops import dashboard


def test_the_page_is_served_with_a_policy_that_allows_nothing_from_elsewhere():
    resp = asyncio.run(dashboard.page(make_mocked_request("GET", "/")))
    body = resp.body.decode()
    assert resp.status == 200 and resp.content_type == "text/html"
    csp = resp.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "connect-src 'self'" in csp and "frame-ancestors 'none'" in csp
    assert resp.headers["x-content-type-options"] == "nosniff"
    assert "/admin/requests" in body and "/admin/stats" in body  # what it polls
    # no external resource: no src/href to another origin
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", body)
