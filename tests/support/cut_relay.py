"""A TCP relay a test can cut: between a front gateway and a box, as a switch or a cable is.

    with CutRelay(box_port) as relay:      # forwards both ways
        relay.cut()        # connections dropped (reset), new ones refused: the port is closed
        relay.blackhole()  # connections kept but silent both ways, new ones accepted and ignored
        relay.restore()    # forwards again (black-holed connections are dropped first)

Each state change is done when the call returns (it runs on the relay's loop and is waited for,
within 10 s). `accepted` counts connections accepted since the start, `silenced` the bytes a
black hole swallowed: a test waits on those, never on time."""

from __future__ import annotations

import asyncio
import socket
import threading

__all__ = ["CutRelay"]


class CutRelay:
    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.mode = "open"
        self.accepted = 0
        self.silenced = 0
        self._conns: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task] = set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._server: asyncio.AbstractServer | None = None
        self.port = 0
        self._call(self._listen())
        self.url = f"http://127.0.0.1:{self.port}"

    def _call(self, coro) -> object:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port, reuse_address=True)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _close_listener(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _drop_all(self) -> None:
        for w in list(self._conns):
            sock = w.get_extra_info("socket")
            if sock is not None:  # a reset, not a polite FIN: what a cut cable's peer sees on its next write
                try:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                except OSError:
                    pass
            w.close()
        self._conns.clear()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()

    async def _pipe(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            while data := await r.read(1 << 16):
                if self.mode != "open":
                    self.silenced += len(data)
                    continue  # swallowed: the connection stays, nothing passes
                w.write(data)
                await w.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            if self.mode == "open":
                w.close()

    async def _handle(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        self.accepted += 1
        self._conns.add(cw)
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            if self.mode != "open":  # a black hole: accepted, read, never answered
                while data := await cr.read(1 << 16):
                    self.silenced += len(data)
                return
            try:
                ur, uw = await asyncio.open_connection("127.0.0.1", self.target_port)
            except OSError:
                cw.close()
                return
            self._conns.add(uw)
            await asyncio.gather(self._pipe(cr, uw), self._pipe(ur, cw))
        except (ConnectionError, OSError, asyncio.CancelledError):
            pass
        finally:
            self._tasks.discard(task)

    def cut(self) -> None:
        async def go() -> None:
            self.mode = "cut"
            await self._close_listener()
            await self._drop_all()
        self._call(go())

    def blackhole(self) -> None:
        async def go() -> None:
            self.mode = "blackhole"
            if self._server is None:
                await self._listen()
        self._call(go())

    def restore(self) -> None:
        async def go() -> None:
            if self.mode == "blackhole":
                await self._drop_all()
            self.mode = "open"
            if self._server is None:
                await self._listen()
        self._call(go())

    def __enter__(self) -> "CutRelay":
        return self

    def __exit__(self, *exc: object) -> None:
        async def close() -> None:
            await self._close_listener()
            await self._drop_all()

        self._call(close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()
