"""Ollama's own API (`/api/...`, also under `/llm/api/...`): glue only, on the shared skeleton.

Parsing is request.py, the NDJSON stream stream.py, the whole answer assemble.py, model names and
documents models.py, errors errors.py; the backend's capabilities come from
upstream/capabilities.py. What only this dialect needs here:
* names: `reasoning` and `reasoning:latest` are one model (policy/routing.resolve_alias); an
  unknown one is Ollama's 404 `model "x" not found`;
* a chat with no messages, or a generate with no prompt, only loads (`keep_alive: 0`: unloads) a
  model in Ollama: answered with the one JSON object Ollama sends (`done_reason` load / unload),
  without taking a slot. Open WebUI unloads that way and waits for that object;
* while a stream waits (queue, prefill) nothing is written: no keep-alive line (the skeleton's
  pings stay off), because the Python library would choke on a blank one;
* `/api/version` answers without a key (like /healthz: it says nothing about the models; Ollama
  has no keys and clients probe it first), everything else needs the gateway's Bearer key.
* pull, push, create, copy, delete and blobs: the gateway serves the models its config names,
  so these are an Ollama-shaped error saying so, never a 404 page or a hang.
"""

from __future__ import annotations

import secrets
import time
from typing import Callable

import msgspec
from aiohttp import web

from ... import canonical as c
from ...errors import GatewayError, clean_message
from ...policy.routing import Route
from ...request.exchange import Exchange
from ...request.outcome import DONE
from ...request.tracker import Tracked
from .. import model_card
from ..body import decode_object
from ..completions.handler import TextTurn, run as completion_run
from ..context import Gateway
from ..embeddings import embed as upstream_embeddings, vectors
from .. import keep_alive as client_keep_alive
from ..skeleton import Inbound, Turn, answer, exchange, inbound
from . import models as names
from .assemble import AnswerFailed, WholeAssembler
from .errors import model_not_found
from .request import Call, parse_chat, parse_generate
from .stream import NdjsonEncoder, durations, wall_clock

# What /api/version says: an Ollama whose API this surface speaks. Clients gate features on it
# (VS Code Copilot wants >= 0.6.4; Open WebUI parses it as numbers).
OLLAMA_VERSION = "0.12.0"
NDJSON = "application/x-ndjson"
_encode = msgspec.json.encode


def _json(doc: object, gw: Gateway, t: Tracked, status: int = 200) -> web.Response:
    t.end(DONE, override=True)
    return web.Response(status=status, body=_encode(doc), content_type="application/json", headers=gw.headers(t))


def _names(gw: Gateway) -> list[str]:
    return [names.tag_name(n) for n in gw.router.model_names()]


def resolve(gw: Gateway, name: str) -> Route:
    """The route, or Ollama's 404 (`model "x" not found`). `reasoning:latest` and `reasoning`
    resolve alike (policy/routing.resolve_alias)."""
    try:
        return gw.router.resolve(name)
    except GatewayError as err:
        if err.kind == "not_found":
            raise model_not_found(name, _names(gw)) from None
        raise


def _model_field(raw: dict) -> str:
    model = raw.get("model") or raw.get("name")  # older clients send `name`
    if not isinstance(model, str) or not model:
        raise GatewayError("invalid_request", "model: required string field is missing", param="model")
    return model


# -- models -------------------------------------------------------------------------------------


async def version(request: web.Request) -> web.Response:
    return web.json_response({"version": OLLAMA_VERSION})


def _usable(request: web.Request, gw: Gateway) -> list[tuple[str, Route]]:
    out = []
    for name in gw.router.model_names():
        route = gw.router.resolve(name)
        if gw.auth.may_use(request, route):  # a key sees only the models it may use
            out.append((name, route))
    return out


async def tags(request: web.Request, gw: Gateway, t: Tracked) -> web.Response:
    gw.auth.admit(request, None, "ollama")
    now = wall_clock()
    cards = await model_card.cards(gw, _usable(request, gw))
    return _json({"models": [names.tags_entry(card.name, now, card) for card in cards]}, gw, t)


async def ps(request: web.Request, gw: Gateway, t: Tracked) -> web.Response:
    """What is running: the models whose backends hold slots right now, or are loaded (a managed
    backend that is ready, a peer box's loaded model), or loading."""
    gw.auth.admit(request, None, "ollama")
    fleet = gw.fleet
    cards = await model_card.cards(gw, _usable(request, gw))
    running = [names.ps_entry(card.name, card.context_length, card) for card in cards
               if any(b.in_use for b in card.backends) or card.state == "loading"
               or (card.state == "loaded" and any(fleet.managed(b.name) or b.kind == "peer" for b in card.backends))]
    return _json({"models": running}, gw, t)


