"""The upstream client (upstream/client.py) against a real aiohttp server in this process on
127.0.0.1: error statuses as UpstreamFailure with the backend's own message, its Retry-After and
no redirect followed; JSON and text reads and their failures; the announced keep-alive learnt;
the configured key sent."""

from __future__ import annotations

import asyncio
import socket

import pytest
from aiohttp import web

from support.local_http import serve

from homelab_frontend.config import Backend
from homelab_frontend.errors import GatewayError
from homelab_frontend.upstream.client import UpstreamClient, UpstreamFailure, _error_text


def run(routes: list[web.RouteDef], body, **backend) -> None:
    async def main() -> None:
        async with serve(*routes) as url:
            client = UpstreamClient("gpu0", Backend(url=url, **backend))
            try:
                await body(client)
            finally:
                await client.close()

    asyncio.run(main())


@pytest.mark.parametrize("raw,text", [
    (b'{"error": {"message": "model busy", "type": "x"}}', "model busy"),
    (b'{"error": "model not found"}', "model not found"),
    (b'{"message": "bad request"}', "bad request"),
    (b'{"detail": "Not Found"}', "Not Found"),
    (b"<html>502 Bad Gateway</html>\n", "<html>502 Bad Gateway</html>"),
    (b"  ", "(empty body)"),
    (b"[1, 2]", "[1, 2]"),
])
def test_the_error_text_is_the_upstreams_own_message(raw, text):
    assert _error_text(raw) == text


def test_an_error_status_is_an_upstream_failure_with_the_backends_message_and_retry_after():
    async def busy(request: web.Request) -> web.Response:
        return web.json_response({"error": {"message": "too many requests"}}, status=503,
                                 headers={"Retry-After": "7"})

    async def body(client: UpstreamClient) -> None:
        with pytest.raises(UpstreamFailure) as err:
            await client.post("/chat/completions", b"{}")
        e = err.value
        assert (e.kind, e.cause, e.upstream_status, e.status, e.retry_after) == ("upstream_error", "status", 503, 503, 7.0)
        assert e.message == "backend 'gpu0' answered 503: too many requests"
        assert "127.0.0.1" not in e.message

    run([web.post("/v1/chat/completions", busy)], body)


def test_a_redirect_is_not_followed_and_is_a_502():
    async def moved(request: web.Request) -> web.Response:
        raise web.HTTPFound("/elsewhere")

    async def body(client: UpstreamClient) -> None:
        with pytest.raises(UpstreamFailure) as err:
            await client.post("/chat/completions", b"{}")
        assert (err.value.upstream_status, err.value.status, err.value.retry_after) == (302, 502, None)

    run([web.post("/v1/chat/completions", moved)], body)


def test_a_2xx_answer_is_returned_with_the_body_and_key_sent(monkeypatch):
    seen = {}

    async def echo(request: web.Request) -> web.Response:
        seen.update(body=await request.read(), auth=request.headers.get("authorization"),
                    ua=request.headers.get("user-agent"))
        return web.json_response({"ok": True}, headers={"Keep-Alive": "timeout=5, max=100"})

    async def body(client: UpstreamClient) -> None:
        resp = await client.post("/chat/completions", b'{"model": "m"}')
        assert await client.read_all(resp) == b'{"ok": true}'
        assert seen == {"body": b'{"model": "m"}', "auth": "Bearer sk-upstream", "ua": None}
        assert client.keepalive_s == 4.0  # a second before the upstream would close it

    monkeypatch.setenv("HLF_TEST_UPSTREAM_KEY", "sk-upstream")
    run([web.post("/v1/chat/completions", echo)], body, api_key_env="HLF_TEST_UPSTREAM_KEY")


def test_get_json_reads_under_the_base_and_says_what_went_wrong():
    async def models(request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "m"}]})

    async def broken(request: web.Request) -> web.Response:
        return web.Response(text="nope", status=500)

    async def html(request: web.Request) -> web.Response:
        return web.Response(text="<html>", content_type="text/html")

    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(2)
        return web.json_response({})

    async def body(client: UpstreamClient) -> None:
        assert await client.get_json("/models") == {"data": [{"id": "m"}]}
        with pytest.raises(GatewayError, match="backend 'gpu0' answered 500 to /broken"):
            await client.get_json("/broken")
        with pytest.raises(GatewayError, match=r"backend 'gpu0': /html is not JSON"):
            await client.get_json("/html")
        with pytest.raises(UpstreamFailure) as err:
            await client.get_json("/slow", timeout_s=0.2)
        assert err.value.cause == "timeout" and "did not answer /slow within 0.2 s" in err.value.message

    run([web.get("/v1/models", models), web.get("/v1/broken", broken), web.get("/v1/html", html),
         web.get("/v1/slow", slow)], body)


def test_get_text_reads_at_the_server_root():
    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text="vllm:num_requests_running 2\n")

    async def body(client: UpstreamClient) -> None:
        assert client.root + "/v1" == client.base
        assert await client.get_text("/metrics") == "vllm:num_requests_running 2\n"
        with pytest.raises(GatewayError, match="answered 404 to /v1/metrics"):
            await client.get_text("/v1/metrics")

    run([web.get("/metrics", metrics)], body)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_nothing_listening_is_unreachable_without_the_address():
    async def main() -> None:
        client = UpstreamClient("gpu0", Backend(url=f"http://127.0.0.1:{_free_port()}/v1"))
        try:
            for call in (client.post("/chat/completions", b"{}"), client.get_json("/models"), client.get_text("/metrics")):
                with pytest.raises(UpstreamFailure) as err:
                    await call
                assert (err.value.kind, err.value.cause) == ("upstream_unreachable", "unreachable")
                assert err.value.message == "backend 'gpu0' is unreachable (connection refused)"
        finally:
            await client.close()

    asyncio.run(main())
