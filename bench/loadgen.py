"""The load generator: its own process, a raw asyncio HTTP/1.1 client, one JSON spec per run.

    python -m bench.loadgen        # reads one JSON spec per stdin line, answers one JSON line each

A spec names a target (host, port, path, body), whether the answer streams, the concurrency,
how many requests to time, how many to send first as a warm-up, and a deadline. Each of the
`concurrency` workers owns one keep-alive connection and sends its next request only when the
previous answer has ended, so the offered load is exactly `concurrency` requests in flight.

Why raw sockets and not aiohttp's client: on two shared cores every cycle the client spends is
taken from the stub and the gateway it measures. A Protocol that counts content frames with
`bytes.count` over whole SSE frames costs a small fraction of a full HTTP client; the same
client is used for the direct and the gateway runs, so what it costs cancels in the ratios.

What is counted (per request): status, time to the first content frame (TTFT; streams), content
frames (OpenAI: frames with a non-empty `content`, or `reasoning` too with `count_reasoning`; Anthropic: `content_block_delta` frames;
Ollama: NDJSON lines with a non-empty `content`; Gemini: chunks with a text part), whether the
stream ended properly (`data: [DONE]` / `message_stop` / `"done":true` / a `finishReason`, no error
frame or object), and the
gateway's `Server-Timing` header when present.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import time

_CHUNK_SIZE = re.compile(rb"[0-9a-fA-F]+")
# OpenAI-shaped content frames: a non-empty "content" string (the stub's first frame is "")
_OPENAI_CONTENT = re.compile(rb'"content": ?"[^"]')
# ... and with `count_reasoning` (a real model's answer: its reasoning tokens are tokens too)
_OPENAI_TOKEN = re.compile(rb'"(?:content|reasoning|reasoning_content)": ?"[^"]')
_ANTHROPIC_CONTENT = b"event: content_block_delta"
_RESPONSES_CONTENT = b"event: response.output_text.delta"
# Ollama's NDJSON: one object a line; content lines carry a non-empty "content"
_OLLAMA_CONTENT = re.compile(rb'"content":"[^"]')
_GEMINI_CONTENT = b'data: {"candidates":[{"content":{"parts":[{"text":'  # Google frames end \r\n\r\n
_TIMING = re.compile(r"(\w+);dur=([0-9.]+)")


class Result:
    __slots__ = ("status", "ttft", "latency", "chunks", "ok", "timing", "error")

    def __init__(self) -> None:
        self.status = 0
        self.ttft: float | None = None
        self.latency = 0.0
        self.chunks = 0
        self.ok = False
        self.timing: str | None = None
        self.error: str | None = None


class Conn(asyncio.Protocol):
    """One keep-alive connection; `request()` sends and resolves when the answer has ended."""

    def __init__(self, stream: bool, dialect: str, count_reasoning: bool = False) -> None:
        self.stream = stream
        self._openai_frames = _OPENAI_TOKEN if count_reasoning else _OPENAI_CONTENT
        self.anthropic = dialect == "anthropic"
        self.responses = dialect == "responses"
        self.ollama = dialect == "ollama"
        self.gemini = dialect == "gemini"
        # how a frame ends: NDJSON lines, Google's SSE frames, SSE frames
        self._sep = b"\n" if self.ollama else b"\r\n\r\n" if self.gemini else b"\n\n"
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._fut: asyncio.Future | None = None
        self._res: Result | None = None
        self._t0 = 0.0
        self._reset()

    def _reset(self) -> None:
        self._head = b""
        self._in_body = False
        self._chunked = False
        self._remaining = 0  # content-length left, or bytes left of the current chunk
        self._chunk_buf = b""  # chunked framing not yet parsed
        self._sse = b""  # SSE text not yet a whole frame
        self._body_tail = b""
        self._close_after = False

    # -- asyncio.Protocol -----------------------------------------------------------------

    def connection_made(self, transport) -> None:
        self.transport = transport

    def connection_lost(self, exc) -> None:
        self.closed = True
        if self._fut is not None and not self._fut.done():
            self._res.error = "connection lost"
            self._fut.set_result(self._res)

    def data_received(self, data: bytes) -> None:
        if self._fut is None or self._fut.done():
            return
        if not self._in_body:
            self._head += data
            end = self._head.find(b"\r\n\r\n")
            if end < 0:
                return
            data = self._head[end + 4:]
            self._parse_head(self._head[:end])
            self._in_body = True
        if self._chunked:
            self._feed_chunked(data)
        else:
            self._remaining -= len(data)
            self._body(data)
            if self._remaining <= 0:
                self._done()

    # -- parsing --------------------------------------------------------------------------

    def _parse_head(self, head: bytes) -> None:
        lines = head.decode("latin-1").split("\r\n")
        self._res.status = int(lines[0].split()[1])
        for line in lines[1:]:
            name, _, value = line.partition(":")
            name = name.strip().lower()
            value = value.strip()
            if name == "content-length":
                self._remaining = int(value)
            elif name == "transfer-encoding" and "chunked" in value.lower():
                self._chunked = True
            elif name == "server-timing":
                self._res.timing = value
            elif name == "connection" and value.lower() == "close":
                self._close_after = True

    def _feed_chunked(self, data: bytes) -> None:
        buf = self._chunk_buf + data if self._chunk_buf else data
        pos = 0
        n = len(buf)
        while pos < n:
            if self._remaining > 0:
                take = min(self._remaining, n - pos)
                self._body(buf[pos:pos + take])
                self._remaining -= take
                pos += take
                if self._remaining == 0:
                    self._remaining = -2  # the CRLF after the chunk data
                continue
            if self._remaining < 0:
                skip = min(-self._remaining, n - pos)
                pos += skip
                self._remaining += skip
                continue
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                break
            m = _CHUNK_SIZE.match(buf, pos)
            size = int(m.group(), 16) if m else 0
            pos = eol + 2
            if size == 0:
                self._done()  # trailers are never sent by our servers
                return
            self._remaining = size
        self._chunk_buf = buf[pos:]

    def _body(self, data: bytes) -> None:
        if not self.stream:
            self._body_tail = (self._body_tail + data)[-64:]
            return
        sse = self._sse + data
        sep = self._sep
        end = sse.rfind(sep)
        if end < 0:
            self._sse = sse
            return
        end += len(sep)
        frames, self._sse = sse[:end], sse[end:]
        res = self._res
        if self.ollama:
            n = len(_OLLAMA_CONTENT.findall(frames))
            if b'"done":true' in frames:
                res.ok = True
            if b'{"error"' in frames:
                res.error = "error object"
        elif self.gemini:
            n = frames.count(_GEMINI_CONTENT)
            if b'"finishReason"' in frames:
                res.ok = True
        elif self.responses:
            n = frames.count(_RESPONSES_CONTENT)
            if b"event: response.completed" in frames:
                res.ok = True
            if b"event: response.failed" in frames:
                res.error = "response.failed"
        elif self.anthropic:
            n = frames.count(_ANTHROPIC_CONTENT)
            if b"event: message_stop" in frames:
                res.ok = True
            if b"event: error" in frames:
                res.error = "error frame"
        else:
            n = len(self._openai_frames.findall(frames))
            if b"data: [DONE]" in frames:
                res.ok = True
            if b'data: {"error"' in frames:
                res.error = "error frame"
        if n:
            if res.ttft is None:
                res.ttft = time.perf_counter() - self._t0
            res.chunks += n

    def _done(self) -> None:
        res = self._res
        res.latency = time.perf_counter() - self._t0
        if not self.stream:
            res.ok = self._body_tail.rstrip().endswith(b"}")
        if res.status != 200:
            res.ok = False
            res.error = res.error or f"status {res.status}"
        elif not res.ok and res.error is None:
            res.error = "incomplete answer"
        fut = self._fut
        if self._close_after and self.transport is not None:
            self.transport.close()
            self.closed = True
        self._reset()
        fut.set_result(res)

    # -- the API --------------------------------------------------------------------------

    def request(self, raw: bytes) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        self._fut = loop.create_future()
        self._res = Result()
        self._reset()
        self._t0 = time.perf_counter()
        self.transport.write(raw)
        return self._fut


def request_bytes(host: str, port: int, path: str, body: bytes, headers: dict[str, str]) -> bytes:
    head = [f"POST {path} HTTP/1.1", f"Host: {host}:{port}", "Content-Type: application/json",
            f"Content-Length: {len(body)}"]
    head += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


async def _connect(spec: dict) -> Conn:
    loop = asyncio.get_running_loop()
    _, conn = await loop.create_connection(
        lambda: Conn(spec["stream"], spec["dialect"], spec.get("count_reasoning", False)), spec["host"], spec["port"]
    )
    return conn


async def _phase(spec: dict, raw: bytes, total: int, conns: list, deadline: float) -> tuple[list[Result], float]:
    results: list[Result] = []
    todo = iter(range(total))
    per_request = spec.get("request_timeout_s", 30.0)

    async def worker(i: int) -> None:
        for _ in todo:
            if time.perf_counter() > deadline:
                return
            conn = conns[i]
            if conn is None or conn.closed:
                conn = conns[i] = await _connect(spec)
            try:
                res = await asyncio.wait_for(conn.request(raw), per_request)
            except asyncio.TimeoutError:
                res = Result()
                res.error = f"no answer within {per_request:g} s"
                conn.transport.close()
                conns[i] = None
            results.append(res)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(i) for i in range(len(conns))))
    return results, time.perf_counter() - t0


def _pct(values: list[float], p: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    k = min(len(s) - 1, max(0, round(p / 100 * (len(s) - 1))))
    return s[k]


def _timings(results: list[Result]) -> dict[str, dict[str, float | None]]:
    by_name: dict[str, list[float]] = {}
    for r in results:
        if r.timing:
            for name, dur in _TIMING.findall(r.timing):
                by_name.setdefault(name, []).append(float(dur))
    return {k: {"p50_ms": _pct(v, 50), "p99_ms": _pct(v, 99), "max_ms": max(v)} for k, v in by_name.items()}


async def run(spec: dict) -> dict:
    """One measurement: warm-up, then `requests` timed requests at `concurrency`."""
    raw = request_bytes(spec["host"], spec["port"], spec["path"], spec["body"].encode(), spec.get("headers", {}))
    c = spec["concurrency"]
    deadline = time.perf_counter() + spec.get("timeout_s", 60.0)
    conns: list = [await _connect(spec) for _ in range(c)]
    try:
        warm, _ = await _phase(spec, raw, spec.get("warmup", c), conns, deadline)
        if spec.get("pause_after_warmup"):
            # the parent reads the processes' CPU counters here, between warm-up and the run
            print(json.dumps({"warm": True, "errors": sum(1 for r in warm if not r.ok)}), flush=True)
            await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        results, wall = await _phase(spec, raw, spec["requests"], conns, deadline)
    finally:
        for conn in conns:
            if conn is not None and conn.transport is not None:
                conn.transport.close()
    good = [r for r in results if r.ok]
    errors = [r.error or "?" for r in results if not r.ok]
    ttfts = [r.ttft * 1000 for r in good if r.ttft is not None]
    lat = [r.latency * 1000 for r in good]
    chunks = sum(r.chunks for r in good)
    return {
        "requests": len(results),
        "ok": len(good),
        "errors": len(errors),
        "error_examples": sorted(set(errors))[:3],
        "timed_out": len(results) < spec["requests"],
        "wall_s": wall,
        "req_per_s": len(good) / wall if wall > 0 else None,
        "chunks": chunks,
        "chunks_per_req": chunks / len(good) if good else None,
        "chunks_per_s": chunks / wall if wall > 0 and spec["stream"] else None,
        "ttft_p50_ms": _pct(ttfts, 50),
        "ttft_p99_ms": _pct(ttfts, 99),
        "latency_p50_ms": _pct(lat, 50),
        "latency_p99_ms": _pct(lat, 99),
        "server_timing": _timings(good),
    }


def main() -> int:
    try:
        import uvloop
    except ImportError:
        uvloop = None
    runner = uvloop.run if uvloop is not None else asyncio.run
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        spec = json.loads(line)
        try:
            out = runner(run(spec))
        except OSError as err:
            out = {"fatal": f"{type(err).__name__}: {err}"}
        print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
