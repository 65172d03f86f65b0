"""The upstream client: one pooled aiohttp session per backend, and the SSE line reader.

Only the configured base URL is ever contacted (the path is ours, never the client's), redirects
are not followed, and nothing of the client's request but the body we built is forwarded: no
client headers, no client key. Upstream failures become `GatewayError`s whose messages name the
backend but carry neither its address nor a stack trace.
"""

from __future__ import annotations

import errno
import os
import re
import weakref
from contextvars import ContextVar
from typing import AsyncIterable, AsyncIterator, Protocol

import aiohttp
import msgspec

from ..config import Backend
from ..errors import GatewayError, clean_message
from .retry_after import retry_after_seconds
from .read import read_body, sse_payloads

_MAX_ERROR_BODY = 64 * 1024


def _error_text(raw: bytes) -> str:
    try:
        doc = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return raw.decode("utf-8", "replace").strip() or "(empty body)"
    if isinstance(doc, dict):
        err = doc.get("error")
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return err["message"]
        if isinstance(err, str):
            return err
        for key in ("message", "detail"):
            if isinstance(doc.get(key), str):
                return doc[key]
    return raw.decode("utf-8", "replace")[:1000]


class UpstreamFailure(GatewayError):
    """The backend failed a request before any byte of an answer: it could not be reached
    (`cause` "unreachable", or "connect_timeout"), it hung up or reset the connection before
    answering ("reset"), or it answered an error status (`cause` "status", `upstream_status` the
    status it sent). What another backend may answer instead is request/failover.py's call."""

    def __init__(self, kind, message: str, *, cause: str, upstream_status: int | None = None, **kw) -> None:
        super().__init__(kind, message, **kw)
        self.cause = cause
        self.upstream_status = upstream_status


class StreamedBody(Protocol):
    """A request body sent as it arrives (a client's upload, surfaces/media/relay.py), not bytes.
    `fresh()` gives it from its start for one send, or raises GatewayError when it cannot be
    sent again (part of it already went out: it is not replayable); `failure` is the client's
    fault that stopped it mid-way (over the size limit, the client gone), raised instead of the
    backend's failure that aborting the send provokes."""

    failure: GatewayError | None

    def fresh(self) -> AsyncIterable[bytes]: ...


_KEEPALIVE_S = 30.0  # how long an idle upstream connection is kept, unless the upstream says less
_KEEPALIVE_TIMEOUT = re.compile(rb"timeout\s*=\s*(\d+(?:\.\d+)?)", re.I)


def _stale(err: BaseException) -> bool:
    """A failure that means "this idle connection was already closed by the upstream", with no
    byte of an answer read: a disconnect before any part of a response (aiohttp's `message` is
    then its default text, else the part of the response it had parsed), or a reset / broken
    pipe / closing transport while the request was being written."""
    if isinstance(err, aiohttp.ServerDisconnectedError):
        return err.message is None or isinstance(err.message, str)
    if isinstance(err, aiohttp.ClientOSError):
        return err.errno in (None, errno.ECONNRESET, errno.EPIPE)
    return isinstance(err, ConnectionResetError)


# Set (in the requesting task's context) when the connection a request went out on had served
# one before: what the stale-connection rule below needs to know.
_reused: ContextVar[bool] = ContextVar("hlf_upstream_reused", default=False)


class _Connector(aiohttp.TCPConnector):
    """A pooled connector that tells a reused connection from a new one by remembering the
    protocols it has handed out (a weak set: a closed connection drops out). aiohttp's request
    tracing says the same, but builds its trace objects and signals for every request: about
    50-100 us of CPU per request measured on this machine, more than the gateway's own work."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self._seen: weakref.WeakSet = weakref.WeakSet()

    async def connect(self, req, traces, timeout):  # type: ignore[override]
        conn = await super().connect(req, traces, timeout)
        proto = conn.protocol
        if proto is not None:
            if proto in self._seen:
                _reused.set(True)
            else:
                self._seen.add(proto)
        return conn


class UpstreamClient:
    """Stale keep-alive connections: an upstream closes an idle connection after its own
    keep-alive timeout (llama.cpp: `Keep-Alive: timeout=5`), or right after some answers, and a
    request sent on it in that moment fails before any byte comes back. So the idle time is
    capped below what the upstream announces, and a request that failed that way on a REUSED
    connection is sent once more on a fresh one (it cannot have reached the upstream's model: the
    upstream had closed that connection). A fresh connection's failure, or one after any byte of
    an answer, is never retried.

