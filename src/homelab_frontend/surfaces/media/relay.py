"""The relay: a model call whose body goes to the backend as the client wrote it, and whose
answer comes back as the backend wrote it. Rerank, speech to text, text to speech and images
are the same call to every engine that serves them (vLLM, llama.cpp, whisper.cpp's server,
speaches, kokoro-fastapi, stable-diffusion.cpp's server), so the gateway translates nothing: its
work is the rules around the call, the same as a chat's.

The steps (one handler per endpoint in handler.py runs them):

1. Read. A JSON body (rerank, score, speech, image generations) whole, under
   `limits.max_body_bytes`, parsed with the JSON limits (`read_json`). A multipart upload
   (transcriptions, translations, image edits) only as far as its head (`read_form`,
   form.py): the text fields up to the first file part. A `model` sent after the file (OpenAI's
   JS SDK writes `file` first) is looked for past it: the file's bytes stay in memory up to
   `limits.max_form_head_bytes`, beyond that they go to a temporary file on disk (`Spill`) and
   come back from there when the upload is relayed, so memory stays bounded whatever the file's
   size. The upload as a whole is bounded by `limits.max_upload_bytes` (default 25 MiB,
   OpenAI's limit): a Content-Length over it is a 413 before a byte is read, a chunked body that
   grows past it a 413 the moment it does.
2. Route: the `model` through aliases and globs (policy/routing.py), 404 listing the models for
   an unknown one; the key's model list (403).
3. Admit: the key's budget and max_concurrent (`Gateway.hold`), a slot through the fair queue,
   with priorities and the queue timeout, as a chat (request/exchange.py). An upload waits for
   its slot unread: the kernel's buffers hold the client back meanwhile.
4. Relay the body: `model` set to the backend's name (`upstream_model`), anything else as the
   client sent it (these APIs carry engine-specific fields: kokoro's `lang_code`,
   stable-diffusion's `steps`; the gateway has no business dropping them), to the path the
   backend's kind serves the endpoint at (upstream/backend_kind.py: llama.cpp's rerank
   quirks, whisper.cpp's /inference). An upload goes on as it arrives (`Upload`, 64 KiB reads
   with aiohttp's own flow control on both sides, never the whole file in memory), with a
   Content-Length when the client sent one. A backend that fails before answering fails over
   to another backend of the model (`Exchange.attempt`), an upload only while none of the file
   has gone out yet (it cannot be read twice).
5. Relay the answer. A JSON answer (rerank results, a transcription's json, images' b64) is
   read whole, bounded (the backend's `limits.max_body_bytes`), checked to be a JSON object,
   the client's model name put back, its units counted (units.py); anything else (audio, a
   transcription's SSE events, text, srt, vtt) is streamed to the client chunk by chunk as it
   comes, with the backend's content type, never collected. The slot is held to the last byte;
   the watchdog's first-byte and idle timeouts apply to a stream, the non-stream total to a
   whole answer.
6. Cancellation is the exchange's (structural): the client leaving cancels the handler's task
   wherever it waits (queued, mid-upload, while an image renders, mid-audio), and leaving the
   Exchange closes the upstream connection, so the backend stops. One outcome per request:
   access log, metrics (the dialect label says the endpoint family), traces, the ledger row.
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
from contextlib import asynccontextmanager
from typing import IO, AsyncIterator, Callable

import aiohttp
import msgspec
from aiohttp import web

from ...errors import GatewayError, clean_message
from ...policy.auth import Principal
from ...policy.routing import Route
from ...request.exchange import Exchange
from ...request.tracker import Tracked
from ...upstream import backend_kind
from ...config import Backend
from ..body import decode_object
from ..context import Gateway
from ..skeleton import stream_response
from .form import FormError, FormHead, boundary_of
from .units import answer_units, wav_seconds

__all__ = ["Spill", "Upload", "admitted", "read_form", "read_json", "relay", "route_form"]

log = logging.getLogger("homelab_frontend")
_encode = msgspec.json.encode
_WAV_HEAD = 64  # of a file, what its WAV header needs


def _model_of(raw: object) -> str:
    if not isinstance(raw, str) or not raw:
        raise GatewayError("invalid_request", "model: required string field is missing", param="model")
    return raw


def _route(request: web.Request, gw: Gateway, t: Tracked, model: str) -> tuple[Route, Principal]:
    t.model = model
    route = gw.router.resolve(model)
    return route, gw.auth.admit(request, route, "openai")


async def read_json(request: web.Request, gw: Gateway, t: Tracked) -> tuple[dict, Route, Principal]:
    """Step 1 and 2 for a JSON call: (the body's object, its route, the key)."""
    body = await gw.read_body(request)
    doc = await gw.parse(body, decode_object)
    route, principal = _route(request, gw, t, _model_of(doc.get("model")))
    return doc, route, principal


def _too_large(limit: int, size: int | None = None) -> GatewayError:
    said = f"the upload is {size} bytes" if size is not None else "the upload is larger than that"
    return GatewayError("request_too_large", f"{said}; the limit is {limit} bytes (limits.max_upload_bytes)")


class Spill:
    """Where a file sent before the form's `model` goes while the model is looked for (form.py):
    a temporary file on disk, made on the first write, gone when closed. Reads and writes are
    of the page cache, in pieces of a socket read: short enough for the event loop."""

    PIECE = 256 * 1024

    def __init__(self) -> None:
        self._file: IO[bytes] | None = None

    def write(self, data: bytes) -> None:
        if self._file is None:
            self._file = tempfile.TemporaryFile(prefix="hlf-upload-")
        self._file.write(data)

    def pieces(self):
        if self._file is None:
            return
        self._file.seek(0)
        while piece := self._file.read(self.PIECE):
            yield piece

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class Upload:
    """The rest of a client's upload after its head, sent to the backend as it arrives
    (upstream/client.py `StreamedBody`). Replayable while nothing past the buffered head has
    been sent; counts what it relays against the upload limit."""

    def __init__(self, request: web.Request, gw: Gateway, form: FormHead, read: int, limit: int) -> None:
        self.request = request
        self.gw = gw
        self.form = form
        self.read = read  # client body bytes read so far
        self.limit = limit
        self.expected = request.content_length
        self.head = b""
        self.failure: GatewayError | None = None
        self.live = False  # bytes past the buffered head have gone out: no second send
        # the file's first bytes, for its WAV header: known only when the file follows the head
        self.file_head = form.rest[:_WAV_HEAD] if form.file_at_end else None
        self.idle_s: float | None = None

    def prepare(self, model: str, extra: dict[str, str], idle_s: float | None = None) -> dict[str, str]:
        """The head as this backend gets it; -> the upload's headers for it. `idle_s`: the
        longest the client may pause mid-upload (the backend's timeouts.idle_s): a client that
        stalls would otherwise hold the slot, and the backend, until the whole request's timeout."""
        self.head = self.form.relay_head(model, extra)
        self.idle_s = idle_s
        headers = {"content-type": self.request.headers.get("content-type", "")}
        if self.expected is not None:
            headers["content-length"] = str(self.expected + len(self.head) - self.form.head_end)
        return headers

    def fresh(self):
        if self.live:
            raise GatewayError("upstream_error", "the backend failed after part of the upload was sent to it, "
                               "and an upload cannot be sent twice", status=502)
        return self._send()

    async def _send(self):
        if self.form.spilled and isinstance(self.form.spill, Spill):
            for piece in self.form.spill.pieces():  # the file sent before the model, from disk
                yield piece
        yield self.head
        rest = self.form.rest
        if rest:
            yield rest
        if self.form.ended or (self.expected is not None and self.read >= self.expected):
            return  # the whole body was read with its head: it can be sent again, as often as need be
        content = self.request.content
        try:
            while True:
                try:
                    async with asyncio.timeout(self.idle_s):
                        chunk = await content.readany()
                except TimeoutError:
                    self.failure = GatewayError("invalid_request", f"the upload stalled: no byte for {self.idle_s:g} s "
                                                f"after {self.read} bytes")
                    raise self.failure from None
                if not chunk:
                    break
                self.live = True
                more = content.read_nowait()  # what else is buffered: fewer, larger writes upstream
                if more:
                    chunk += more
                self.read += len(chunk)
                if self.read > self.limit:
                    self.failure = _too_large(self.limit)
                    raise self.failure
                if self.file_head is not None and len(self.file_head) < _WAV_HEAD:
                    self.file_head += chunk[:_WAV_HEAD - len(self.file_head)]
                yield chunk
        except (aiohttp.ClientError, ConnectionError) as err:
            self.failure = GatewayError("invalid_request", f"the upload broke off: {type(err).__name__}")
            raise self.failure from None
        finally:
            self.gw.note_body(self.request, self.read)
        if self.expected is not None and self.read < self.expected:
            self.failure = GatewayError("invalid_request", f"the upload ended after {self.read} of its "
                                        f"{self.expected} bytes")
            raise self.failure

    def audio_seconds(self) -> float | None:
        """The file's length by its own WAV header (an estimate), once it has all been sent."""
        if self.file_head is None:
            return None
        file_bytes = self.read - self.form.head_end  # the form's tail after the file is a few bytes
        return wav_seconds(self.file_head, file_bytes)


async def read_form(request: web.Request, gw: Gateway, t: Tracked, file_fields: tuple[str, ...]
                    ) -> tuple[FormHead, Upload]:
    """Step 1 for an upload: its head read (form.py), the file not (or, sent before the model,
    out of memory in its Spill: the caller closes `form.spill` when done with the upload)."""
    limit = gw.cfg.limits.max_upload_bytes
    if request.content_length is not None and request.content_length > limit:
        raise _too_large(limit, request.content_length)
    spill = Spill()
    try:
        form = FormHead(boundary_of(request.headers.get("content-type")), file_fields,
                        gw.cfg.limits.max_form_head_bytes, spill=spill)
        read = 0
        while True:
            chunk = await request.content.readany()
            if not chunk:
                form.finish()
                break
            read += len(chunk)
            if read > limit:
                raise _too_large(limit)
            if form.feed(chunk):
                break
    except FormError as err:
        spill.close()
        raise GatewayError("invalid_request", str(err), param=err.param) from None
    except BaseException:
        spill.close()
        raise
    gw.note_body(request, read)
    return form, Upload(request, gw, form, read, limit)


def route_form(request: web.Request, gw: Gateway, t: Tracked, form: FormHead,
               file_fields: tuple[str, ...]) -> tuple[Route, Principal]:
    """Step 2 for an upload: the file part is there, the model routed, the key may use it."""
    if form.file_name is None:
        raise GatewayError("invalid_request", f"{file_fields[0]}: the form has no file part named "
                           f"{file_fields[0]!r}", param=file_fields[0])
    route, principal = _route(request, gw, t, _model_of(form.model))
    field = form.fields.get("stream")
    t.stream = bool(field and field[0].strip().lower() == "true")
    return route, principal


@asynccontextmanager
async def admitted(gw: Gateway, t: Tracked, route: Route, principal: Principal) -> AsyncIterator[Exchange]:
    """Step 3: the key's hold and a slot, for the block's duration."""
    async with gw.hold(principal), Exchange(t, route, gw.clients, principal) as ex:
        await ex.admit()
        yield ex


Body = Callable[[Backend], "tuple[bytes | Upload, dict[str, str] | None]"]
Finish = Callable[[dict, Backend], dict]


def path_for(cfg: Backend, endpoint: str, model: str) -> str:
    path = backend_kind.media_path(cfg, endpoint)
    if path is None:
        raise GatewayError("invalid_request", f"model {model!r} is served by a {cfg.kind} backend, which has no "
                           f"{endpoint.replace('_', ' ')} endpoint", param="model")
    return path


def _is_json(ctype: str) -> bool:
    base = ctype.split(";", 1)[0].strip().lower()
    return base == "application/json" or base.endswith("+json")


async def relay(request: web.Request, gw: Gateway, t: Tracked, ex: Exchange, endpoint: str, body_for: Body,
                *, stream: bool, finish: Finish | None = None) -> web.StreamResponse:
    """Steps 4 and 5: open the backend's answer (failing over before it begins) and relay it."""
    route = ex.route
    failed: list[GatewayError] = []

    async def opener() -> aiohttp.ClientResponse:
        assert ex.backend is not None
        cfg = ex.backend.cfg
        path = path_for(cfg, endpoint, route.client_model)
        body, headers = body_for(cfg)
        if failed and isinstance(body, Upload) and body.live:
            # the last backend read part of the file before it failed: it cannot be sent again,
            # so its failure is the answer (not another backend's half an upload)
            raise failed[-1]
        try:
            return await ex.open(path, body, stream=stream, root=True, headers=headers)
        except GatewayError as err:
            failed.append(err)
            raise

    resp = await ex.attempt(opener)
    ctype = resp.headers.get("content-type", "application/octet-stream")
    assert ex.backend is not None and ex.client is not None
    need = _ANSWER_LIST.get(endpoint)
    if need is not None and not _is_json(ctype):
        raise GatewayError("upstream_malformed", f"backend {ex.backend.name!r} answered {ctype.split(';')[0]!r}, "
                           f"not the JSON of a {endpoint.replace('_', ' ')} answer")
    if _is_json(ctype):
        ex.t.generating()
        raw = await ex.client.read_all(resp)
        ex.complete = True
        doc = _checked(raw, ex.backend.name, need)
        if finish is not None:
            doc = finish(doc, ex.backend.cfg)
        units, tin, tout = answer_units(endpoint, doc)
        _count(t, units, tin, tout)
        if isinstance(doc.get("model"), str):
            doc["model"] = route.client_model  # never the backend's internal name (a file path)
        out = web.Response(body=_encode(doc), content_type="application/json", headers=gw.headers(t))
        await out.prepare(request)
        await out.write_eof()
        t.answered = True
        return out
    return await _stream(request, gw, t, ex, resp, ctype)


# the endpoints whose answer must be a JSON object with this list of objects in it
_ANSWER_LIST = {"rerank": "results", "rerank_v2": "results", "score": "data", "image_generations": "data",
                "image_edits": "data"}


def _checked(raw: bytes, backend: str, need: str | None = None) -> dict:
    try:
        doc = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        raise GatewayError("upstream_malformed", f"backend {backend!r} sent a JSON content type with a body "
                           "that is not JSON") from None
    if not isinstance(doc, dict):
        raise GatewayError("upstream_malformed", f"backend {backend!r} answered a JSON {type(doc).__name__}, "
                           "not an object")
    err = doc.get("error")
    if err and not any(k in doc for k in ("results", "data", "text")):
        message = err.get("message") if isinstance(err, dict) else err
        raise GatewayError("upstream_error", f"backend {backend!r} failed: {clean_message(str(message))}")
    if need is not None:
        items = doc.get(need)
        if not isinstance(items, list) or not all(isinstance(x, dict) for x in items):
            raise GatewayError("upstream_malformed", f"backend {backend!r} answered without a `{need}` list")
    return doc


def _count(t: Tracked, units: dict[str, float], tin: int | None, tout: int | None) -> None:
    if units:
        t.units = {**(t.units or {}), **units}
    if tin is not None:
        t.tokens_in = tin
    if tout is not None:
        t.tokens_out = tout


async def _stream(request: web.Request, gw: Gateway, t: Tracked, ex: Exchange, resp: aiohttp.ClientResponse,
                  ctype: str) -> web.StreamResponse:
    """An answer that is not JSON, relayed as it comes: audio, SSE events, text."""
    # unbuffered, as every streamed answer: an nginx in front would otherwise hold the audio back
    out = stream_response({"content-type": ctype}, gw.headers(t))
    await out.prepare(request)
    content = resp.content
    first = True
    try:
        while True:
            chunk = await content.readany()
            if not chunk:
                break
            if first:
                ex.first_token()
                first = False
            ex.progress += 1
            await ex.send(out, chunk)
    except (aiohttp.ClientError, ConnectionError) as err:
        if request.transport is None or request.transport.is_closing():
            raise asyncio.CancelledError() from None  # it was the client's side that went
        # the backend broke off: the client's answer is cut short, which only a cut connection
        # says (audio has no error frame); the record keeps why, as app/request_scope.py does
        log.warning("request %s: backend %s broke off its answer: %s", t.id, ex.backend.name if ex.backend else "?",
                    type(err).__name__)
        t.fail("upstream_midstream", override=True)
        t.status = out.status
        raise asyncio.CancelledError() from None
    except asyncio.CancelledError:
        own = ex.own_cancel()
        if own is None:
            raise
        raise own from None
    ex.complete = True
    t.answered = True
    await out.write_eof()
    return out
