"""The admin snapshot (ops/admin.py): what runs and queues, per backend, never a URL."""

from __future__ import annotations

import asyncio

from homelab_frontend import config as cfgmod
from homelab_frontend.app.gateway import Gateway
from homelab_frontend.ops.admin import snapshot
from homelab_frontend.request.tracker import Tracked


def test_snapshot(tmp_path):
    async def main():
        gw = Gateway(cfgmod.parse({
            "backends": {"gpu0": {"url": "http://10.1.2.3:8000/v1", "slots": 4}},
            "models": {"m": {"backend": "gpu0"}},
            "responses": {"store": {"path": str(tmp_path / "r.sqlite3")}},
        }))
        try:
            t = Tracked("req_s", "anthropic", "m", "alice", True)
            t.backend = "gpu0"
            gw.tracker.add(t)
            b = gw.backends["gpu0"]
            b.pool.in_use, b.upstream_running = 1, 3
            return snapshot(gw)
        finally:
            await gw.close()

    snap = asyncio.run(main())
    assert [r["id"] for r in snap["requests"]] == ["req_s"]
    assert snap["backends"]["gpu0"] == {"slots": 4, "in_use": 1, "queued": 0, "up": True, "last_error": None,
                                        "upstream_running": 3, "upstream_running_age_s": None,
                                        "slot_mismatch": 2}
    assert "10.1.2.3" not in repr(snap)  # internal addresses stay internal


# -- the admin API over HTTP: the gateway's own app (app/routes.py) on a free loopback port ------

import aiohttp  # noqa: E402
import pytest  # noqa: E402
from aiohttp import web  # noqa: E402

from homelab_frontend.app.routes import build_app  # noqa: E402

ADMIN = {"authorization": "Bearer root-secret"}


def _admin_config(tmp_path, upstream_port: int) -> dict:
    return {
        "backends": {
            "ext": {"url": f"http://127.0.0.1:{upstream_port}/v1", "slots": 2},
            # managed, never wanted: it starts only when asked (`false` then exits at once)
            "man": {"url": f"http://127.0.0.1:{upstream_port}/v1", "slots": 1,
                    "run": {"cmd": ["false"], "start_timeout_s": 5, "backoff_s": 60}},
        },
        "models": {"m": {"backend": "ext"}, "n": {"backend": "man"}},
        "auth": {"admin_key_env": "HLF_TEST_ADMIN_KEY"},
        "responses": {"store": {"path": str(tmp_path / "r.sqlite3")}},
        "usage": {"path": str(tmp_path / "u.sqlite3")},
    }


def _with_admin_api(tmp_path, monkeypatch, body, config_path=None):
    """Run `body(session, base_url, gw)` against the gateway's app on a free port, over a real
    upstream that answers /v1/models."""
    monkeypatch.setenv("HLF_TEST_ADMIN_KEY", "root-secret")

    async def main():
        async def models(request: web.Request) -> web.Response:
            return web.json_response({"object": "list", "data": [{"id": "m"}]})

        up = web.Application()
        up.router.add_get("/v1/models", models)
        up_runner = web.AppRunner(up)
        await up_runner.setup()
        await web.TCPSite(up_runner, "127.0.0.1", 0).start()
        gw = Gateway(cfgmod.parse(_admin_config(tmp_path, up_runner.addresses[0][1])), config_path)
        runner = web.AppRunner(build_app(gw))
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        base = f"http://127.0.0.1:{runner.addresses[0][1]}"
        try:
            async with aiohttp.ClientSession() as s:
                return await body(s, base, gw)
        finally:
            await runner.cleanup()
            await up_runner.cleanup()

    return asyncio.run(main())


async def _call(s: aiohttp.ClientSession, method: str, url: str, headers=None) -> tuple[int, object]:
    async with s.request(method, url, headers=headers) as r:
        ctype = r.headers.get("content-type", "")
        return r.status, (await r.json() if ctype.startswith("application/json") else await r.text())


@pytest.mark.parametrize("method, path", [
    ("GET", "/admin/requests"), ("POST", "/admin/requests/req_x/cancel"), ("POST", "/admin/reload"),
    ("GET", "/admin/backends"), ("GET", "/admin/backends/man/log"), ("POST", "/admin/backends/man/start"),
    ("POST", "/admin/backends/man/stop"),
])
def test_every_admin_call_needs_the_admin_key(tmp_path, monkeypatch, method, path):
    async def body(s, base, gw):
        wrong = await _call(s, method, base + path, {"authorization": "Bearer not-it"})
        none = await _call(s, method, base + path)
        return wrong, none, gw.fleet.units["man"].state

    wrong, none, state = _with_admin_api(tmp_path, monkeypatch, body)
    for status, doc in (wrong, none):
        assert status == 401 and doc["error"]["type"] == "authentication_error"
    assert state.value == "stopped"  # a refused start started nothing


