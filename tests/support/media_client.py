"""Test-only clients for the relayed calls: multipart forms as curl and the SDKs write them,
WAV audio, and raw uploads that pace themselves or vanish mid-way (the evidence a test waits on
is the upstream's own: the stub's `upload_bytes`, its log)."""

from __future__ import annotations

import io
import math
import socket
import struct
import time
import wave
from typing import Callable
from urllib.parse import urlsplit

BOUNDARY = "hlf-test-boundary-7MA4YWxk"


def wav(seconds: float, rate: int = 16000) -> bytes:
    """A 440 Hz tone, 16-bit mono PCM."""
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        n = int(seconds * rate)
        w.writeframes(b"".join(struct.pack("<h", int(8000 * math.sin(2 * math.pi * 440 * i / rate)))
                               for i in range(n)))
    return buf.getvalue()


def form(fields: list[tuple[str, str]], files: list[tuple[str, str, bytes, str]] = (),
         files_first: bool = False) -> tuple[bytes, str]:
    """(body, content type): text fields and files (name, filename, bytes, type) in that order,
    or the files first (as JS FormData appended in that order writes them)."""
    def text(name: str, value: str) -> bytes:
        return (f"--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n".encode()
                + value.encode() + b"\r\n")

    def file(name: str, filename: str, data: bytes, ctype: str) -> bytes:
        return (f"--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"{name}\"; filename=\"{filename}\"\r\n"
                f"Content-Type: {ctype}\r\n\r\n".encode() + data + b"\r\n")

    t = b"".join(text(n, v) for n, v in fields)
    f = b"".join(file(*x) for x in files)
    return (f + t if files_first else t + f) + f"--{BOUNDARY}--\r\n".encode(), \
        f"multipart/form-data; boundary={BOUNDARY}"


def _head(url: str, ctype: str, length: int | None, headers: dict | None) -> tuple[tuple[str, int], bytes]:
    parts = urlsplit(url)
    lines = [f"POST {parts.path} HTTP/1.1", f"Host: {parts.hostname}:{parts.port}", f"Content-Type: {ctype}",
             "Connection: close"]
    lines.append(f"Content-Length: {length}" if length is not None else "Transfer-Encoding: chunked")
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return (parts.hostname, parts.port), ("\r\n".join(lines) + "\r\n\r\n").encode()


def _read_answer(s: socket.socket) -> tuple[int, dict, bytes]:
    buf = b""
    while True:
        got = s.recv(65536)
        if not got:
            break
        buf += got
    head, _, rest = buf.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    hdrs = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    if hdrs.get("transfer-encoding") == "chunked":
        out = b""
        while rest:
            size_line, _, rest = rest.partition(b"\r\n")
            size = int(size_line.split(b";")[0] or b"0", 16)
            if size == 0:
                break
            out += rest[:size]
            rest = rest[size + 2:]
        rest = out
    return status, hdrs, rest


def upload(url: str, body: bytes, ctype: str, *, headers: dict | None = None, chunked: bool = False,
           piece: int = 64 * 1024, between: Callable[[int], None] | None = None,
           timeout: float = 60) -> tuple[int, dict, bytes]:
    """POST `body` in pieces (`between(sent)` runs after each), -> (status, headers, body)."""
    addr, head = _head(url, ctype, None if chunked else len(body), headers)
    with socket.create_connection(addr, timeout=timeout) as s:
        s.sendall(head)
        sent = 0
        try:
            while sent < len(body):
                data = body[sent:sent + piece]
                s.sendall(b"%x\r\n%s\r\n" % (len(data), data) if chunked else data)
                sent += len(data)
                if between is not None:
                    between(sent)
            if chunked:
                s.sendall(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered (a 413) and closed before the rest: read its answer
        return _read_answer(s)


def upload_and_vanish(url: str, body: bytes, ctype: str, *, send: int, when: Callable[[], object],
                      headers: dict | None = None, timeout_s: float = 60.0) -> None:
    """Send the head and `send` bytes of `body` (its Content-Length the whole), wait until
    `when()` holds, then drop the connection the way a killed client does."""
    addr, head = _head(url, ctype, len(body), headers)
    s = socket.create_connection(addr, timeout=timeout_s)
    try:
        s.sendall(head + body[:send])
        give_up = time.monotonic() + timeout_s
        while not when():
            if time.monotonic() > give_up:
                raise AssertionError("the upload never got where the test wanted it")
            time.sleep(0.02)
    finally:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()