async def show(request: web.Request, gw: Gateway, t: Tracked) -> web.Response:
    body = await gw.read_body(request)
    raw = await gw.parse(body, decode_object)
    name = _model_field(raw)
    t.model = name
    route = resolve(gw, name)
    gw.auth.admit(request, route, "ollama")
    card = await model_card.card(gw, name, route)
    facts = msgspec.structs.replace(card.facts, capabilities=card.capabilities)
    if route.fim is not None:
        facts = names.with_fim(facts, route.fim)
    return _json(names.show_document(name, facts, card.context_length, wall_clock(), card), gw, t)


async def unmanaged(request: web.Request, gw: Gateway, t: Tracked) -> web.Response:
    gw.auth.admit(request, None, "ollama")
    what = request.path.rsplit("/api/", 1)[-1].split("/", 1)[0]
    raise GatewayError(
        "invalid_request",
        f"{what}: this gateway does not manage models through the Ollama API; it serves the models "
        "its config names (see /api/tags), on the backends the config names",
        status=400,
    )


# -- chat and generate --------------------------------------------------------------------------


class OllamaTurn(Turn):
    stream_headers = {"content-type": NDJSON, "cache-control": "no-cache"}

    def __init__(self, call: Call, t: Tracked) -> None:
        assert call.request is not None
        self.req = call.request
        self.model, self.endpoint = call.model, call.endpoint
        self.t = t
        self.id_prefix = f"call_{secrets.token_hex(4)}_"  # for the calls an upstream gives no id

    def _durations(self):
        t = self.t
        return durations(time.monotonic() - t.started, t.queue_wait, t.load_wait, t.ttft)

    @property
    def hide_reasoning(self) -> bool:
        """`think: false`: a backend that thinks anyway has its reasoning dropped from the answer."""
        return self.req.reasoning_enabled is False

    def encoder(self) -> NdjsonEncoder:
        return NdjsonEncoder(model=self.model, endpoint=self.endpoint, id_prefix=self.id_prefix,
                             hide_reasoning=self.hide_reasoning)

    def whole(self, events: list[c.Event], ex: Exchange) -> dict:
        asm = WholeAssembler(model=self.model, endpoint=self.endpoint, id_prefix=self.id_prefix,
                             hide_reasoning=self.hide_reasoning)
        try:
            for ev in events:
                asm.feed(ev)
            return asm.result(self._durations())
        except AnswerFailed as err:
            assert ex.backend is not None  # it answered
            raise GatewayError("upstream_error", f"backend {ex.backend.name!r}: {clean_message(str(err))}") from None

    def loading_frame(self, model: str, waited_s: float, first: bool, note: bool) -> bytes:
        """Ollama's stream has no comment: an object with nothing in it, as its own chunks are
        made (surfaces/loading.py); with the note, the first says so as `thinking`."""
        name = self.model  # the name the client sent
        text = f"loading model {name}...\n" if note and first else ""
        if self.endpoint == "chat":
            body: dict = {"message": {"role": "assistant", "content": "", **({"thinking": text} if text else {})}}
        else:
            body = {"response": "", **({"thinking": text} if text else {})}
        return _encode({"model": name, "created_at": wall_clock(), **body, "done": False}) + b"\n"

    def finish(self, enc, ex: Exchange) -> bytes:
        tail = enc.finish(self._durations())
        if enc.failed:  # the model's tool call arguments were no JSON object: the client got an error
            self.t.fail("upstream_malformed", override=True)
        return tail


class OllamaTextTurn(TextTurn, OllamaTurn):
    """`/api/generate` with `raw: true` or a `suffix`: the upstream call of a completion
    (TextTurn: the prompt verbatim, or rendered through the model's FIM template, to the backend's
    /v1/completions), the answer in Ollama's NDJSON (OllamaTurn, answering as the Ollama call's
    model and endpoint, which the TextCall copies)."""

    def __init__(self, call: Call, front: Inbound, t: Tracked) -> None:
        assert call.text is not None  # _generation sends only a raw or suffix generate here
        TextTurn.__init__(self, call.text, front)
        self.model, self.endpoint = call.model, call.endpoint
        self.t = t
        self.id_prefix = f"call_{secrets.token_hex(4)}_"


def _lifetime(gw: Gateway, route: Route, call: Call) -> None:
    """What an Ollama client says of its model's lifetime, for the managed backends (`run:`)
    that serve it: a load request (no prompt) starts them, `keep_alive` is their idle time from
    now on, 0 without a prompt unloads them after their running requests (lifecycle/keep_alive.py;
    surfaces/keep_alive.py applies it, within what the operator allows)."""
    fleet = gw.fleet
    client_keep_alive.apply(gw, route, call.keep_alive, prompt=call.request is not None)
    if call.request is None and not call.unload:
        for b in route.backends:
            if fleet.managed(b.name):
                fleet.want(b.name)