Side requests (the tokenizer's /apply-template and /tokenize, run beside a chat request:
upstream/prompt_count.py) have a keep-alive pool of their own: they never take a connection a
chat request would have reused, so counting a prompt does not change which connections the
answers travel on (llama.cpp closes a connection a moment after a stream: which one a request
lands on matters)."""

    def __init__(self, name: str, cfg: Backend, headers: dict[str, str] | None = None) -> None:
        self.name = name
        self.cfg = cfg
        self.headers = dict(headers or {})  # sent with every request (a peer's backend: app/peers.py)
        self.base = cfg.url.rstrip("/")
        # vLLM serves /tokenize and /metrics beside /v1, at the server root
        self.root = self.base[: -len("/v1")] if self.base.endswith("/v1") else self.base
        self._session: aiohttp.ClientSession | None = None
        self._fresh: aiohttp.ClientSession | None = None  # one connection per request: retries
        self._side: aiohttp.ClientSession | None = None  # side requests (see the class docstring)
        self.keepalive_s = _KEEPALIVE_S
        self.retried = 0  # requests resent after a stale connection (tests, diagnostics)

    def _new_session(self, *, fresh: bool) -> aiohttp.ClientSession:
        headers = {"content-type": "application/json", **self.headers}
        key = os.environ.get(self.cfg.api_key_env) if self.cfg.api_key_env else None
        if key:
            headers["authorization"] = f"Bearer {key}"
        connector = (
            aiohttp.TCPConnector(limit=0, force_close=True)
            if fresh
            else _Connector(
                limit=0,  # the slot pool bounds concurrency, not the connector
                keepalive_timeout=self.keepalive_s,
                enable_cleanup_closed=True,
            )
        )
        return aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=None, connect=None, sock_connect=self.cfg.timeouts.connect_s),
            headers=headers,
            auto_decompress=False,
            # auto_decompress is off: asking for gzip would get bodies we cannot read
            skip_auto_headers=("User-Agent", "Accept-Encoding"),
        )

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = self._new_session(fresh=False)
        return self._session

    def _side_session(self) -> aiohttp.ClientSession:
        if self._side is None or self._side.closed:
            self._side = self._new_session(fresh=False)
        return self._side

    def _fresh_session(self) -> aiohttp.ClientSession:
        if self._fresh is None or self._fresh.closed:
            self._fresh = self._new_session(fresh=True)
        return self._fresh

    async def close(self) -> None:
        for s in (self._session, self._fresh, self._side):
            if s is not None:
                await s.close()

    async def _request(self, method: str, url: str, side: bool = False, streamed: StreamedBody | None = None,
                       **kw) -> aiohttp.ClientResponse:
        """One request, resent once on a fresh connection when a reused one turned out stale
        (a `streamed` body from its start, if it still can be)."""
        _reused.set(False)
        if streamed is not None:
            kw["data"] = streamed.fresh()
        try:
            resp = await (self._side_session() if side else self.session()).request(method, url, allow_redirects=False, **kw)
        except (aiohttp.ClientConnectionError, OSError) as err:
            if not (_reused.get() and _stale(err)) or (streamed is not None and streamed.failure is not None):
                raise
            self.retried += 1
            if streamed is not None:
                kw["data"] = streamed.fresh()
            resp = await self._fresh_session().request(method, url, allow_redirects=False, **kw)
        self._learn_keepalive(resp)
        return resp

    def _learn_keepalive(self, resp: aiohttp.ClientResponse) -> None:
        """Idle connections are dropped a second before the upstream's announced keep-alive
        timeout would close them under us."""
        ka = resp.headers.get("keep-alive")
        if not ka:
            return
        m = _KEEPALIVE_TIMEOUT.search(ka.encode("latin-1", "replace"))
        if m is None:
            return
        limit = max(0.5, float(m.group(1)) - 1.0)
        if limit < self.keepalive_s:
            self.keepalive_s = limit
            for session in (self._session, self._side):  # a session made later gets it at birth
                connector = session.connector if session is not None else None
                if connector is not None and hasattr(connector, "_keepalive_timeout"):
                    # aiohttp has no public setter; it reads this on every reuse and cleanup
                    connector._keepalive_timeout = limit

    async def read_all(self, resp: aiohttp.ClientResponse) -> bytes:
        """A whole (non-streaming) answer, at most `limits.max_body_bytes` (upstream_read)."""
        return await read_body(resp, self.name, self.cfg.limits.max_body_bytes)

    def sse(self, resp: aiohttp.ClientResponse) -> AsyncIterator[list[bytes]]:
        """The `data:` payloads of a streaming answer, lines at most `limits.max_line_bytes`."""
        return sse_payloads(resp.content, self.name, self.cfg.limits.max_line_bytes)

    def _unreachable(self, err: BaseException) -> UpstreamFailure:
        if isinstance(err, aiohttp.ServerDisconnectedError) or (
            isinstance(err, aiohttp.ClientOSError) and not isinstance(err, aiohttp.ClientConnectorError)
        ):  # (a ClientOSError after connecting: it reset the connection instead of answering)
            # it accepted the connection: reachable, but it hung up before answering
            return UpstreamFailure("upstream_error", f"backend {self.name!r} closed the connection before answering",
                                   cause="reset")
        reason, cause = "connection refused", "unreachable"
        if isinstance(err, aiohttp.ClientConnectorError) and err.os_error and err.os_error.errno:
            reason = os.strerror(err.os_error.errno).lower()  # strerror text can hold the address
        elif isinstance(err, (TimeoutError, aiohttp.ServerTimeoutError)):
            reason, cause = f"no connection within {self.cfg.timeouts.connect_s:g} s", "connect_timeout"
        elif not isinstance(err, aiohttp.ClientConnectorError):
            reason = type(err).__name__
        return UpstreamFailure("upstream_unreachable", f"backend {self.name!r} is unreachable ({reason})",
                               cause=cause)

    async def post(self, path: str, body: bytes | StreamedBody, root: bool = False, side: bool = False,
                   headers: dict[str, str] | None = None) -> aiohttp.ClientResponse:
        """POST and return the response once its headers are in; a non-2xx status is raised as
        GatewayError("upstream_error") with the upstream's own message and status. `side`: on the
        side requests' own pool (see the class docstring). `headers`: per-request extras (a
        trace's `traceparent`, a relayed upload's content type and length). `body`: bytes, or a
        StreamedBody sent as it arrives."""
        url = (self.root if root else self.base) + path
        streamed = None if isinstance(body, bytes) else body
        kw: dict = {"data": body} if streamed is None else {"streamed": streamed}
        if headers is not None:
            kw["headers"] = headers
        try:
            resp = await self._request("POST", url, side, **kw)
        except (aiohttp.ClientConnectionError, TimeoutError, OSError) as err:
            if streamed is not None and streamed.failure is not None:
                raise streamed.failure from None  # the client's fault (too large, gone), not the backend's
            raise self._unreachable(err) from None
        if resp.status >= 300:
            try:
                raw = await resp.content.read(_MAX_ERROR_BODY)
            except (aiohttp.ClientError, OSError):
                raw = b""
            finally:
                resp.close()
            raise UpstreamFailure(
                "upstream_error",
                f"backend {self.name!r} answered {resp.status}: {clean_message(_error_text(raw))}",
                cause="status",
                upstream_status=resp.status,
                status=resp.status if resp.status >= 400 else 502,
                # a busy or rate-limiting backend knows best when to come back: pass it on
                retry_after=retry_after_seconds(resp.headers.get("retry-after"))
                if resp.status in (429, 503, 529) else None,
            )
        return resp

    async def get_json(self, path: str, timeout_s: float = 5.0, root: bool = False) -> object:
        """GET a JSON document at `path` under the /v1 base URL (`root`: under the server's root)."""
        try:
            async with await self._request("GET", (self.root if root else self.base) + path,
                                           timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
                raw = await read_body(resp, self.name, self.cfg.limits.max_body_bytes)
                if resp.status != 200:
                    raise GatewayError(
                        "upstream_error",
                        f"backend {self.name!r} answered {resp.status} to {path}",
                        status=502,
                    )
                return msgspec.json.decode(raw)
        except aiohttp.ClientConnectionError as err:  # (aiohttp's connect timeout is one)
            raise self._unreachable(err) from None
        except TimeoutError:  # connected, but no whole answer in time (a black-holed link)
            raise UpstreamFailure("upstream_unreachable", f"backend {self.name!r} did not answer {path} "
                                  f"within {timeout_s:g} s", cause="timeout") from None
        except OSError as err:
            raise self._unreachable(err) from None
        except msgspec.DecodeError:
            raise GatewayError("upstream_error", f"backend {self.name!r}: {path} is not JSON") from None

    async def get_text(self, url_path: str, timeout_s: float = 5.0) -> str:
        """GET a path relative to the server root (e.g. /metrics), not to the /v1 base."""
        try:
            async with await self._request("GET", self.root + url_path, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
                if resp.status != 200:
                    raise GatewayError("upstream_error", f"backend {self.name!r} answered {resp.status} to {url_path}", status=502)
                raw = await read_body(resp, self.name, self.cfg.limits.max_body_bytes)
                return raw.decode(resp.charset or "utf-8", "replace")
        except (aiohttp.ClientConnectionError, TimeoutError, OSError) as err:
            raise self._unreachable(err) from None
