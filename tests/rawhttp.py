"""curl-shaped raw HTTP for wire details: exact bytes, SSE frames, and clients that vanish."""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
import urllib.request
from typing import Callable
from urllib.parse import urlsplit

WHEN_TIMEOUT_S = 60.0  # post_and_vanish's wait for its evidence: generous, the machine may be busy


def _request_bytes(url: str, body: dict | bytes, headers: dict | None = None) -> tuple[tuple[str, int], bytes]:
    parts = urlsplit(url)
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    head = [
        f"POST {parts.path}{'?' + parts.query if parts.query else ''} HTTP/1.1",
        f"Host: {parts.hostname}:{parts.port}",
        "Content-Type: application/json",
        f"Content-Length: {len(data)}",
        "Connection: close",
    ]
    for k, v in (headers or {}).items():
        head.append(f"{k}: {v}")
    return (parts.hostname, parts.port), ("\r\n".join(head) + "\r\n\r\n").encode() + data


def post_raw(url: str, body: dict | bytes, headers: dict | None = None, timeout: float = 30) -> tuple[int, dict, bytes]:
    """-> (status, headers lower-cased, body with chunked encoding undone)."""
    addr, req = _request_bytes(url, body, headers)
    with socket.create_connection(addr, timeout=timeout) as s:
        s.sendall(req)
        buf = b""
        while True:
            got = s.recv(65536)
            if not got:
                break
            buf += got
    head, _, rest = buf.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    status = int(lines[0].split()[1])
    hdrs = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        hdrs[k.strip().lower()] = v.strip()
    if hdrs.get("transfer-encoding") == "chunked":
        rest = _dechunk(rest)
    return status, hdrs, rest


def _dechunk(data: bytes) -> bytes:
    out = b""
    while data:
        size_line, _, data = data.partition(b"\r\n")
        size = int(size_line.split(b";")[0] or b"0", 16)
        if size == 0:
            break
        out += data[:size]
        data = data[size + 2:]
    return out


def post_and_vanish(url: str, body: dict, *, after_bytes: int = 0, after_s: float = 0.0,
                    until: bytes | None = None, when: Callable[[], object] | None = None,
                    headers: dict | None = None, rst: bool = False) -> bytes:
    """Send a request, read until `after_bytes` of response arrived, or the bytes `until`
    (or `after_s` passed), then drop the connection the way a killed client does. -> what was
    read. `when`: first wait until `when()` holds (the evidence that the request is where the
    test means it to be when its client leaves: queued in the gateway, say); `after_s` then
    counts from there."""
    addr, req = _request_bytes(url, body, headers)
    s = socket.create_connection(addr, timeout=30)
    try:
        s.sendall(req)
        got = b""
        if when is not None:
            give_up = time.monotonic() + WHEN_TIMEOUT_S
            while not when():
                if time.monotonic() > give_up:
                    raise AssertionError(f"the request never got there within {WHEN_TIMEOUT_S:g} s")
                time.sleep(0.02)
        deadline = time.monotonic() + after_s
        if after_bytes or until is not None:
            while len(got) < after_bytes or (until is not None and until not in got):
                chunk = s.recv(65536)
                if not chunk:
                    break
                got += chunk
        remaining = deadline - time.monotonic()
        if remaining > 0:
            time.sleep(remaining)
        return got
    finally:
        if rst:  # a reset instead of an orderly FIN, like a client host that vanished
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()


def stream_on_thread(url: str, body: dict, headers: dict, *, timeout: float) -> tuple[list[bytes], threading.Event]:
    """POST `body` and read its streamed answer on a daemon thread, for a test that acts while
    it runs. -> the chunks read so far (a list that grows), and an event set when the answer
    ended, however it ended."""
    chunks: list[bytes] = []
    done = threading.Event()
    req = urllib.request.Request(url, method="POST", headers={**headers, "content-type": "application/json"},
                                 data=json.dumps(body).encode())

    def read() -> None:
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                while chunk := resp.read1(65536):
                    chunks.append(chunk)
        finally:
            done.set()

    threading.Thread(target=read, daemon=True).start()
    return chunks, done


class HeldStream:
    """A streamed request read on a thread until closed: it holds a gateway slot and a backend
    sequence while the test does something else. `bytes`: how much of the answer has come;
    `started(chunk, total)` says when tokens flow (waited for up to `start_timeout` seconds)."""

    def __init__(self, url: str, body: dict, *, started: Callable[[bytes, int], bool], timeout: float,
                 start_timeout: float, what: str = "stream") -> None:
        addr, req = _request_bytes(url, body)
        self.sock = socket.create_connection(addr, timeout=timeout)
        self.sock.sendall(req)
        self.bytes = 0
        self.first = threading.Event()
        self._started = started
        threading.Thread(target=self._read, daemon=True).start()
        assert self.first.wait(start_timeout), f"the {what} did not start"

    def _read(self) -> None:
        try:
            while got := self.sock.recv(65536):
                self.bytes += len(got)
                if self._started(got, self.bytes):
                    self.first.set()
        except OSError:
            return

    def close(self) -> None:
        # shutdown first: a plain close() would wait for the reader thread's recv() to return
        # before the kernel lets go of the socket and sends the FIN
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


def sse_data(body: bytes) -> list[bytes]:
    return [line[6:] for line in body.split(b"\n") if line.startswith(b"data: ")]


def sse_events(body: bytes) -> list[tuple[str | None, dict | str]]:
    """-> [(event name or None, parsed data)] for every frame."""
    out = []
    for frame in body.split(b"\n\n"):
        if not frame.strip():
            continue
        name, data = None, None
        for line in frame.split(b"\n"):
            if line.startswith(b"event:"):
                name = line[6:].strip().decode()
            elif line.startswith(b"data:"):
                raw = line[5:].strip()
                try:
                    data = json.loads(raw)
                except ValueError:
                    data = raw.decode()
        out.append((name, data))
    return out