def _loaded(call: Call) -> dict:
    """Ollama's answer to a load (or unload) request: one object, whatever `stream` says."""
    doc: dict = {"model": call.model, "created_at": wall_clock()}
    if call.endpoint == "chat":
        doc["message"] = {"role": "assistant", "content": ""}
    else:
        doc["response"] = ""
    doc.update(done=True, done_reason="unload" if call.unload else "load")
    return doc


async def _generation(request: web.Request, gw: Gateway, t: Tracked, parse: Callable[[bytes], Call]) -> web.StreamResponse:
    try:
        front = await inbound(request, gw, t, "ollama", parse)
    except GatewayError as err:
        if err.kind == "not_found" and err.param == "model":
            raise model_not_found(t.model, _names(gw)) from None
        raise
    call = front.parsed
    _lifetime(gw, front.route, call)
    if call.request is None:
        return _json(_loaded(call), gw, t)
    if call.text is not None:  # raw or suffix: a completion (surfaces/completions/), not a chat
        return await completion_run(request, gw, t, front, OllamaTextTurn(call, front, t))
    turn = OllamaTurn(call, t)
    async with exchange(request, gw, t, front, call.request, turn) as ex:
        return await answer(request, gw, t, ex, turn)


async def chat(request: web.Request, gw: Gateway, t: Tracked) -> web.StreamResponse:
    return await _generation(request, gw, t, parse_chat)


async def generate(request: web.Request, gw: Gateway, t: Tracked) -> web.StreamResponse:
    return await _generation(request, gw, t, parse_generate)


# -- embeddings ---------------------------------------------------------------------------------


async def _embed_upstream(request: web.Request, gw: Gateway, t: Tracked, name: str, inputs: list[str],
                          dimensions: int | None, keep_alive: object = None) -> tuple[list[list[float]], int | None]:
    t.model = name
    asked = client_keep_alive.parse(keep_alive)
    route = resolve(gw, name)
    front = Inbound(b"", None, route, gw.auth.admit(request, route, "ollama"))
    client_keep_alive.apply(gw, route, asked)
    upstream_body: dict = {"model": route.upstream_model, "input": inputs}
    if dimensions is not None:
        upstream_body["dimensions"] = dimensions
    async with exchange(request, gw, t, front, c.Request(model=name, messages=[])) as ex:
        raw, doc = await upstream_embeddings(ex, _encode(upstream_body))
        got = vectors(ex, doc.data, len(inputs))
    usage = msgspec.json.decode(raw).get("usage")
    prompt = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    prompt = prompt if isinstance(prompt, int) and not isinstance(prompt, bool) else None
    t.tokens_in = prompt
    return got, prompt


async def embed(request: web.Request, gw: Gateway, t: Tracked) -> web.Response:
    body = await gw.read_body(request)
    raw = await gw.parse(body, decode_object)
    name = _model_field(raw)
    value = raw.get("input")
    inputs = [value] if isinstance(value, str) else value
    if not isinstance(inputs, list) or not inputs or not all(isinstance(s, str) for s in inputs):
        raise GatewayError("invalid_request", "input: expected a string or a non-empty list of strings", param="input")
    dims = raw.get("dimensions")
    if dims is not None and (isinstance(dims, bool) or not isinstance(dims, int) or dims < 1):
        raise GatewayError("invalid_request", "dimensions: expected a positive integer", param="dimensions")
    vectors, prompt = await _embed_upstream(request, gw, t, name, inputs, dims, raw.get("keep_alive"))
    elapsed = time.monotonic() - t.started
    # load_duration is what it is for a chat (stream.durations): the wait for a managed server
    # to start, not the queue or the backend's answer
    doc: dict = {"model": name, "embeddings": vectors, "total_duration": int(elapsed * 1e9),
                 "load_duration": int(min(t.load_wait, elapsed) * 1e9)}
    if prompt is not None:
        doc["prompt_eval_count"] = prompt
    return _json(doc, gw, t)


async def embeddings(request: web.Request, gw: Gateway, t: Tracked) -> web.Response:
    """The older endpoint: one `prompt`, one `embedding`."""
    body = await gw.read_body(request)
    raw = await gw.parse(body, decode_object)
    name = _model_field(raw)
    prompt = raw.get("prompt")
    if not isinstance(prompt, str):
        raise GatewayError("invalid_request", "prompt: required string field is missing", param="prompt")
    vectors, _ = await _embed_upstream(request, gw, t, name, [prompt], None, raw.get("keep_alive"))
    return _json({"embedding": vectors[0]}, gw, t)