def test_the_running_request_is_listed_and_cancelled_by_its_id(tmp_path, monkeypatch):
    async def body(s, base, gw):
        t = Tracked("req_live", "openai", "m", "alice", True)
        t.backend = "ext"
        t.task = asyncio.get_running_loop().create_task(asyncio.sleep(60))
        gw.tracker.add(t)
        listed = await _call(s, "GET", base + "/admin/requests", ADMIN)
        cancelled = await _call(s, "POST", base + "/admin/requests/req_live/cancel", ADMIN)
        again = await _call(s, "POST", base + "/admin/requests/req_live/cancel", ADMIN)  # already cancelled
        unknown = await _call(s, "POST", base + "/admin/requests/req_none/cancel", ADMIN)
        try:
            await t.task
        except asyncio.CancelledError:
            pass
        return listed, cancelled, again, unknown, t

    listed, cancelled, again, unknown, t = _with_admin_api(tmp_path, monkeypatch, body)
    status, doc = listed
    assert status == 200 and [r["id"] for r in doc["requests"]] == ["req_live"]
    assert set(doc["backends"]) == {"ext", "man"} and "cluster" not in doc
    assert doc["backends"]["man"]["lifecycle"]["state"] == "stopped" and "lifecycle" not in doc["backends"]["ext"]
    assert "127.0.0.1" not in repr(doc)  # no backend URL
    assert cancelled == (200, {"cancelled": "req_live"})
    assert t.task.cancelled() and t.cancel_reason == "admin"
    assert again[0] == 404 and unknown[0] == 404 and "req_none" in unknown[1]["error"]["message"]


def test_the_backends_list_says_which_are_managed(tmp_path, monkeypatch):
    async def body(s, base, gw):
        return await _call(s, "GET", base + "/admin/backends", ADMIN)

    status, doc = _with_admin_api(tmp_path, monkeypatch, body)
    assert status == 200
    by_name = {b["name"]: b for b in doc["backends"]}
    assert by_name["ext"]["managed"] is False and by_name["ext"]["state"] == "external"
    assert by_name["ext"]["slots"] == 2 and by_name["ext"]["kind"] == "openai"
    assert by_name["man"]["managed"] is True and by_name["man"]["state"] == "stopped" and by_name["man"]["slots"] == 1
    assert doc["boxes"] == {}  # no peer boxes configured


def test_a_managed_backends_calls_refuse_an_unknown_or_external_one_and_a_bad_line_count(tmp_path, monkeypatch):
    async def body(s, base, gw):
        return {
            "unknown": await _call(s, "GET", base + "/admin/backends/nope/log", ADMIN),
            "external": await _call(s, "POST", base + "/admin/backends/ext/start", ADMIN),
            "bad lines": await _call(s, "GET", base + "/admin/backends/man/log?lines=many", ADMIN),
            "log": await _call(s, "GET", base + "/admin/backends/man/log?lines=5", ADMIN),
        }

    out = _with_admin_api(tmp_path, monkeypatch, body)
    assert out["unknown"][0] == 404 and "'nope'" in out["unknown"][1]["error"]["message"]
    assert out["external"][0] == 409 and "not managed" in out["external"][1]["error"]["message"]
    assert out["bad lines"][0] == 400 and "lines" in out["bad lines"][1]["error"]["message"]
    assert out["log"] == (200, "")  # never started: nothing logged


def test_start_then_stop_moves_a_managed_backends_goal(tmp_path, monkeypatch):
    async def body(s, base, gw):
        started = await _call(s, "POST", base + "/admin/backends/man/start", ADMIN)
        # `false` exits at once: wait for the unit to have tried (its own word, then the log's)
        for _ in range(500):
            if gw.fleet.units["man"].state.value == "failed":
                break
            await asyncio.sleep(0.02)
        failed = gw.fleet.units["man"].state.value
        stopped = await _call(s, "POST", base + "/admin/backends/man/stop", ADMIN)
        return started, failed, stopped

    started, failed, stopped = _with_admin_api(tmp_path, monkeypatch, body)
    assert started[0] == 202 and started[1]["name"] == "man"
    assert failed == "failed"
    assert stopped[0] == 202 and stopped[1]["name"] == "man"


def test_reload_says_why_it_cannot_and_applies_a_good_file(tmp_path, monkeypatch):
    from urllib.parse import urlsplit

    import yaml

    path = tmp_path / "config.yaml"

    async def body(s, base, gw):
        cfg = _admin_config(tmp_path, urlsplit(gw.cfg.backends["ext"].url).port)
        cfg["models"]["extra"] = {"backend": "ext"}
        path.write_text(yaml.safe_dump(cfg))
        good = await _call(s, "POST", base + "/admin/reload", ADMIN)
        models = set(gw.cfg.models)
        path.write_text("backends: {ext: {url: 42}}\n")
        bad = await _call(s, "POST", base + "/admin/reload", ADMIN)
        return good, models, bad, set(gw.cfg.models)

    path.write_text("")
    good, models, bad, after = _with_admin_api(tmp_path, monkeypatch, body, config_path=str(path))
    assert good == (200, {"reloaded": True}) and "extra" in models
    assert bad[0] == 400 and bad[1]["reloaded"] is False and bad[1]["problems"]
    assert after == models  # the old config stays


def test_reload_without_a_config_file_is_refused(tmp_path, monkeypatch):
    async def body(s, base, gw):
        return await _call(s, "POST", base + "/admin/reload", ADMIN)

    status, doc = _with_admin_api(tmp_path, monkeypatch, body)
    assert status == 400 and doc["problems"] == ["no config file to reload (started without --config)"]
