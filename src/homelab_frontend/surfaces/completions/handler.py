"""The completion surfaces on the shared skeleton: `/v1/completions` (and `/llm/v1/completions`),
`/infill`, and (through surfaces/ollama/handler.py) Ollama's raw and suffix generations.

Each is read, routed, admitted, metered and budgeted like a chat (surfaces/skeleton.py); what
differs is the upstream call, made by `TextTurn.open_upstream`:
* a request with a suffix (fill-in-the-middle) and a model with a FIM template (config `fim:`):
  rendered into one prompt (fim.py) and sent to the backend's `/v1/completions`, no `suffix` key;
* with a suffix and no template: a llama.cpp backend gets it on its own `/infill` (which knows
  the model's FIM tokens, or refuses with a 501 that reaches the client as a 400 naming the
  suffix), an Ollama backend as `suffix` on its `/v1/completions` (Ollama fills its model's
  template); any other backend cannot take it: a 400 naming the field, never dropped silently;
* `/infill` (or llama.cpp's `/completion`) to a llama.cpp backend: the client's own llama.cpp
  fields, to its `/infill` (`/completion`), and llama.cpp's own objects back to the client as they
  came, the last one trimmed by the client's `response_fields` (native.py);
* otherwise the prompt as it is, to `/v1/completions`.
Every upstream answer is read as a stream (`upstream_stream_only`), decoded by upstream/
text_decode.py, and encoded in the client's dialect (encode.py; Ollama's NDJSON encoder for
/api/generate), the backend's own usage figures passed on. A generation whose client left stops at
its next token on every backend (llama.cpp notices a closed stream, not a closed plain request).

Latest wins (`supersede: true` on the model, admission/supersede.py): the request registers as
its client's (its key and its address: `client_of`) newest completion on that model before it asks for a slot, which cancels the
previous one; a warm-up that generates nothing (llama.vscode's `n_predict: 0`) neither cancels
nor is cancelled. With a `cluster:` section the same rule holds across the replicas
(admission/redis_supersede.py: the registration then takes one Redis round trip).
"""

from __future__ import annotations

import secrets
import time
from contextlib import asynccontextmanager
from typing import AsyncIterator

import msgspec
from aiohttp import web

from ... import canonical as c
from ...errors import GatewayError, clean_message
from ...request.exchange import Exchange
from ...request.tracker import Tracked
from ...upstream.client import UpstreamFailure
from ...upstream.text_decode import InfillDecoder, TextChunkDecoder
from ..context import Gateway
from ..fields import invalid as _bad
from ..skeleton import Inbound, Turn, answer, exchange, inbound
from .encode import InfillStream, TextStream, infill_error, infill_whole, text_whole
from .fim import extra_text, render
from .native import NativeDecoder, NativeStream, native_whole
from .request import TextCall, parse_completions, parse_infill, parse_native_completion

_encode = msgspec.json.encode


