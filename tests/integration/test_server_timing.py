"""The Server-Timing header: what the gateway added to an answer (queue wait, upstream time to
headers, its own time), on plain and streamed answers, errors and refusals; and the benchmark's
load generator counting real answers right. Lower bounds only: a stub that waits N ms before
its headers makes `upstream` at least N, a held slot makes `queue` at least what is left of it."""

from __future__ import annotations

import asyncio
import json
import re
import threading

import pytest

from bench import loadgen
from conftest import R1
from gwproc import Gateway, config_for
from rawhttp import post_raw
from stubproc import start_stub, wait_for

ANTHROPIC = {"anthropic-version": "2023-06-01"}
_PART = re.compile(r"^(\w+);dur=(\d+(?:\.\d+)?)$")


def timing(headers: dict) -> dict[str, float]:
    """Parse `name;dur=ms, ...`; every part must be well-formed."""
    out = {}
    for part in headers["server-timing"].split(", "):
        m = _PART.match(part)
        assert m, headers["server-timing"]
        out[m.group(1)] = float(m.group(2))
    return out


def _chat(stream: bool, directive: str) -> dict:
    return {"model": "reasoning", "stream": stream, "max_tokens": 32,
            "messages": [{"role": "user", "content": directive}]}


@pytest.mark.parametrize("stream", [False, True])
def test_openai_answer_reports_queue_upstream_and_gateway_time(gateway, stubs, stream):
    status, headers, body = post_raw(gateway.base + "/chat/completions",
                                     _chat(stream, "[stub headers_ms=250 content=3]"))
    assert status == 200, body
    st = timing(headers)
    assert set(st) == {"queue", "upstream", "gw"}
    assert st["upstream"] >= 250  # the stub held its response headers that long
    assert st["queue"] < 250 and st["gw"] < 250  # a free slot: no wait worth the name


@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_answer_reports_it_before_the_stream_starts(gateway, stubs, stream):
    body = {"model": "reasoning", "max_tokens": 32, "stream": stream,
            "messages": [{"role": "user", "content": "[stub headers_ms=200 content=3]"}]}
    status, headers, raw = post_raw(gateway.llm + "/v1/messages", body, ANTHROPIC)
    assert status == 200, raw
    if stream:
        assert headers["content-type"].startswith("text/event-stream")
        assert b"event: message_stop" in raw
    st = timing(headers)
    assert st["upstream"] >= 200 and "queue" in st and "gw" in st


def test_errors_carry_it_too(gateway):
    status, headers, _ = post_raw(gateway.base + "/chat/completions",
                                  {"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]})
    assert status == 404
    assert set(timing(headers)) == {"gw"}  # it never reached a queue or a backend
    status, headers, _ = post_raw(gateway.llm + "/v1/messages", b"{not json", ANTHROPIC)
    assert status == 400
    assert set(timing(headers)) == {"gw"}


def _hold_the_slot_then(gw, stub, then):
    """One request holds the only slot (the stub keeps its headers 900 ms); `then()` runs meanwhile."""
    results = {}

    def first():
        results["first"] = post_raw(gw.base + "/chat/completions", _chat(False, "[stub headers_ms=900]"))

    holder = threading.Thread(target=first)
    holder.start()
    try:
        wait_for(lambda: stub.stats()["in_flight"] == 1, timeout=5)
        then()
    finally:
        holder.join(10)
    status, headers, _ = results["first"]
    assert status == 200 and timing(headers)["upstream"] >= 900


@pytest.mark.parametrize("queue_timeout_s", [0.3, 10])
def test_queue_wait_shows_when_the_only_slot_is_busy(queue_timeout_s):
    with start_stub("vllm", "--model", R1) as stub:
        cfg = config_for({"gpu0": {"url": stub.base, "slots": 1,
                                   "queue": {"depth": 4, "timeout_s": queue_timeout_s}}},
                         {"reasoning": {"backend": "gpu0", "upstream_model": R1}})
        with Gateway(cfg) as gw:
            def second():
                status, headers, body = post_raw(gw.base + "/chat/completions", _chat(False, "hi"))
                st = timing(headers)
                if queue_timeout_s < 1:
                    # waited its 0.3 s in the queue, then refused: the wait is in the header
                    assert status == 429, body
                    assert st["queue"] >= 250 and "upstream" not in st
                else:
                    assert status == 200, body
                    assert st["queue"] >= 300  # served once the first answer let go of the slot

            _hold_the_slot_then(gw, stub, second)


def _count(url: str, path: str, body: dict, dialect: str, stream: bool, headers: dict | None = None) -> dict:
    host, port = url.split("//", 1)[1].rsplit(":", 1)
    spec = {"host": host, "port": int(port), "path": path, "body": json.dumps(body), "headers": headers or {},
            "stream": stream, "dialect": dialect, "concurrency": 2, "requests": 6, "warmup": 2, "timeout_s": 30}
    return asyncio.run(loadgen.run(spec))


def test_bench_load_generator_counts_content_frames_over_real_answers(gateway, vllm_stub):
    # what bench.run reports rests on these counts: 7 content tokens -> 7 frames per answer
    body = {"model": R1, "max_tokens": 32, "stream": True,
            "messages": [{"role": "user", "content": "[stub reasoning=0 content=7]"}]}
    direct = _count(vllm_stub.url, "/v1/chat/completions", body, "openai", True)
    assert direct["ok"] == 6 and direct["errors"] == 0 and direct["chunks_per_req"] == 7
    assert direct["ttft_p50_ms"] is not None and direct["server_timing"] == {}

    body["model"] = "reasoning"
    via = _count(gateway.url, "/llm/v1/chat/completions", body, "openai", True)
    assert via["ok"] == 6 and via["chunks_per_req"] == 7
    assert set(via["server_timing"]) == {"queue", "upstream", "gw"}

    anth = _count(gateway.url, "/llm/v1/messages", body, "anthropic", True, ANTHROPIC)
    assert anth["ok"] == 6 and anth["chunks_per_req"] == 7

    plain = _count(gateway.url, "/llm/v1/chat/completions", {**body, "stream": False}, "openai", False)
    assert plain["ok"] == 6 and plain["req_per_s"] > 0

    broken = _count(gateway.url, "/llm/v1/chat/completions",
                    {**body, "messages": [{"role": "user", "content": "[stub content=5 fail_after=2]"}]},
                    "openai", True)
    assert broken["ok"] == 0 and broken["errors"] == 6  # a stream that does not finish is no success
