"""The Anthropic Messages surface: POST /llm/v1/messages (plain and streaming) and
/llm/v1/messages/count_tokens. The dialect's parts only: the request/answer cycle is
surfaces/skeleton.py; parsing is in request.py, the stream grammar in stream.py, whole-message
assembly in assemble.py, upstream chunk decoding in upstream/decode.py.

While a streaming request waits for a slot, no response headers are sent yet: a refusal can then
still be a proper 529 with Retry-After, which clients (Claude Code included) retry on. Once the
slot is held and the upstream has answered, `message_start` goes out and `ping` frames keep the
connection alive whenever the upstream is silent for `anthropic.ping_interval_s`.
"""

from __future__ import annotations

import msgspec
from aiohttp import web

from ... import canonical as c
from ...errors import GatewayError
from ...request.exchange import Exchange
from ...request.tracker import Tracked
from ..body import decode_object
from ..context import Gateway
from ..count_tokens import prompt_tokens
from ..skeleton import Inbound, StreamEncoder, Turn, answer, exchange, inbound
from .request import parse_request
from .assemble import MessageAssembler, new_message_id
from .stream import AnthropicStreamEncoder


def _estimated_input_tokens(body: bytes, req: c.Request) -> int:
    """About four bytes of request per prompt token, image data left out. message_start must carry
    input_tokens and clients size their context from it, but the upstream may not have said yet:
    Ollama reports usage only at the end, and vLLM on its first chunk, which a keep-alive ping
    during a long prefill precedes. Used only then; message_delta carries the real count."""
    images = sum(len(p.url) for m in req.messages for p in m.parts if isinstance(p, c.ImagePart))
    return max(1, (len(body) - images) // 4)


class _Message(Turn):
    """One Messages request on the skeleton (surfaces/skeleton.py)."""

    count_prompt = True  # message_start's input_tokens, and usage after a gateway-side stop

    def __init__(self, front: Inbound[c.Request], gw: Gateway) -> None:
        self.req = front.parsed
        self.body = front.body
        self.signer = gw.signer
        self.message_id = new_message_id()
        self.ping_interval = gw.cfg.anthropic.ping_interval_s

    def encoder(self) -> AnthropicStreamEncoder:
        req = self.req
        # message_start says the tokenizer's count when it has arrived by then (it runs beside the
        # upstream call: Turn.count_prompt), else the estimate; message_delta says the real figure
        return AnthropicStreamEncoder(message_id=self.message_id, model=req.model, signer=self.signer,
                                      input_tokens=self.ex.prompt_tokens_or(_estimated_input_tokens(self.body, req)),
                                      hide_reasoning=req.reasoning_hidden)

    def own_failure_code(self, err: GatewayError) -> str:
        return "timeout_error" if err.kind == "timeout" else "api_error"

    def early_failure(self, err: GatewayError) -> bytes:
        """The `event: error` of a stream that failed while its model loaded (surfaces/loading.py),
        before an Exchange answered: no prompt count to say, none needed."""
        req = self.req
        enc = AnthropicStreamEncoder(message_id=self.message_id, model=req.model, signer=self.signer,
                                     input_tokens=lambda: _estimated_input_tokens(self.body, req),
                                     hide_reasoning=req.reasoning_hidden)
        code = "overloaded_error" if err.kind == "overloaded" else self.own_failure_code(err)
        return enc.fail(code, err.message)

    def finish(self, enc: StreamEncoder, ex: Exchange) -> bytes:
        assert isinstance(enc, AnthropicStreamEncoder)
        if enc.output_tokens is None:
            # the gateway stopped the generation (a stop sequence) before the upstream reported
            # usage: its own count, one token per delta, and the tokenizer's prompt (README: usage)
            enc.feed(c.Usage(input_tokens=ex.t.tokens_in, output_tokens=ex.t.tokens_out))
        return enc.finish()

    def whole(self, events: list[c.Event], ex: Exchange) -> dict:
        req, t = self.req, ex.t
        asm = MessageAssembler(message_id=self.message_id, model=req.model, signer=self.signer,
                               hide_reasoning=req.reasoning_hidden)
        for ev in events:
            asm.feed(ev)
        result = asm.result()
        usage = result["usage"]
        # A generation the gateway stopped itself (a stop sequence) ends before the upstream's
        # usage chunk: the gateway's own figures then, never null (README: usage)
        if usage["output_tokens"] is None:
            usage["output_tokens"] = t.tokens_out
        if usage["input_tokens"] is None:  # the tokenizer's count (Turn.count_prompt), else an estimate
            if t.tokens_in is None:
                t.tokens_in = _estimated_input_tokens(self.body, req)
            usage["input_tokens"] = t.tokens_in
        return result


async def messages(request: web.Request, gw: Gateway, t: Tracked) -> web.StreamResponse:
    front = await inbound(request, gw, t, "anthropic", lambda b: parse_request(b, signer=gw.signer))
    turn = _Message(front, gw)
    async with exchange(request, gw, t, front, turn.req, turn) as ex:
        return await answer(request, gw, t, ex, turn)


async def count_tokens(request: web.Request, gw: Gateway, t: Tracked) -> web.Response:
    """The prompt's size from the backend's tokenizer, else an estimate (surfaces/count_tokens.py;
    README: count_tokens)."""

    def parse(b: bytes) -> c.Request:
        raw = decode_object(b)
        raw.setdefault("max_tokens", 1)  # count_tokens takes no max_tokens; the parser wants one
        return parse_request(msgspec.json.encode(raw), signer=gw.signer)

    count = await prompt_tokens(request, gw, t, "anthropic", parse)
    return web.Response(
        body=msgspec.json.encode({"input_tokens": count}),
        content_type="application/json",
        headers=gw.headers(t),
    )
