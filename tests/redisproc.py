"""A throwaway `redis-server` on a free loopback port, for the cluster tests and the benchmark,
and a TCP relay that can cut one client off from it (a network partition on loopback).

    with RedisServer() as r:
        cfg["cluster"] = {"redis_url": r.url, "lease_s": 2}
        ...
        r.stop(); r.start()  # a restart: same port, empty (no persistence)
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import threading
import time

from bench.childproc import START_GUARD_S
from stubproc import free_port



def available() -> bool:
    return shutil.which("redis-server") is not None


class RedisServer:
    def __init__(self, port: int | None = None) -> None:
        self.dir = tempfile.mkdtemp(prefix="hlf-redis-")
        self.proc: subprocess.Popen | None = None
        # a free port can be taken between the probe and redis-server's bind (the suite runs on
        # several workers, beside other work): a port of our own choosing is tried again
        for attempt in range(5):
            self.port = port or free_port()
            self.url = f"redis://127.0.0.1:{self.port}/0"
            try:
                self.start()
                return
            except RuntimeError:
                if port is not None or attempt == 4:
                    raise

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self.dir, "--logfile", ""],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + START_GUARD_S
        while not self.ping():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"redis-server did not start on port {self.port}")
            time.sleep(0.02)

    def ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def client(self):
        import redis

        return redis.Redis(host="127.0.0.1", port=self.port, decode_responses=True, socket_timeout=2)

    def __enter__(self) -> "RedisServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


class TcpRelay:
    """127.0.0.1:port -> 127.0.0.1:target. `cut()` closes every relayed connection and refuses new
    ones (the client sees its Redis vanish while other clients still reach it); `heal()` undoes it."""

    def __init__(self, target_port: int) -> None:
        self.target = target_port
        self.port = free_port()
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self.heal()

    def heal(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self.port))
        sock.listen(64)
        sock.settimeout(0.05)
        self._listener = sock
        threading.Thread(target=self._accept, args=(sock,), daemon=True).start()

    def cut(self) -> None:
        with self._lock:
            listener, self._listener = self._listener, None
            conns, self._conns = self._conns, []
        if listener is not None:
            listener.close()
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            c.close()

    def _accept(self, listener: socket.socket) -> None:
        while self._listener is listener:
            try:
                down, _ = listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            try:
                up = socket.create_connection(("127.0.0.1", self.target), timeout=2)
            except OSError:
                down.close()
                continue
            down.settimeout(None)
            up.settimeout(None)
            with self._lock:
                if self._listener is not listener:
                    down.close()
                    up.close()
                    return
                self._conns += [down, up]
            for a, b in ((down, up), (up, down)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def __enter__(self) -> "TcpRelay":
        return self

    def __exit__(self, *exc: object) -> None:
        self.cut()
