"""One client request from route to access-log line: the wrapper every surface handler runs in.

It registers the request record, refuses while draining, checks headers and the key (401 before
the body is read), runs the handler, and turns whatever ends it (an answer, a `GatewayError`, the
client leaving, a crash) into the caller's dialect and one observed outcome.
"""

from __future__ import annotations

import asyncio
import logging
import traceback
from typing import Awaitable, Callable

from aiohttp import web

from ..errors import GatewayError
from ..policy import limits
from ..policy.auth import Auth
from ..request.exchange import client_gone
from ..request.outcome import FAILED, LEFT, OK
from ..request.tracker import Tracked, new_request_id
from ..surfaces.anthropic import errors as anthropic_errors
from ..surfaces.completions import errors as infill_errors
from ..surfaces.gemini import errors as gemini_errors
from ..surfaces.loading import EARLY, Early
from ..surfaces.ollama import errors as ollama_errors
from ..surfaces.openai import errors as openai_errors
from ..surfaces.responses import errors as responses_errors
from .gateway import BODY_BYTES, GATEWAY, TRACKED, Gateway
from .timing import server_timing

log = logging.getLogger("homelab_frontend")

Handler = Callable[[web.Request, Gateway, Tracked], Awaitable[web.StreamResponse]]
Renderer = Callable[[GatewayError], tuple[int, bytes, dict[str, str]]]

# Each dialect's error renderer (surfaces/<dialect>/errors.py). A surface registered under a
# dialect missing here is refused when the routes are built: it would otherwise answer its errors
# in another dialect's shape, which its clients cannot read.
RENDERERS: dict[str, Renderer] = {
    "openai": openai_errors.render_error,
    "anthropic": anthropic_errors.render_error,
    "gemini": gemini_errors.render_error,
    "responses": responses_errors.render_error,
    "ollama": ollama_errors.render_error,
    "completions": openai_errors.render_error,  # legacy completions: OpenAI's own error shape
    "infill": infill_errors.render_error,
    # the relayed calls (surfaces/media/): OpenAI's error shape, what their clients read
    "rerank": openai_errors.render_error,
    "transcription": openai_errors.render_error,
    "speech": openai_errors.render_error,
    "images": openai_errors.render_error,
}


def surface(dialect: str, fn: Handler):
    render = RENDERERS.get(dialect)
    if render is None:
        raise ValueError(f"surface dialect {dialect!r} has no error renderer: add its render_error to "
                         f"app/request_scope.RENDERERS (known: {', '.join(RENDERERS)})")

    async def handler(request: web.Request) -> web.StreamResponse:
        gw: Gateway = request.app[GATEWAY]
        t = Tracked(new_request_id(), dialect, "", None, False)
        t.client = gw.client_address(request)
        t.endpoint = endpoint(request)
        if gw.tracing is not None:
            t.trace = gw.tracing.begin(request.headers)
            if gw.tracing.capture:
                request[TRACKED] = t
        gw.tracker.add(t)
        try:
            if gw.draining:
                raise GatewayError("overloaded", "the gateway is shutting down", status=503, retry_after=5)
            limits.check_headers(request, gw.cfg.limits)
            # 401 before the body is read; a key in the URL only where Google's clients put it
            t.key_name = gw.auth.authenticate(request, query_key=dialect == "gemini").name or None
            resp = await fn(request, gw, t)
            t.status = resp.status
            return resp
        except GatewayError as err:
            return await _error_answer(request, t, err, render)
        except asyncio.CancelledError:
            own = t.own_cancel_error()
            if own is None:
                _client_left(t)
                raise
            return await _error_answer(request, t, own, render)
        except Exception as exc:
            if isinstance(exc, ConnectionResetError) and client_gone(request):
                # A write to a client that already left, a moment before aiohttp cancels us.
                _client_left(t)
                raise asyncio.CancelledError() from None
            log.error("request %s failed:\n%s", t.id, traceback.format_exc())
            internal = GatewayError("api_error", f"internal error in the gateway (request id {t.id})")
            return await _error_answer(request, t, internal, render)
        finally:
            t.key_name = Auth.key_name(request)
            t.body_bytes = request.get(BODY_BYTES)
            if t.drain is not None and not t.drain.done():
                # a backend that must not be aborted (request/drain.py): the record stays live,
                # in phase draining, and is observed once the upstream answer has ended
                t.drain.add_done_callback(lambda _: _finished(gw, t, request.path))
            else:
                _finished(gw, t, request.path)

    return handler


def _finished(gw: Gateway, t: Tracked, path: str) -> None:
    gw.tracker.remove(t)
    gw.observe(t, path)


def endpoint(request: web.Request) -> str:
    """The route a request matched, as written in app/routes.py (its path family: a model in
    the path stays `{model}`), for the dashboard and the access log."""
    route = request.match_info.route
    resource = route.resource if route is not None else None
    return resource.canonical if resource is not None else request.path


def _client_left(t: Tracked) -> None:
    if t.outcome != OK:
        # it had failed already (an upstream failure, a timeout) and its error went out; a client
        # that hangs up on reading that error (Codex does, at response.failed) changes neither
        return
    if t.answered:  # it had its whole answer: the SDK closes at [DONE], before the gateway's EOF
        t.status = t.status or 200
        return
    t.end(LEFT)
    t.status = 499  # nginx's "client closed request": nothing was sent


async def _error_answer(request: web.Request, t: Tracked, err: GatewayError, render) -> web.StreamResponse:
    """The error in the caller's dialect, unless the answer has already begun on the wire (a
    stream that failed, or was cancelled by the gateway, while its last bytes were still being
    written to a client that stopped reading): aiohttp would then write the error response
    inside the first one's body. The connection is cut instead, the one signal left, and the
    access log keeps the status the client got (an answer begins only as a 200: every error
    before that is rendered whole)."""
    early = request.pop(EARLY, None)
    if early is not None:  # its headers went out while its model loaded (surfaces/loading.py)
        return await _early_failure(t, err, early)
    if request.writer.output_size:
        t.fail(err.kind)
        t.status = t.status or 200
        raise asyncio.CancelledError()
    return _error_response(t, err, render)


async def _early_failure(t: Tracked, err: GatewayError, early: Early) -> web.StreamResponse:
    """A stream whose headers went out while its model loaded, failed before its answer began
    (the start failed, the queue timed out): the error as the dialect's in-stream frame, which is
    all a stream can still say, and the end of the stream. The status its headers said was 200."""
    t.end(FAILED, err.kind, begun=False)
    t.status = 200
    await early.out.write(early.fail(err))
    await early.out.write_eof()
    return early.out


def _error_response(t: Tracked, err: GatewayError, render) -> web.Response:
    status, body, headers = render(err)
    t.status = status
    t.end(FAILED, err.kind, begun=False)
    return web.Response(
        status=status, body=body, content_type="application/json",
        headers={**headers, "request-id": t.id, "server-timing": server_timing(t)},
    )