class TextTurn(Turn):
    """A completion request on the skeleton: the upstream call (see the module docstring). A
    dialect subclass supplies `encoder` and `whole`."""

    upstream_stream_only = True

    def __init__(self, call: TextCall, front: Inbound) -> None:
        self.call = call
        self.req = call.request
        self.route = front.route
        self._infill = False  # the upstream call went to llama.cpp's /infill (or /completion)
        self._native: NativeDecoder | None = None  # its objects, relayed as they came (native.py)

    @property
    def suffix_field(self) -> str:
        return "input_suffix" if self.call.endpoint == "infill" else "suffix"

    def check(self) -> None:
        """Before a slot is taken: a request no backend of its model could answer is a 400 now."""
        call, route = self.call, self.route
        kinds = {b.cfg.kind for b in route.backends}
        if call.vllm_only and kinds - {"vllm"}:
            raise _bad(call.vllm_only, f"only a vLLM backend can return it, and model {route.client_model!r} "
                                       "is served by another kind of backend")
        # Ollama fills its own template from `suffix`, but has nowhere to put /infill's extra chunks
        takers = {"llamacpp"} if call.extra else {"llamacpp", "ollama"}
        if call.suffix is not None and route.fim is None and not kinds & takers:
            raise self._no_fim()

    def _no_fim(self) -> GatewayError:
        return _bad(self.suffix_field,
                    f"model {self.route.client_model!r} has no fill-in-the-middle template (config "
                    f"`models.{self.route.model}.fim`: a preset name or prefix/suffix/middle tokens) and its "
                    "backend cannot take a suffix; send the prompt in the model's FIM form instead")

    async def open_upstream(self, ex: Exchange, *, stream: bool, continuous_usage: bool = False,
                            send_stop: bool = True, count_prompt: bool = False):
        return await ex.attempt(lambda: self._open(ex))

    def decoder(self):
        if self._native is not None:
            return self._native
        return InfillDecoder() if self._infill else TextChunkDecoder()

    async def _open(self, ex: Exchange):
        assert ex.backend is not None
        call, route = self.call, self.route
        kind = ex.backend.cfg.kind
        if call.vllm_only and kind != "vllm":
            raise _bad(call.vllm_only, f"only a vLLM backend can return it; backend {ex.backend.name!r} is {kind}")
        self._infill = False
        self._native = None  # set anew for each attempt (a failover may land on another kind)
        body: dict
        if call.llama is not None and kind == "llamacpp":  # /infill, /completion to llama.cpp: relayed
            self._infill = True
            # its objects go back as they came; the encoder and `whole` read them off this decoder
            self._native = NativeDecoder(whole=not call.stream)
            body = self._infill_body()
        elif call.suffix is not None and route.fim is not None:
            prompt = render(route.fim, call.prompt, call.suffix, extra_text(call.extra))
            body = self._completions_body(ex, prompt)
        elif call.suffix is not None and kind == "llamacpp":
            self._infill = True
            body = self._infill_body()
        elif call.suffix is not None and kind == "ollama" and not call.extra:
            body = self._completions_body(ex, call.prompt)
            body["suffix"] = call.suffix  # Ollama renders its model's own FIM template
        elif call.suffix is not None:
            raise self._no_fim()
        else:
            body = self._completions_body(ex, call.prompt)
        if not self._infill:
            return await ex.open("/completions", _encode(body), stream=True)
        path = "/completion" if call.endpoint == "completion" else "/infill"
        try:
            return await ex.open(path, _encode(body), stream=True, root=True)
        except UpstreamFailure as err:
            if err.upstream_status == 501:  # llama.cpp: "Infill is not supported by this model"
                raise _bad(self.suffix_field,
                           f"model {route.client_model!r} cannot fill in the middle: {clean_message(err.message)} "
                           f"(give the model a template in `models.{route.model}.fim`, or send the prompt "
                           "without a suffix)") from None
            raise

    def _completions_body(self, ex: Exchange, prompt: str) -> dict:
        assert ex.backend is not None
        opts: dict = {"include_usage": True}
        if ex.backend.cfg.kind == "vllm":
            opts["continuous_usage_stats"] = True  # exact counts for a generation cut short too
        body = {"model": self.route.upstream_model, "prompt": prompt, "stream": True, "stream_options": opts,
                **self.call.params}
        if self.call.endpoint in ("infill", "completion") and self.call.warmup:
            # llama.vscode's warm-up (n_predict 0) fills llama.cpp's prompt cache; an OpenAI-shaped
            # backend refuses 0 tokens, so it generates one (its prefix cache is warmed alike)
            body["max_tokens"] = 1
        return body

    def _infill_body(self) -> dict:
        call = self.call
        if call.llama is not None:  # the client spoke llama.cpp: its own fields, as it sent them
            return {**call.llama, "stream": True}
        p = call.params
        body: dict = {"input_prefix": call.prompt, "input_suffix": call.suffix, "stream": True}
        if call.extra:
            body["input_extra"] = call.extra
        if "max_tokens" in p:
            body["n_predict"] = p["max_tokens"]
        for key in ("temperature", "top_p", "top_k", "min_p", "seed", "stop", "presence_penalty",
                    "frequency_penalty"):
            if key in p:
                body[key] = p[key]
        return body

    def _failed(self, ex: Exchange, message: str) -> GatewayError:
        assert ex.backend is not None
        return GatewayError("upstream_error", f"backend {ex.backend.name!r} failed: {message}")


