"""`POST /v1/chat/completions`: validate, plan, then play the timeline out over the socket.

Cancellation is the point of this module. The app runs with `handler_cancellation=True`, so
when the client's socket closes the handler task is cancelled wherever it is waiting (before
headers, before the first token, between tokens, or mid non-streaming generation); the
`except` below logs exactly one `cancelled` line and the `finally` returns the in-flight slot.
Every wait is an `asyncio.sleep`, so nothing holds a cancellation back.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import msgspec
from aiohttp import web

from .flavour import Flavour, Rejection, ResponseContext
from .script import Directives, last_user_text, make_plan, parse_directives, prompt_token_ids
from .state import StubState
from .timeline import Abort, Event, Fail, Limits, Step, parse_stop, timeline

STATE = web.AppKey("stub_state", StubState)
FLAVOUR = web.AppKey("stub_flavour", Flavour)
_encode = msgspec.json.encode


def json_response(rejection: Rejection) -> web.Response:
    return web.Response(status=rejection.status, body=_encode(rejection.body), content_type="application/json")


def authorized(request: web.Request, api_key: str | None) -> bool:
    return api_key is None or request.headers.get("Authorization") == f"Bearer {api_key}"


@dataclass
class Generation:
    """One accepted request on its way out; knows how far it got, for the log."""

    id: str
    seq: int
    stream: bool
    events: list[Event]
    ctx: ResponseContext
    delay_ms: int
    directives: Directives
    prefill_ms: float = 0.0  # modelled prefill of the uncached prompt tokens
    sent_tokens: int = 0
    ended: bool = False


async def _sleep_ms(ms: float) -> None:
    if ms > 0:
        await asyncio.sleep(ms / 1000)


async def begin(request: web.Request, *, keyed: bool = True):
    """Every generation's opening: read, record, fail as /stub/fail asks, check the key (llama.cpp's
    /infill takes none: `keyed=False`). -> (body, seq), or the Response that ends it."""
    state, flavour = request.app[STATE], request.app[FLAVOUR]
    try:
        body = msgspec.json.decode(await request.read())
    except msgspec.DecodeError as exc:
        return json_response(flavour.error(400, f"Invalid JSON body: {exc}"))
    seq = state.record(body, request.headers)
    if state.failing is not None and "abort_after" not in state.failing:
        return fail(request, flavour, state, seq)
    if keyed and not authorized(request, state.config.api_key):
        state.log.write(f"rejected status=401 seq={seq}")
        return json_response(flavour.unauthorized())
    return body, seq


async def handle_chat(request: web.Request) -> web.StreamResponse:
    begun = await begin(request)
    if isinstance(begun, web.StreamResponse):
        return begun
    body, seq = begun
    state = request.app[STATE]
    flavour = request.app[FLAVOUR]
    config = state.config
    prepared = _prepare(request, flavour, state, body, seq)
    if isinstance(prepared, Rejection):
        state.log.write(f"rejected status={prepared.status} seq={seq}")
        return json_response(prepared)
    gen = prepared
    model = gen.ctx.model
    state.log.write(f"request id={gen.id} model={model} stream={'true' if gen.stream else 'false'} seq={seq}")
    if gen.directives.status is not None:
        code = gen.directives.status
        state.log.write(f"rejected id={gen.id} status={code} seq={seq}")
        return json_response(flavour.error(code, f"stub error {code}"))

    state.stats.begin()
    try:
        await _sleep_ms(gen.directives.headers_ms)
        if gen.stream:
            return await _stream(request, flavour, state, gen)
        return await _respond(request, flavour, state, gen)
    except asyncio.CancelledError:
        _note_cancelled(state, gen)
        raise
    except ConnectionResetError:
        # A write raced the disconnect notice; same story as being cancelled.
        _note_cancelled(state, gen)
        return web.Response(status=499)
    finally:
        state.stats.end()


def fail(request: web.Request, flavour: Flavour, state: StubState, seq: int) -> web.StreamResponse:
    """Fail the request as POST /stub/fail asked (a server that answers its probe, not its work)."""
    fail = state.failing or {}
    if fail.get("reset"):
        state.log.write(f"reset seq={seq}")
        if request.transport is not None:
            request.transport.abort()  # no answer: the connection just goes away
        return web.Response(status=499)
    code = int(fail.get("status", 503))
    state.log.write(f"rejected status={code} seq={seq}")
    return json_response(flavour.error(code, str(fail.get("message") or f"stub error {code}")))


# Outcomes are logged *before* the last bytes go out, so a client that has read the whole
# response always finds the line; `ended` keeps a late disconnect from logging a second outcome.


def _note_completed(state: StubState, gen: Generation) -> None:
    gen.ended = True
    state.stats.completed += 1
    state.log.write(f"completed id={gen.id} tokens={gen.sent_tokens} seq={gen.seq}")


def _note_failed(state: StubState, gen: Generation) -> None:
    gen.ended = True
    state.stats.failed += 1
    state.log.write(f"failed id={gen.id} after {gen.sent_tokens} tokens seq={gen.seq}")


def _note_cancelled(state: StubState, gen: Generation) -> None:
    if gen.ended:
        return
    gen.ended = True
    state.stats.cancelled += 1
    state.log.write(f"cancelled id={gen.id} after {gen.sent_tokens} tokens seq={gen.seq}")


def _prepare(request: web.Request, flavour: Flavour, state: StubState, body: Any, seq: int) -> Generation | Rejection:
    config = state.config
    if not isinstance(body, dict):
        return flavour.error(400, "The request body must be a JSON object")
    model = flavour.resolve_model(body.get("model"), config.models)
    if isinstance(model, Rejection):
        return model
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return flavour.no_messages()

    refusal = flavour.check_request(body)
    if refusal is not None:
        return refusal
    directives = parse_directives(last_user_text(messages))
    prompt_ids = prompt_token_ids(messages)
    prompt_tokens = len(prompt_ids)
    max_tokens = flavour.max_tokens(body)
    param = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    refusal = flavour.check_context(prompt_tokens, max_tokens, config.max_model_len, param=param)
    if refusal is not None:
        return refusal
    max_tokens = flavour.output_budget(prompt_tokens, max_tokens, config.max_model_len)

    plan = make_plan(
        body,
        directives,
        reasoning_default=config.reasoning,
        agent_enabled=config.agent,
        reasoning_supported=flavour.supports_reasoning,
        honour_tool_choice=flavour.honour_tool_choice,
        dump_arguments=flavour.dump_arguments,
    )
    limits = Limits(
        max_tokens=max_tokens,
        stop=parse_stop(body.get("stop")),
        include_stop=flavour.vllm_extras and body.get("include_stop_str_in_output") is True,
        # POST /stub/fail {"abort_after": N}: every answer breaks after N tokens, as when the
        # server dies mid-generation (the prompt's own fail_after would go to every backend)
        fail_after=(state.failing or {}).get("abort_after", directives.fail_after),
        error_after=directives.error_after,
        stop_token=(directives.stop_token if directives.stop_token is not None else config.end_of_turn_id)
        if flavour.vllm_extras else None,
        stream_tool_args=flavour.stream_tool_args,
        separate_finish=flavour.separate_finish,
        merge=directives.split,
    )
    cached = state.cache.lookup(prompt_ids) if state.cache is not None else None
    state.stats.prompt_tokens += prompt_tokens
    state.stats.cached_tokens += cached or 0
    if state.requests:
        state.requests[-1]["cached_tokens"] = cached  # this request's record (no await since)
    options = o if isinstance(o := body.get("stream_options"), dict) else {}
    include_usage = options.get("include_usage") is True
    ctx = ResponseContext(
        id=flavour.completion_id(request.headers),
        model=model,
        created=int(time.time()),
        prompt_tokens=prompt_tokens,
        include_usage=include_usage,
        continuous_usage=flavour.vllm_extras and include_usage and options.get("continuous_usage_stats") is True,
        reasoning_fields=config.reasoning_fields,
        include_reasoning=body.get("include_reasoning") is not False,
        cached_tokens=cached,
        # the prompt's whole blocks the cache did not have: written to it now
        created_cache_tokens=None if cached is None else
        max(0, prompt_tokens // config.prefix_block * config.prefix_block - cached),
        reasoning_parser=config.reasoning,
    )
    return Generation(
        id=ctx.id,
        seq=seq,
        stream=body.get("stream") is True,
        events=timeline(plan, limits),
        ctx=ctx,
        delay_ms=directives.delay_ms if directives.delay_ms is not None else config.token_delay_ms,
        directives=directives,
        prefill_ms=(prompt_tokens - (cached or 0)) * config.prefill_us_per_token / 1000,
    )


def _abort(request: web.Request, state: StubState, gen: Generation) -> None:
    gen.ended = True
    state.stats.failed += 1
    state.log.write(f"aborted id={gen.id} after {gen.sent_tokens} tokens seq={gen.seq}")
    if request.transport is not None:
        request.transport.close()


def _sse(payload: Any) -> bytes:
    return b"data: " + _encode(payload) + b"\n\n"


def _wait_ms(gen: Generation, i: int) -> float:
    """Before event i: the token delay; before the first, `first_ms` if given, and the time to
    first token (ttft_ms, the prefill)."""
    if i:
        return gen.delay_ms
    first = gen.directives.first_ms
    return (gen.delay_ms if first is None else first) + gen.directives.ttft_ms + gen.prefill_ms


async def _stream(request: web.Request, flavour: Flavour, state: StubState, gen: Generation) -> web.StreamResponse:
    resp = web.StreamResponse(status=200, headers={"Content-Type": flavour.stream_content_type})
    await resp.prepare(request)
    for i, event in enumerate(gen.events):
        await _sleep_ms(_wait_ms(gen, i))
        if isinstance(event, Abort):
            _abort(request, state, gen)
            return resp
        if isinstance(event, Fail):
            _note_failed(state, gen)
            await resp.write(_sse(flavour.stream_error(gen.ctx)))
            if flavour.done_after_error:
                await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            return resp
        assert isinstance(event, Step)
        if i == 0:
            for opening in flavour.stream_open(gen.ctx):
                await resp.write(_sse(opening))
        gen.sent_tokens += event.tokens
        chunk = flavour.stream_step(gen.ctx, event, gen.sent_tokens)
        if chunk is not None:
            await resp.write(_sse(chunk))
    if gen.ctx.include_usage:
        await resp.write(_sse(flavour.stream_usage(gen.ctx, gen.sent_tokens)))
    _note_completed(state, gen)
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


async def _respond(request: web.Request, flavour: Flavour, state: StubState, gen: Generation) -> web.StreamResponse:
    for i, event in enumerate(gen.events):
        await _sleep_ms(_wait_ms(gen, i))
        if isinstance(event, Abort):
            _abort(request, state, gen)
            return web.Response(status=499)
        if isinstance(event, Fail):
            _note_failed(state, gen)
            return json_response(flavour.completion_error())
        assert isinstance(event, Step)
        gen.sent_tokens += event.tokens
    body = _encode(flavour.completion(gen.ctx, gen.events))
    _note_completed(state, gen)
    return web.Response(status=200, body=body, content_type="application/json")
