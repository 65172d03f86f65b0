"""The SQLite ledger's writer when its folder goes away under a running gateway (real gateway,
real stub, real file): the failure shows in /healthz and /metrics, a usage query answers at once
with a 503 naming the ledger (never waits forever), and writing resumes once the way is clear."""

from __future__ import annotations

import re
import shutil

from gwproc import Gateway, config_for
from rawhttp import post_raw
from stubproc import start_stub, wait_for

ADMIN = "sk-admin-writer"


def _chat(gw: Gateway) -> int:
    status, _, _ = post_raw(gw.base + "/chat/completions",
                            {"model": "m", "messages": [{"role": "user", "content": "hi"}]}, timeout=30)
    return status


ADMIN_AUTH = {"authorization": f"Bearer {ADMIN}"}


def _errors(gw: Gateway) -> float:
    _, text = gw.get("/metrics", ADMIN_AUTH)
    m = re.search(r"^hlf_usage_write_errors_total ([\d.e+-]+)$", text, re.M)
    return float(m.group(1)) if m else -1.0


def test_a_ledger_that_cannot_write_says_so_and_recovers(tmp_path):
    sub = tmp_path / "ledger"
    with start_stub("vllm", "--model", "m") as stub:
        cfg = config_for({"b": {"url": stub.base, "kind": "vllm"}}, {"m": {"backend": "b"}},
                         auth={"admin_key_env": "ADMIN_KEY"},
                         usage={"path": str(sub / "u.sqlite3"), "flush_interval_s": 0.1})
        with Gateway(cfg, env={"ADMIN_KEY": ADMIN}) as gw:
            admin = {"authorization": f"Bearer {ADMIN}"}
            assert gw.get("/healthz")[1] == {"status": "ok"}
            shutil.rmtree(sub)
            sub.write_text("in the way")  # its folder cannot be made again: an OSError in the writer
            assert _chat(gw) == 200
            wait_for(lambda: _errors(gw) >= 1, timeout=10)
            status, doc = gw.get("/healthz")
            assert status == 200 and doc["status"] == "degraded", doc
            assert doc["usage"]["writer_alive"] and "cannot write" in doc["usage"]["failure"]
            status, doc = gw.get("/admin/usage", admin)  # answered at once, not left waiting
            assert status == 503 and "usage ledger" in str(doc), doc
            sub.unlink()
            assert _chat(gw) == 200
            wait_for(lambda: gw.get("/healthz")[1] == {"status": "ok"}, timeout=10)
            status, doc = gw.get("/admin/usage", admin)
            assert status == 200 and doc["rows"], doc
            _, text = gw.get("/metrics", ADMIN_AUTH)
            assert "hlf_usage_writer_up 1.0" in text and "hlf_usage_lost_requests_total 1.0" in text
