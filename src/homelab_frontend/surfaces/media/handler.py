"""The relayed endpoints: rerank, score, speech to text, text to speech, images.

    POST /rerank, /v1/rerank            Jina / Cohere v1 rerank (vLLM, llama.cpp `--reranking`)
    POST /v2/rerank                     Cohere v2 rerank (vLLM; llama.cpp's /v1/rerank serves it)
    POST /v1/score                      vLLM's pair scores
    POST /v1/audio/transcriptions       multipart upload (vLLM, speaches, whisper.cpp's /inference)
    POST /v1/audio/translations         the same; whisper.cpp with `translate=true`
    POST /v1/audio/speech               JSON in, audio (or SSE with `stream_format: sse`) out
    GET  /v1/audio/models, /v1/audio/voices   from the configured models and their backends
    POST /v1/images/generations         JSON (stable-diffusion.cpp's server, any OpenAI-style one)
    POST /v1/images/edits               multipart upload

Each handler checks the fields the gateway itself needs (the model; the text or file whose size
it counts) and runs relay.py's steps; the rest of the body is the backend's to judge, and a
backend's refusal (a 400 "this model cannot rerank") comes back in OpenAI's error shape with the
backend's status and message. The metrics' `dialect` label is the endpoint family: `rerank`,
`transcription`, `speech`, `images`.
"""

from __future__ import annotations

import asyncio
import time

import msgspec
from aiohttp import web

from ...config import Backend
from ...errors import GatewayError
from ...policy.routing import BackendState
from ...request.outcome import DONE
from ...request.tracker import Tracked
from ...upstream import backend_kind
from ..context import Gateway
from .relay import admitted, read_form, read_json, relay, route_form

_encode = msgspec.json.encode
_VOICES_TIMEOUT_S = 3.0


def _json_body(doc: dict, upstream_model: str, quirk=None):
    """The relayed JSON body for one backend: the client's, `model` the backend's name."""
    def body_for(cfg: Backend):
        out = {**doc, "model": upstream_model}
        return _encode(quirk(cfg, out) if quirk is not None else out), None
    return body_for


def _documents(doc: dict) -> list:
    docs = doc.get("documents")
    if not isinstance(docs, list) or not docs:
        raise GatewayError("invalid_request", "documents: required non-empty list of strings or {text} objects",
                           param="documents")
    for i, d in enumerate(docs):
        if not (isinstance(d, str) or (isinstance(d, dict) and isinstance(d.get("text"), str))):
            raise GatewayError("invalid_request", f"documents[{i}]: must be a string or an object with a string "
                               "`text`", param=f"documents[{i}]")
    return docs


def _rerank(endpoint: str):
    async def handler(request: web.Request, gw: Gateway, t: Tracked) -> web.StreamResponse:
        doc, route, principal = await read_json(request, gw, t)
        if not isinstance(doc.get("query"), str):
            raise GatewayError("invalid_request", "query: required string field is missing", param="query")
        docs = _documents(doc)
        top_n = doc.get("top_n")
        if top_n is not None and (not isinstance(top_n, int) or isinstance(top_n, bool) or top_n < 0):
            raise GatewayError("invalid_request", "top_n: must be a whole number, 0 or more", param="top_n")
        t.units = {"documents": float(len(docs))}
        async with admitted(gw, t, route, principal) as ex:
            return await relay(request, gw, t, ex, endpoint,
                               _json_body(doc, route.upstream_model, backend_kind.rerank_body), stream=False,
                               finish=lambda answer, cfg: backend_kind.rerank_answer(cfg, doc, answer))
    return handler


rerank = _rerank("rerank")
rerank_v2 = _rerank("rerank_v2")


# vLLM's score request: one of these pairs (entrypoints/pooling/scoring/protocol.py)
_SCORE_PAIRS = (("text_1", "text_2"), ("queries", "documents"), ("queries", "items"), ("data_1", "data_2"))


async def score(request: web.Request, gw: Gateway, t: Tracked) -> web.StreamResponse:
    doc, route, principal = await read_json(request, gw, t)
    pair = next((p for p in _SCORE_PAIRS if p[0] in doc and p[1] in doc), None)
    if pair is None:
        field = "text_2" if "text_1" in doc else "text_1"
        raise GatewayError("invalid_request", f"{field}: required field is missing (or give queries and "
                           "documents)", param=field)
    items = doc[pair[1]]
    t.units = {"documents": float(len(items)) if isinstance(items, list) else 1.0}
    async with admitted(gw, t, route, principal) as ex:
        return await relay(request, gw, t, ex, "score", _json_body(doc, route.upstream_model), stream=False)


