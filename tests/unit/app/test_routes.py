"""The gateway's routes and per-request lifecycle (app/routes.py, app/request_scope.py) in process:
the app served on a free loopback port in front of an in-process vLLM-flavoured stub, every
surface reached through its route, errors in each dialect's shape, a client leaving judged by the
stub's own count of cancelled generations."""

from __future__ import annotations

import asyncio
import json

import aiohttp
from aiohttp import web

from homelab_frontend import config as cfgmod
from homelab_frontend.app.gateway import Gateway
from homelab_frontend.app.routes import build_app
from homelab_frontend.stub.server import StubServer
from homelab_frontend.stub.state import StubConfig


def run_with_gateway(tmp_path, body):
    async def main():
        async with StubServer(StubConfig(flavour="vllm", models=("up-m",), token_delay_ms=5)) as stub:
            cfg = cfgmod.parse({
                "backends": {"gpu0": {"url": stub.url + "/v1", "slots": 2, "kind": "vllm"}},
                "models": {"m": {"backend": "gpu0", "upstream_model": "up-m"}},
                "access_log": str(tmp_path / "access.log"),
                "responses": {"store": {"path": str(tmp_path / "responses.sqlite3")}},
                "usage": {"path": str(tmp_path / "usage.sqlite3")},
            })
            runner = web.AppRunner(build_app(Gateway(cfg)), handler_cancellation=True, access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            url = f"http://127.0.0.1:{runner.addresses[0][1]}"
            try:
                async with aiohttp.ClientSession() as http:
                    return await body(http, url, stub)
            finally:
                await runner.cleanup()

    return asyncio.run(main())


def _log(tmp_path) -> list[dict]:
    return [json.loads(ln) for ln in (tmp_path / "access.log").read_text().splitlines()]


def test_every_surface_answers_through_its_route(tmp_path):
    async def body(http, url, stub):
        out = {}
        async with http.post(url + "/llm/v1/chat/completions", json={
                "model": "m", "messages": [{"role": "user", "content": "[stub content=3]"}]}) as r:
            out["openai"] = (r.status, await r.json(), r.headers)
        async with http.post(url + "/llm/v1/messages", json={
                "model": "m", "max_tokens": 50, "stream": True,
                "messages": [{"role": "user", "content": "[stub content=3]"}]}) as r:
            out["anthropic"] = (r.status, await r.text())
        async with http.post(url + "/llm/v1/responses", json={
                "model": "m", "input": "[stub content=3]", "store": False}) as r:
            out["responses"] = (r.status, await r.json())
        return out

    out = run_with_gateway(tmp_path, body)
    status, data, headers = out["openai"]
    assert status == 200 and data["model"] == "m" and data["choices"][0]["message"]["content"]
    assert headers["request-id"].startswith("req_") and "gw;dur=" in headers["server-timing"]
    status, text = out["anthropic"]
    assert status == 200 and "event: message_stop" in text
    status, data = out["responses"]
    assert status == 200 and data["status"] == "completed" and data["model"] == "m"
    assert [r["outcome"] for r in _log(tmp_path)] == ["ok", "ok", "ok"]
    assert [r["dialect"] for r in _log(tmp_path)] == ["openai", "anthropic", "responses"]


def test_unknown_paths_answer_in_the_dialect_the_path_belongs_to(tmp_path):
    async def body(http, url, stub):
        out = []
        for method, path in (("GET", "/llm/v1/nope"), ("GET", "/llm/v1/messages"), ("POST", "/llm/v1/messages/x"),
                             ("PUT", "/llm/v1/responses/a/b")):
            async with http.request(method, url + path) as r:
                out.append((r.status, await r.json()))
        async with http.get(url + "/readyz") as r:
            out.append((r.status, await r.json()))
        async with http.head(url + "/llm") as r:
            out.append((r.status, None))
        return out

    (o1, o2, o3, o4, ready, head) = run_with_gateway(tmp_path, body)
    assert o1[0] == 404 and o1[1]["error"]["message"] == "no such endpoint: GET /llm/v1/nope"
    assert o2[0] == 404 and o2[1]["type"] == "error" and o2[1]["error"]["type"] == "not_found_error"
    assert o3[0] == 404 and o3[1]["error"]["type"] == "not_found_error"
    assert o4[0] == 404 and "error" in o4[1]
    assert ready[0] == 200 and ready[1]["backends"] == {"gpu0": True}
    assert head[0] == 200  # Claude Code's connection warm-up
    assert {r["outcome"] for r in _log(tmp_path)} == {"error_not_found"}


def test_a_client_leaving_mid_stream_cancels_the_generation(tmp_path):
    async def body(http, url, stub):
        async with http.post(url + "/llm/v1/chat/completions", json={
                "model": "m", "stream": True,
                "messages": [{"role": "user", "content": "[stub content=2000 delay_ms=10]"}]}) as r:
            await r.content.readline()  # the answer has begun
        for _ in range(200):  # the stub's own count, not the gateway's word
            if stub.state.stats.cancelled:
                break
            await asyncio.sleep(0.01)
        for _ in range(200):
            if (tmp_path / "access.log").exists() and (tmp_path / "access.log").read_text():
                break
            await asyncio.sleep(0.01)
        return stub.state.stats.as_dict()

    stats = run_with_gateway(tmp_path, body)
    assert stats["cancelled"] == 1 and stats["completed"] == 0
    (rec,) = _log(tmp_path)
    assert (rec["status"], rec["outcome"]) == (499, "cancelled_streaming")


def test_the_gemini_routes_and_the_models_list_by_client(tmp_path):
    async def body(http, url, stub):
        out = {}
        async with http.post(url + "/llm/v1beta/models/m:streamGenerateContent?alt=sse",
                             json={"contents": [{"parts": [{"text": "[stub content=3]"}]}]}) as r:
            out["stream"] = (r.status, r.headers["content-type"], await r.text())
        async with http.post(url + "/llm/v1/models/models/m:generateContent",  # a doubled prefix
                             json={"contents": [{"parts": [{"text": "[stub content=2]"}]}]}) as r:
            out["whole"] = (r.status, await r.json())
        async with http.get(url + "/llm/v1/models", headers={"x-goog-api-client": "google-genai-sdk/3.6.1"}) as r:
            out["google list"] = (r.status, await r.json())
        async with http.get(url + "/llm/v1/models") as r:
            out["openai list"] = (r.status, await r.json())
        async with http.get(url + "/llm/v1/models/m?key=anything") as r:
            out["google get"] = (r.status, await r.json())
        async with http.get(url + "/llm/v1beta/nope") as r:
            out["unknown"] = (r.status, await r.json())
        return out

    out = run_with_gateway(tmp_path, body)
    status, ctype, text = out["stream"]
    assert status == 200 and ctype.startswith("text/event-stream")
    frames = [json.loads(f[len("data: "):]) for f in text.split("\r\n\r\n") if f]
    assert "".join(p["text"] for f in frames for p in f["candidates"][0]["content"].get("parts", [])) == "Hello from the "
    assert frames[-1]["candidates"][0]["finishReason"] == "STOP" and frames[-1]["modelVersion"] == "m"
    status, doc = out["whole"]
    assert status == 200 and doc["candidates"][0]["content"]["parts"] == [{"text": "Hello from "}]
    status, doc = out["google list"]
    assert status == 200 and [m["name"] for m in doc["models"]] == ["models/m"]
    status, doc = out["openai list"]
    assert status == 200 and doc["object"] == "list" and [m["id"] for m in doc["data"]] == ["m"]
    status, doc = out["google get"]
    assert status == 200 and doc["name"] == "models/m" and "generateContent" in doc["supportedGenerationMethods"]
    status, doc = out["unknown"]
    assert status == 404 and doc["error"]["status"] == "NOT_FOUND" and doc["error"]["code"] == 404
    assert [r["dialect"] for r in _log(tmp_path)] == ["gemini", "gemini", "gemini", "openai", "gemini", "gemini"]
