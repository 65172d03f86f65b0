"""A huge request body (within the size limit) is parsed off the event loop: streams that are
running meanwhile keep flowing, and the huge request still gets its clear answer."""

from __future__ import annotations

import http.client
import json
import threading
import time
from urllib.parse import urlsplit

from rawhttp import post_raw


def test_running_stream_keeps_flowing_while_a_huge_body_is_parsed(gateway, stubs):
    u = urlsplit(gateway.url)
    gaps: list[float] = []
    done = threading.Event()

    def stream():
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
        body = json.dumps({"model": "reasoning", "max_tokens": 1024, "stream": True,
                           "messages": [{"role": "user", "content": "[stub reasoning=0 content=200 delay_ms=20]"}]})
        conn.request("POST", "/llm/v1/messages", body, {"content-type": "application/json"})
        resp = conn.getresponse()
        last = None
        while True:
            line = resp.fp.readline()
            if not line or b"message_stop" in line:
                break
            if line.startswith(b"data:") and b"text_delta" in line:
                now = time.monotonic()
                if last is not None:
                    gaps.append(now - last)
                last = now
        conn.close()
        done.set()

    th = threading.Thread(target=stream)
    th.start()
    time.sleep(0.5)
    # 6 MB of tiny arrays in a tool's schema: seconds of decoding and walking, on a worker thread
    schema = b"[" + b"[]," * 2_000_000 + b"[]]"
    huge = (b'{"model":"reasoning","max_tokens":5,"messages":[{"role":"user","content":"hi"}],'
            b'"tools":[{"name":"t","input_schema":{"type":"object","x":' + schema + b"}}]}")
    t0 = time.monotonic()
    status, _, raw = post_raw(gateway.base + "/messages", huge)
    parse_s = time.monotonic() - t0
    th.join(30)
    assert done.is_set()
    assert status == 200 or json.loads(raw)["type"] == "error", raw[:300]
    # the stream went on while the huge body was being parsed (which took a while)
    assert parse_s > 0.3, parse_s
    assert gaps and max(gaps) < max(0.5, parse_s / 2), (max(gaps), parse_s)