def _upload(endpoint: str, file_fields: tuple[str, ...]):
    async def handler(request: web.Request, gw: Gateway, t: Tracked) -> web.StreamResponse:
        form, upload = await read_form(request, gw, t, file_fields)
        try:
            route, principal = route_form(request, gw, t, form, file_fields)
            if endpoint.startswith("image") and form.ended and not form.fields.get("prompt"):
                # only a form read to its end is known to have none (a prompt after the image is
                # the backend's to find)
                raise GatewayError("invalid_request", "prompt: required field is missing", param="prompt")

            def body_for(cfg: Backend):
                return upload, upload.prepare(route.upstream_model, backend_kind.form_extras(cfg, endpoint),
                                              cfg.timeouts.idle_s)

            async with admitted(gw, t, route, principal) as ex:
                out = await relay(request, gw, t, ex, endpoint, body_for, stream=t.stream)
        finally:
            form.spill.close()
        if endpoint in ("transcriptions", "translations") and "audio_seconds" not in (t.units or {}):
            seconds = upload.audio_seconds()  # the backend did not say: the WAV file's own length
            if seconds is not None:
                t.units = {**(t.units or {}), "audio_seconds": round(seconds, 3)}
        return out
    return handler


transcriptions = _upload("transcriptions", ("file",))
translations = _upload("translations", ("file",))
image_edits = _upload("image_edits", ("image", "image[]"))


async def speech(request: web.Request, gw: Gateway, t: Tracked) -> web.StreamResponse:
    doc, route, principal = await read_json(request, gw, t)
    text = doc.get("input")
    if not isinstance(text, str) or not text:
        raise GatewayError("invalid_request", "input: required string field is missing", param="input")
    t.stream = True  # audio (or SSE) streamed as the backend makes it
    t.units = {"characters": float(len(text))}
    async with admitted(gw, t, route, principal) as ex:
        return await relay(request, gw, t, ex, "speech", _json_body(doc, route.upstream_model), stream=True)


async def image_generations(request: web.Request, gw: Gateway, t: Tracked) -> web.StreamResponse:
    doc, route, principal = await read_json(request, gw, t)
    if not isinstance(doc.get("prompt"), str) or not doc["prompt"]:
        raise GatewayError("invalid_request", "prompt: required string field is missing", param="prompt")
    t.stream = doc.get("stream") is True
    async with admitted(gw, t, route, principal) as ex:
        return await relay(request, gw, t, ex, "image_generations", _json_body(doc, route.upstream_model),
                           stream=t.stream)


# -- the TTS pickers ----------------------------------------------------------------------------


def _speech_models(request: web.Request, gw: Gateway) -> list[str]:
    """The models a TTS picker offers: those with the `speech` capability, or every model when
    none has it, that the key may use."""
    names = gw.router.model_names()
    marked = [n for n in names if "speech" in (gw.cfg.models[n].capabilities or ())]
    out = []
    for name in marked or names:
        if gw.auth.may_use(request, gw.router.resolve(name)):
            out.append(name)
    return out


def _answer(gw: Gateway, t: Tracked, doc: dict) -> web.Response:
    t.end(DONE, override=True)
    return web.Response(body=_encode(doc), content_type="application/json", headers=gw.headers(t))


async def audio_models(request: web.Request, gw: Gateway, t: Tracked) -> web.Response:
    now = int(time.time())
    names = _speech_models(request, gw)
    return _answer(gw, t, {"models": [{"id": n, "name": n} for n in names],
                           "object": "list",
                           "data": [{"id": n, "object": "model", "created": now, "owned_by": "homelab-frontend"}
                                    for n in names]})


def _voice_list(doc: object) -> list[dict]:
    """A backend's voices, whatever its shape (kokoro-fastapi: names; speaches and others:
    objects with `id`/`voice_id` and `name`), as Open WebUI reads them: `{id, name}`."""
    raw = doc.get("voices", doc.get("data")) if isinstance(doc, dict) else doc
    out = []
    for v in raw if isinstance(raw, list) else []:
        if isinstance(v, str):
            out.append({"id": v, "name": v})
        elif isinstance(v, dict):
            vid = v.get("id", v.get("voice_id", v.get("name")))
            if isinstance(vid, str):
                name = v.get("name")
                out.append({"id": vid, "name": name if isinstance(name, str) else vid})
    return out


async def audio_voices(request: web.Request, gw: Gateway, t: Tracked) -> web.Response:
    """The voices of the speech models' backends (or of `?model=`'s), asked now, merged."""
    model = request.query.get("model")
    if model:
        route = gw.router.resolve(model)
        if not gw.auth.may_use(request, route):
            raise GatewayError("permission", f"this key may not use model {model!r}", param="model")
        backends = list(route.backends)
    else:
        seen: dict[str, BackendState] = {}
        for name in _speech_models(request, gw):
            for b in gw.router.resolve(name).backends:
                seen.setdefault(b.name, b)
        backends = list(seen.values())

    async def ask(b) -> list[dict]:
        path = backend_kind.media_path(b.cfg, "voices")
        if path is None or not b.up:
            return []
        try:
            return _voice_list(await gw.clients[b.name].get_json(path, timeout_s=_VOICES_TIMEOUT_S, root=True))
        except GatewayError:
            return []  # a backend without voices (or down) offers none

    voices: dict[str, dict] = {}
    for got in await asyncio.gather(*(ask(b) for b in backends)):
        for v in got:
            voices.setdefault(v["id"], v)
    return _answer(gw, t, {"voices": list(voices.values())})