class _OpenAITurn(TextTurn):
    def __init__(self, call: TextCall, front: Inbound) -> None:
        super().__init__(call, front)
        self.id = "cmpl-" + secrets.token_hex(16)
        self.created = int(time.time())

    def encoder(self) -> TextStream:
        return TextStream(id=self.id, created=self.created, model=self.call.model,
                          include_usage=self.call.include_usage)

    def whole(self, events: list[c.Event], ex: Exchange) -> dict:
        doc, failure = text_whole(events, id=self.id, created=self.created, model=self.call.model)
        if failure is not None:
            raise self._failed(ex, failure)
        return doc


class _InfillTurn(TextTurn):
    """llama.cpp's /infill and /completion: its own objects from a llama.cpp backend (native.py),
    or built from the canonical events of any other (encode.py), the last one trimmed by the
    client's `response_fields` either way."""

    def encoder(self) -> InfillStream | NativeStream:
        if self._native is not None:
            return NativeStream(self._native, self.call.fields, infill_error, model=self.call.model)
        return InfillStream(model=self.call.model, fields=self.call.fields)

    def whole(self, events: list[c.Event], ex: Exchange) -> dict:
        if self._native is not None:
            err = next((ev for ev in events if type(ev) is c.UpstreamError), None)
            if err is not None:
                raise self._failed(ex, err.message)
            return native_whole(self._native, self.call.fields, model=self.call.model,
                                return_tokens=(self.call.llama or {}).get("return_tokens") is True)
        doc, failure = infill_whole(events, model=self.call.model, fields=self.call.fields)
        if failure is not None:
            raise self._failed(ex, failure)
        return doc


def client_of(t: Tracked, front: Inbound) -> str:
    """Who a completion belongs to, for latest-wins: its key's name ("" without keys) and the
    client's address as believed (t.client: behind a trusted proxy, the address it forwards
    for, policy/forwarded.py), together.

    Why both: a key alone takes two people sharing one key (a household's, a team's) for one
    client, so each one's typing would cancel the other's completions; an address alone does the
    same to everyone behind one proxy the config does not trust, or one NAT. Why not an id the
    client sends: the editors send none in common (llama.vim, llama.vscode, Continue, Twinny),
    and a client's word would let anyone cancel anyone's completions by sending theirs; an address
    is forged only by whoever can write a trusted proxy's header. What it gives up: one person's
    two editors on one machine, on one key, are one client (as they were before). Addresses hold
    no `@`, so the pair is unambiguous."""
    return f"{front.principal.name or ''}@{t.client}"


@asynccontextmanager
async def latest(request: web.Request, gw: Gateway, t: Tracked, front: Inbound, call: TextCall) -> AsyncIterator[None]:
    """For a `supersede: true` model: this request replaces its client's previous completion
    (admission/supersede.py) for as long as it runs."""
    if not front.route.supersede or call.warmup:
        yield
        return
    async with gw.supersede.latest(client_of(t, front), front.route.model, t):
        yield


async def run(request: web.Request, gw: Gateway, t: Tracked, front: Inbound, turn: TextTurn) -> web.StreamResponse:
    """The common tail of every completion surface: checks, latest-wins, the slot, the answer."""
    turn.check()
    async with latest(request, gw, t, front, turn.call):
        async with exchange(request, gw, t, front, turn.req, turn) as ex:
            return await answer(request, gw, t, ex, turn)


async def completions(request: web.Request, gw: Gateway, t: Tracked) -> web.StreamResponse:
    front = await inbound(request, gw, t, "completions", parse_completions)
    return await run(request, gw, t, front, _OpenAITurn(front.parsed, front))


async def infill(request: web.Request, gw: Gateway, t: Tracked) -> web.StreamResponse:
    front = await inbound(request, gw, t, "infill", parse_infill(gw.cfg.completions.default_model))
    return await run(request, gw, t, front, _InfillTurn(front.parsed, front))


async def native_completion(request: web.Request, gw: Gateway, t: Tracked) -> web.StreamResponse:
    """llama.cpp's own `/completion` (Continue's and Twinny's llama.cpp providers)."""
    front = await inbound(request, gw, t, "infill", parse_native_completion(gw.cfg.completions.default_model))
    return await run(request, gw, t, front, _InfillTurn(front.parsed, front))
