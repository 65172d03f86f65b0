"""The HTTP side of a managed backend's life: is it ready, and vLLM's sleep mode.

Readiness is `GET ready_url` (default `<url>/models`, or the server's root + the backend's
`health_path` for a server without /v1/models, such as whisper.cpp's /health) answering 200: vLLM binds its port only
once the model is loaded; llama-server binds at once and answers 503 "Loading model" until it
is. vLLM's sleep endpoints sit at the server's root, beside /v1, and exist only with
`VLLM_SERVER_DEV_MODE=1` and `--enable-sleep-mode`: `POST /sleep?level=N` returns when the
memory is freed, `POST /wake_up` when it is back, `GET /is_sleeping` says which.
"""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

import aiohttp

from .. import config as cfgmod
from ..upstream import backend_kind

TIMEOUT_S = 2.0


def ready_url(b: cfgmod.Backend) -> str:
    assert b.run is not None
    if b.run.ready_url:
        return b.run.ready_url
    health = backend_kind.health_path(b)
    return root_url(b) + health if health is not None else b.url.rstrip("/") + "/models"


def root_url(b: cfgmod.Backend) -> str:
    url = b.url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


class Prober:
    """One small client session for every managed backend's probes (not the request pools)."""

    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=TIMEOUT_S),
                connector=aiohttp.TCPConnector(limit=0, force_close=True))
        return self._session

    async def ready(self, b: cfgmod.Backend) -> bool:
        try:
            async with self.session().get(ready_url(b)) as r:
                await r.read()
                return r.status == 200
        except (aiohttp.ClientError, OSError, TimeoutError):
            return False

    async def listening(self, b: cfgmod.Backend) -> bool:
        """Whether something accepts connections at the backend's address now: before a spawn,
        that is a process the gateway did not start (or one it stopped that has not let go)."""
        parts = urlsplit(b.url)
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            return False
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(parts.hostname, port), TIMEOUT_S)
        except (OSError, TimeoutError):
            return False
        writer.close()
        return True

    async def _post(self, url: str, timeout_s: float) -> None:
        async with self.session().post(url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
            body = await r.read()
            if r.status != 200:
                raise RuntimeError(f"{url.rsplit('/', 1)[-1]} answered {r.status}: {body[:200]!r}")

    async def sleep(self, b: cfgmod.Backend, level: int, timeout_s: float) -> None:
        await self._post(f"{root_url(b)}/sleep?level={level}", timeout_s)

    async def wake(self, b: cfgmod.Backend, timeout_s: float) -> None:
        await self._post(f"{root_url(b)}/wake_up", timeout_s)

    async def is_sleeping(self, b: cfgmod.Backend) -> bool | None:
        try:
            async with self.session().get(f"{root_url(b)}/is_sleeping") as r:
                if r.status != 200:  # a 404's {"detail": ...} (no dev mode) says nothing of sleep
                    return None
                doc = await r.json(content_type=None)
                return bool(doc.get("is_sleeping")) if isinstance(doc, dict) else None
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError):
            return None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
