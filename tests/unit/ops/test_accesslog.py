"""The access log (ops/accesslog.py): one JSON line per request, no message text, no key."""

from __future__ import annotations

import asyncio
import json

from homelab_frontend.ops.accesslog import AccessLog
from homelab_frontend.request.tracker import Tracked


def test_one_line_per_request_with_every_field(tmp_path):
    async def make():
        return Tracked("req_abc", "anthropic", "qwen", "alice", True)
    t = asyncio.run(make())
    t.backend, t.status, t.queue_wait, t.ttft = "gpu0", 200, 0.0123, 0.5
    t.tokens_in, t.tokens_out, t.tokens_cached, t.affinity = 10, 20, 4, "hit"
    t.failovers, t.served_model = [("gpu1", "reset")], "qwen"
    t.client, t.endpoint = "203.0.113.9", "/llm/v1/messages"
    t.fail("timeout")
    path = tmp_path / "access.log"
    log = AccessLog(str(path))
    log.write(t, "/llm/v1/messages")
    log.write(t, "/llm/v1/messages")
    log.close()
    lines = path.read_text().splitlines()
    assert len(lines) == 2
    rec = json.loads(lines[0])
    assert set(rec) == {"ts", "id", "path", "dialect", "model", "backend", "key", "stream", "status", "outcome",
                        "queue_wait_ms", "ttft_ms", "duration_ms", "tokens_in", "tokens_out", "tokens_cached",
                        "affinity", "backends_tried", "failovers", "served_model", "client", "endpoint"}
    assert rec["backends_tried"] == ["gpu1", "gpu0"] and rec["failovers"] == [{"backend": "gpu1", "cause": "reset"}]
    assert (rec["id"], rec["key"], rec["outcome"], rec["queue_wait_ms"], rec["ttft_ms"]) == (
        "req_abc", "alice", "error_timeout", 12.3, 500.0)
    assert (rec["client"], rec["endpoint"]) == ("203.0.113.9", "/llm/v1/messages")


def test_a_failed_write_is_a_warning_not_a_crash(tmp_path, caplog):
    async def make():
        return Tracked("req_x", "openai", "", None, False)
    t = asyncio.run(make())
    log = AccessLog(str(tmp_path / "a.log"))
    log.close()  # writes to a closed file now fail
    log.write(t, "/")
    assert "access log write failed" in caplog.text
