"""The dashboard page at GET /."""

from __future__ import annotations

from aiohttp import web

_PAGE = """<!doctype html><html><head><meta charset="utf-8"><title>homelab-frontend</title></head>
<body><h1>homelab-frontend</h1><p>The gateway is running. See <a href="/admin/requests">/admin/requests</a>.</p></body></html>"""


async def page(request: web.Request) -> web.Response:
    return web.Response(text=_PAGE, content_type="text/html")
