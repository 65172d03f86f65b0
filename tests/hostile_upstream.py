"""A fault-injecting upstream, as a real server process: what a broken or hostile backend does.

    python tests/hostile_upstream.py --port 0     # prints `listening on http://127.0.0.1:PORT`

Raw asyncio, not an HTTP framework, so that it can do what no well-behaved server would: never
answer, write 100 MiB without a newline, send a body that never ends, lie about its length, reset
the connection. `GET /v1/models` answers normally (so the gateway's probe keeps it up); a chat
completion's behaviour is chosen by the `model` in the request body (the gateway's
`upstream_model`), for streaming and non-streaming requests alike. `GET /stats` reports the
connections it holds open right now (`open`), so a test can see the gateway let go of them;
`GET /events` when each chat request arrived and when a held connection was closed by the gateway.
`POST /late-models {"late": N, "delay_s": S}` makes the next N answers to `GET /v1/models` come S
seconds late (a busy server); `/stats` counts the asks (`models_asked`) and the late ones left.

Faults (model name -> what happens):
    hang-headers   reads the request, never answers
    hang-body      200 and the start of an answer (one chunk / half a body), then silence
    huge-line      200 event stream: `data: ` and 100 MiB without a newline
    huge-body      200 chunked JSON that never ends (up to 100 MiB)
    huge-length    200 with Content-Length: 100 MiB, then as much as the reader takes
    invalid-json   200 with a body / chunk that is not JSON
    choices-null   {"choices": null}                      (stream: the same as a chunk)
    message-str    {"choices": [{"message": "x"}]}        (stream: {"delta": "x"})
    finish-int     a finish_reason of 42
    html           200 text/html page
    html-502       502 with an HTML error page
    gzip           a valid answer, gzip-compressed, though nobody asked for gzip
    reset          reads the request, then resets the connection (RST); stream: after a chunk
    redirect       307 to another address
    empty          200 with an empty body
    retry-429      429 with Retry-After: 7
    retry-503-date 503 with an HTTP-date Retry-After 30 s ahead
    spaced         a valid answer written by json.dumps (spaces), model "internal/secret.gguf"
    interleaved    two tool calls whose arguments come interleaved: call 0 starts, call 1 starts,
                   then call 0's arguments, then call 1's (stream only; whole: a valid answer)
    slow-eof       a valid answer whose body ends 0.3 s after its last frame (`[DONE]`; whole: the
                   JSON): a server slow to close its chunked body (stream only)
    think-merged   vLLM 0.32's deepseek_r1 parser on a busy machine: `<think>` merged into the
                   first reasoning delta ("<think>Two and two"), then " make four.", then the
                   content "Four." (stream only; whole: a valid answer)
    good           a valid short answer

An embeddings request (`POST .../embeddings`) answers 200 with a well-formed list, whose vectors
are wrong by its `model`:
    embed-short    one vector fewer than the inputs
    embed-strings  every vector a base64 text, not a list of numbers
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import socket
import struct
import sys
import time
from email.utils import formatdate

HUGE = 100 * 1024 * 1024
BLOCK = b"x" * (256 * 1024)

OPEN = 0


def _completion(model: str, text: str = "ok", spaced: bool = False) -> bytes:
    doc = {"id": "chatcmpl-h", "object": "chat.completion", "created": 1, "model": model,
           "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
           "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}
    return json.dumps(doc).encode() if spaced else json.dumps(doc, separators=(",", ":")).encode()


def _chunk(model: str, delta: object, finish: object = None, spaced: bool = False) -> bytes:
    doc = {"id": "chatcmpl-h", "object": "chat.completion.chunk", "created": 1, "model": model,
           "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    raw = json.dumps(doc).encode() if spaced else json.dumps(doc, separators=(",", ":")).encode()
    return b"data: " + raw + b"\n\n"


def _head(status: int, ctype: str = "application/json", extra: str = "", length: int | None = None) -> bytes:
    reason = {200: "OK", 307: "Temporary Redirect", 429: "Too Many Requests", 502: "Bad Gateway",
              503: "Service Unavailable"}.get(status, "X")
    lines = [f"HTTP/1.1 {status} {reason}", f"Content-Type: {ctype}"]
    lines.append(f"Content-Length: {length}" if length is not None else "Transfer-Encoding: chunked")
    if extra:
        lines.append(extra)
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _chunked(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


async def _whole(w: asyncio.StreamWriter, status: int, body: bytes, ctype: str = "application/json",
                 extra: str = "") -> None:
    w.write(_head(status, ctype, extra, len(body)) + body)
    await w.drain()


async def _pour(w: asyncio.StreamWriter, first: bytes, total: int, chunked: bool) -> None:
    """Write `first`, then filler up to `total` bytes, until the reader goes away."""
    w.write(_chunked(first) if chunked else first)
    sent = len(first)
    while sent < total:
        w.write(_chunked(BLOCK) if chunked else BLOCK)
        sent += len(BLOCK)
        await w.drain()


def _reset(w: asyncio.StreamWriter) -> None:
    sock = w.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    w.transport.abort()


async def _until_closed(r: asyncio.StreamReader, model: str = "") -> None:
    """Hang: hold the connection until the gateway closes it (so `open` counts only what it holds)."""
    try:
        while await r.read(65536):
            pass
    finally:
        EVENTS.append((time.monotonic(), "closed", model))


async def _chat(r: asyncio.StreamReader, w: asyncio.StreamWriter, model: str, stream: bool) -> None:
    sse = "text/event-stream"
    if model == "hang-headers":
        await _until_closed(r, model)
    elif model == "hang-body":
        if stream:
            w.write(_head(200, sse) + _chunked(_chunk(model, {"content": "a"})))
        else:
            body = _completion(model)
            w.write(_head(200, length=len(body)) + body[: len(body) // 2])
        await w.drain()
        await _until_closed(r, model)
    elif model == "huge-line":
        w.write(_head(200, sse if stream else "application/json"))
        await _pour(w, b"data: " if stream else b'{"choices":[{"message":{"content":"', HUGE, chunked=True)
    elif model == "huge-body":
        w.write(_head(200, sse if stream else "application/json"))
        first = b"data: " + _completion(model)[:-1] + b', "pad": "' if stream else _completion(model)[:-1] + b', "pad": "'
        await _pour(w, first, HUGE, chunked=True)
    elif model == "huge-length":
        w.write(_head(200, sse if stream else "application/json", length=HUGE))
        await _pour(w, b"data: " if stream else b"{", HUGE, chunked=False)
    elif model == "invalid-json":
        if stream:
            w.write(_head(200, sse) + _chunked(b"data: {this is not json\n\n") + _chunked(b""))
        else:
            await _whole(w, 200, b'{"choices": [ not json')
            return
    elif model in ("choices-null", "message-str", "finish-int"):
        if stream:
            shape = {"choices-null": {"choices": None},
                     "message-str": {"choices": [{"index": 0, "delta": "x"}]},
                     "finish-int": {"choices": [{"index": 0, "delta": {"content": "a"}, "finish_reason": 42}]}}[model]
            chunk = b"data: " + json.dumps({"object": "chat.completion.chunk", "model": model, **shape}).encode() + b"\n\n"
            w.write(_head(200, sse) + _chunked(chunk) + _chunked(b"data: [DONE]\n\n") + _chunked(b""))
        else:
            shape = {"choices-null": {"choices": None},
                     "message-str": {"choices": [{"index": 0, "message": "x"}]},
                     "finish-int": {"choices": [{"index": 0, "message": {"content": "a"}, "finish_reason": 42}]}}[model]
            await _whole(w, 200, json.dumps({"object": "chat.completion", "model": model, **shape}).encode())
            return
    elif model == "html":
        await _whole(w, 200, b"<html><body><h1>Welcome to nginx!</h1></body></html>", "text/html")
        return
    elif model == "html-502":
        await _whole(w, 502, b"<html><head><title>502 Bad Gateway</title></head><body>nginx</body></html>",
                     "text/html")
        return
    elif model == "gzip":
        body = (_chunk(model, {"content": "ok"}, "stop") + b"data: [DONE]\n\n") if stream else _completion(model)
        await _whole(w, 200, gzip.compress(body), sse if stream else "application/json", "Content-Encoding: gzip")
        return
    elif model == "reset":
        if stream:
            w.write(_head(200, sse) + _chunked(_chunk(model, {"content": "a"})))
            await w.drain()
            await asyncio.sleep(0.05)
        _reset(w)
        return
    elif model == "redirect":
        await _whole(w, 307, b"", extra="Location: http://127.0.0.1:9/v1/chat/completions")
        return
    elif model == "empty":
        await _whole(w, 200, b"", sse if stream else "application/json")
        return
    elif model == "retry-429":
        await _whole(w, 429, b'{"error": {"message": "slow down"}}', extra="Retry-After: 7")
        return
    elif model == "retry-503-date":
        await _whole(w, 503, b'{"error": {"message": "busy"}}', extra=f"Retry-After: {formatdate(time.time() + 30, usegmt=True)}")
        return
    elif model == "interleaved" and stream:
        def call(index: int, **fn: str) -> dict:
            return {"tool_calls": [{"index": index, **({"id": f"call_{index}", "type": "function"} if "name" in fn
                                                        else {}), "function": fn}]}
        body = (_chunk(model, {"role": "assistant", **call(0, name="f", arguments="")})
                + _chunk(model, call(1, name="g", arguments="")) + _chunk(model, call(0, arguments='{"a":1}'))
                + _chunk(model, call(1, arguments='{"b":2}')) + _chunk(model, {}, "tool_calls") + b"data: [DONE]\n\n")
        await _whole(w, 200, body, sse)
        return
    elif model == "slow-eof" and stream:
        w.write(_head(200, sse) + _chunked(_chunk(model, {"role": "assistant", "content": "ok"}))
                + _chunked(_chunk(model, {}, "stop")) + _chunked(b"data: [DONE]\n\n"))
        await w.drain()
        await asyncio.sleep(0.3)
        w.write(_chunked(b""))
    elif model == "think-merged" and stream:
        body = (_chunk(model, {"role": "assistant", "content": ""}) + _chunk(model, {"reasoning": "<think>Two and two"})
                + _chunk(model, {"reasoning": " make four."}) + _chunk(model, {"content": "Four."})
                + _chunk(model, {}, "stop") + b"data: [DONE]\n\n")
        await _whole(w, 200, body, sse)
        return
    else:  # good, spaced, interleaved and think-merged (whole)
        spaced = model == "spaced"
        name = "internal/secret.gguf" if spaced else model
        if stream:
            body = (_chunk(name, {"role": "assistant", "content": "ok"}, spaced=spaced)
                    + _chunk(name, {}, "stop", spaced=spaced) + b"data: [DONE]\n\n")
            await _whole(w, 200, body, sse)
        else:
            await _whole(w, 200, _completion(name, spaced=spaced))
        return
    await w.drain()


async def _embeddings(w: asyncio.StreamWriter, model: str, inputs: object) -> None:
    n = len(inputs) if isinstance(inputs, list) else 1
    vector: object = "AAAAPwAAgD4=" if model == "embed-strings" else [0.5, 0.25]
    count = n - 1 if model == "embed-short" else n
    data = [{"object": "embedding", "index": i, "embedding": vector} for i in range(count)]
    await _whole(w, 200, json.dumps({"object": "list", "data": data, "model": model,
                                     "usage": {"prompt_tokens": n, "total_tokens": n}}).encode())


async def _serve(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
    global OPEN
    OPEN += 1
    try:
        while True:
            head = await r.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, path, _ = lines[0].split(" ", 2)
            headers = {k.strip().lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:] if ":" in ln)}
            body = await r.readexactly(int(headers.get("content-length", "0")))
            if method == "GET" and path.endswith("/models"):
                MODELS["asked"] += 1
                if MODELS["late"] > 0:  # a busy server: the answer comes, but late
                    MODELS["late"] -= 1
                    await asyncio.sleep(MODELS["delay_s"])
                await _whole(w, 200, b'{"object":"list","data":[]}')
                continue
            if method == "POST" and path == "/late-models":
                MODELS.update(json.loads(body))
                await _whole(w, 200, b"{}")
                continue
            if method == "GET" and path == "/stats":
                await _whole(w, 200, json.dumps({"open": OPEN - 1, "models_asked": MODELS["asked"],
                                                 "models_late": MODELS["late"]}).encode())
                continue
            if method == "GET" and path == "/events":
                await _whole(w, 200, json.dumps(EVENTS).encode())
                EVENTS.clear()
                continue
            if method == "GET" and path == "/last-headers":
                await _whole(w, 200, json.dumps(LAST_HEADERS).encode())
                continue
            if method == "POST" and path.endswith("/embeddings"):
                req = json.loads(body or b"{}")
                await _embeddings(w, str(req.get("model")), req.get("input"))
                continue
            if method == "POST" and path.endswith("/chat/completions"):
                LAST_HEADERS.clear()
                LAST_HEADERS.update(headers)
                req = json.loads(body or b"{}")
                EVENTS.append((time.monotonic(), "request", str(req.get("model"))))
                await _chat(r, w, str(req.get("model")), bool(req.get("stream")))
                if w.transport.is_closing():
                    return
                continue
            await _whole(w, 404, b'{"error": {"message": "no such path"}}')
    except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError, ValueError):
        pass
    finally:
        OPEN -= 1
        w.transport.abort()


LAST_HEADERS: dict[str, str] = {}
# GET /models: how often it was asked, and how many of the next answers come `delay_s` late
# (POST /late-models {"late": N, "delay_s": S})
MODELS: dict[str, float] = {"asked": 0, "late": 0, "delay_s": 0.0}
EVENTS: list[tuple[float, str, str]] = []  # (monotonic time, "request" | "closed", model), for /events


async def main(port: int) -> None:
    server = await asyncio.start_server(_serve, "127.0.0.1", port)
    bound = server.sockets[0].getsockname()[1]
    print(f"listening on http://127.0.0.1:{bound}", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=0)
    try:
        asyncio.run(main(ap.parse_args().port))
    except KeyboardInterrupt:
        sys.exit(0)
