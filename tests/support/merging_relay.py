"""A TCP relay that merges what the server writes: toward the client it forwards in batches,
everything that arrived during a pause in one write, as a buffering proxy or a slow network
does. With it a test shows what survives when a client's reads no longer follow the server's
writes (a pause between two writes, for one, does not).

    with MergingRelay(target_port, pause_s=0.05) as relay:
        run_client(base_url=relay.url + "/llm")
"""

from __future__ import annotations

import asyncio
import threading


class MergingRelay:
    def __init__(self, target_port: int, pause_s: float = 0.05, read_max: int = 1 << 20) -> None:
        self.target_port, self.pause_s, self.read_max = target_port, pause_s, read_max
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._handle, "127.0.0.1", 0), self._loop).result(10)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def _pipe(self, r: asyncio.StreamReader, w: asyncio.StreamWriter, pause_s: float) -> None:
        try:
            while data := await r.read(self.read_max):
                w.write(data)
                await w.drain()
                if pause_s:
                    await asyncio.sleep(pause_s)  # what arrives meanwhile goes out as one write
        except ConnectionError:
            pass
        finally:
            w.close()

    async def _handle(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        ur, uw = await asyncio.open_connection("127.0.0.1", self.target_port)
        await asyncio.gather(self._pipe(cr, uw, 0), self._pipe(ur, cw, self.pause_s))

    def __enter__(self) -> "MergingRelay":
        return self

    def __exit__(self, *exc: object) -> None:
        async def close() -> None:
            self._server.close()
            # the pipes still open end here, on their loop: left to the garbage collector, they
            # closed their sockets on a loop already closed (an unraisable warning in the run)
            pipes = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in pipes:
                t.cancel()
            await asyncio.gather(*pipes, return_exceptions=True)
            await self._server.wait_closed()

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
