"""The dashboard page at GET /: one self-contained HTML file (ops/static/dashboard.html, inline
CSS and JS, no CDN) that polls /admin/requests and /admin/stats once a second (a front's boxes
drawn as groups around their backends: ops/boxes.py). The page itself
holds no data, so it is served to anyone; the numbers behind it need the admin key when one is
configured (the page asks for it and keeps it in sessionStorage, for that tab only)."""

from __future__ import annotations

from importlib import resources

from aiohttp import web

# The page may talk only to this origin and load nothing from anywhere: a CDN link slipped in
# later would fail loudly in the browser test instead of quietly needing the internet.
_HEADERS = {
    "content-security-policy": (
        "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
        "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; "
        "frame-ancestors 'none'"
    ),
    "x-content-type-options": "nosniff",
    "cache-control": "no-cache",
    "referrer-policy": "no-referrer",
}

_page: bytes | None = None


def _load() -> bytes:
    global _page
    if _page is None:
        _page = resources.files(__package__).joinpath("static/dashboard.html").read_bytes()
    return _page


async def page(request: web.Request) -> web.Response:
    return web.Response(body=_load(), content_type="text/html", charset="utf-8", headers=_HEADERS)
