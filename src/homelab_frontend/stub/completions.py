"""`POST /v1/completions` (every flavour) and llama.cpp's `POST /infill`: text after a prompt, as
the real servers send it, with the same timing, cancellation log and stats as the chat handler
(chat.py): one `request` line, then `completed ... tokens=N` or `cancelled ... after N tokens`.

The answer is `max_tokens` (or `n_predict`; else a `[stub content=N]` directive in the prompt, else
16) words ` c1 c2 ...`, at most what the prompt leaves of the context (`--max-model-len`: vLLM fits
`max_tokens` to it, llama.cpp stops a full slot; finish `length`), one token each, `token_delay_ms` (or `[stub delay_ms=N]`) apart, cut where
a stop string begins, as the real servers cut the text (stop `c3` leaves ` c1 c2 `; the token that
completed the stop is not counted). A stop spanning two tokens keeps the earlier token, which was
sent before the stop could be seen (vLLM holds such a prefix back; the stub does not). The prompt counts one token per word (script.text_token_ids), as /tokenize does.

Wire shapes, per flavour:
* vLLM: a prompt over the context, or `max_tokens` over the whole context or under 1, refused
  with vLLM's 400 as a chat's are (vllm.py `check_context`; 0.32's completions build the same
  TokenizeParams); `cmpl-<hex>` ids, chunks with `logprobs: null`, `stop_reason` on the finish chunk (the stop
  string), a `choices: []` usage chunk with `stream_options.include_usage` (and usage on every
  chunk with `continuous_usage_stats`), `[DONE]`; `suffix` is refused with vLLM's 400;
* llama.cpp: `chatcmpl-` ids (its completions share the chat id scheme), `system_fingerprint`,
  the usage chunk with `timings`; `/infill` and `/completion` answer llama.cpp's own objects
  (server-task.cpp `to_json_non_oaicompat`), no `[DONE]`: each streamed piece `{"index",
  "content", "tokens": [id], "stop": false, "id_slot" (the one asked for, -1: any),
  "tokens_predicted", "tokens_evaluated"}` (with `timings` on every one with `timings_per_token`, and
  `completion_probabilities` with `n_probs`: `logprob`/`top_logprobs`, or `prob`/`top_probs`
  with `post_sampling_probs`), then the last object with `stop: true`, `generation_settings`,
  `prompt`, `truncated`, `stop_type`, `stopping_word`, `tokens_cached` and `timings` (streamed:
  empty `content` and `tokens`; plain: all the text, the ids with `return_tokens`, every
  piece's probabilities). `response_fields` trims the last object, and only it, to the paths
  named, each flattened into one key (`timings/prompt_n`), paths naming nothing left out: `[""]`
  answers `{}`, so a trimmed last object carries no `stop`. A model without FIM tokens
  (`--no-fim`: Gemma 3) answers /infill with llama.cpp's 501;
* Ollama: `cmpl-<n>` ids, `system_fingerprint: fp_ollama`, takes `suffix` (the real one renders
  its model's FIM template; the stub records it).
"""

from __future__ import annotations

import asyncio
import random
import secrets
import time
import uuid
from typing import Any

import msgspec
from aiohttp import web

from .chat import FLAVOUR, STATE, begin, json_response
from .script import parse_directives, text_token_ids

_encode = msgspec.json.encode
DEFAULT_TOKENS = 16


def _sse(obj: Any) -> bytes:
    return b"data: " + _encode(obj) + b"\n\n"


def _id(flavour: str) -> str:
    if flavour == "vllm":
        return f"cmpl-{uuid.uuid4().hex}"
    if flavour == "ollama":
        return f"cmpl-{random.randrange(999)}"
    return "chatcmpl-" + secrets.token_hex(16)


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _stops(v: Any) -> list[str]:
    if isinstance(v, str):
        return [v] if v else []
    return [s for s in v if isinstance(s, str) and s] if isinstance(v, list) else []


class _Gen:
    """One generation: its pieces, and how far it got (for the log)."""

    def __init__(self, state, seq: int, flavour: str, limit: int, stops: list[str], delay_ms: int) -> None:
        self.state = state
        self.seq = seq
        self.id = _id(flavour)
        self.limit = limit
        self.stops = stops
        self.delay_ms = delay_ms
        self.sent = 0
        self.text = ""
        self.ended = False
        self.stopped_by: str | None = None

    async def pieces(self):
        """Yield each generated piece after its delay; `stopped_by` is set when a stop fired."""
        for i in range(1, self.limit + 1):
            if self.delay_ms > 0:
                await asyncio.sleep(self.delay_ms / 1000)
            piece = f" c{i}"
            for s in self.stops:
                at = (self.text + piece).find(s)
                if at >= 0:
                    self.stopped_by = s
                    head = piece[: max(0, at - len(self.text))]  # this token's text before the stop
                    if head:
                        self.text += head
                        yield head
                    return
            self.sent += 1
            self.text += piece
            yield piece

    @property
    def finish(self) -> str:
        return "stop" if self.stopped_by is not None or self.sent < self.limit else "length"

    def completed(self) -> None:
        self.ended = True
        self.state.stats.completed += 1
        self.state.log.write(f"completed id={self.id} tokens={self.sent} seq={self.seq}")

    def cancelled(self) -> None:
        if not self.ended:
            self.ended = True
            self.state.stats.cancelled += 1
            self.state.log.write(f"cancelled id={self.id} after {self.sent} tokens seq={self.seq}")


def _timings(prompt: int, predicted: int) -> dict:
    return {"cache_n": 0, "prompt_n": prompt, "prompt_ms": 1.0, "prompt_per_token_ms": 0.1,
            "prompt_per_second": 1000.0, "predicted_n": predicted, "predicted_ms": 1.0,
            "predicted_per_token_ms": 0.1, "predicted_per_second": 1000.0}


async def _begin(request: web.Request, path: str):
    """Chat's opening (chat.begin), and a body that must be an object. -> (body, seq) or a Response."""
    begun = await begin(request, keyed=path not in ("/infill", "/completion"))
    if isinstance(begun, web.StreamResponse):
        return begun
    body, seq = begun
    flavour = request.app[FLAVOUR]
    if not isinstance(body, dict):
        return json_response(flavour.error(400, "The request body must be a JSON object"))
    return body, seq


async def handle_completions(request: web.Request) -> web.StreamResponse:
    begun = await _begin(request, "/v1/completions")
    if isinstance(begun, web.StreamResponse):
        return begun
    body, seq = begun
    state, flavour = request.app[STATE], request.app[FLAVOUR]
    config = state.config
    name = flavour.name
    model = flavour.resolve_model(body.get("model"), config.models)
    if not isinstance(model, str):
        return json_response(model)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str):
        return json_response(flavour.error(400, "prompt must be a string"))
    if name == "vllm" and body.get("suffix") is not None:
        return json_response(flavour.error(400, "suffix is not currently supported", param="suffix"))
    if name == "vllm" and body.get("stream_options") and not body.get("stream"):
        return json_response(flavour.error(400, "Stream options can only be defined when `stream=True`.",
                                           param="stream_options"))
    text = prompt + (body.get("suffix") or "")
    prompt_tokens = len(text_token_ids(text))
    if name in ("vllm", "llamacpp"):  # the context's rules, as for a chat (chat.py)
        refusal = flavour.check_context(prompt_tokens, _int(body.get("max_tokens")), config.max_model_len)
        if refusal is not None:
            state.log.write(f"rejected status={refusal.status} seq={seq}")
            return json_response(refusal)
    return await _play(request, state, flavour, body, seq, model, prompt_tokens, text, infill=False)


async def handle_infill(request: web.Request) -> web.StreamResponse:
    begun = await _begin(request, "/infill")
    if isinstance(begun, web.StreamResponse):
        return begun
    body, seq = begun
    state, flavour = request.app[STATE], request.app[FLAVOUR]
    if not state.config.fim:
        state.log.write(f"rejected status=501 seq={seq}")
        return json_response(flavour.error(501, "Infill is not supported by this model: prefix token is missing. "
                                                "suffix token is missing. middle token is missing. "))
    for key in ("input_prefix", "input_suffix"):
        if key not in body:
            return json_response(flavour.error(400, f'"{key}" is required'))
    extra = body.get("input_extra") or []
    text = " ".join([*(ch.get("text", "") for ch in extra if isinstance(ch, dict)),
                     str(body["input_prefix"]), str(body.get("prompt") or ""), str(body["input_suffix"])])
    prompt_tokens = len(text_token_ids(text)) + 3  # the FIM tokens around them
    return await _play(request, state, flavour, body, seq, state.config.models[0], prompt_tokens, text, infill=True)


async def handle_native_completion(request: web.Request) -> web.StreamResponse:
    """llama.cpp's own `/completion`: a prompt, answered in /infill's objects."""
    begun = await _begin(request, "/completion")
    if isinstance(begun, web.StreamResponse):
        return begun
    body, seq = begun
    state, flavour = request.app[STATE], request.app[FLAVOUR]
    prompt = body.get("prompt")
    if not isinstance(prompt, str):
        return json_response(flavour.error(400, '"prompt" must be provided'))
    prompt_tokens = len(text_token_ids(prompt)) + 1  # the BOS token
    return await _play(request, state, flavour, body, seq, state.config.models[0], prompt_tokens, prompt, infill=True)


async def _play(request, state, flavour, body: dict, seq: int, model: str, prompt_tokens: int, text: str,
                *, infill: bool) -> web.StreamResponse:
    directives = parse_directives(text)
    limit = _int(body.get("n_predict" if infill else "max_tokens"))
    if infill and limit is None:  # llama.cpp's aliases of n_predict
        limit = _int(body.get("max_tokens", body.get("max_completion_tokens")))
    if limit is None or limit < 0:
        limit = directives.content if directives.content is not None else DEFAULT_TOKENS
    if flavour.name in ("vllm", "llamacpp"):
        # an answer ends where the context does: vLLM fits max_tokens to what the prompt leaves
        # (get_max_tokens), llama.cpp stops a slot whose context is full; without this a huge
        # max_tokens made the stub generate without end, at full speed when no delay is set
        limit = min(limit, max(0, state.config.max_model_len - prompt_tokens))
    delay = directives.delay_ms if directives.delay_ms is not None else state.config.token_delay_ms
    gen = _Gen(state, seq, flavour.name, limit, _stops(body.get("stop")), delay)
    stream = body.get("stream") is True
    state.log.write(f"request id={gen.id} model={model} stream={'true' if stream else 'false'} seq={seq}")
    state.stats.prompt_tokens += prompt_tokens
    state.stats.begin()
    try:
        if directives.ttft_ms:
            await asyncio.sleep(directives.ttft_ms / 1000)
        if infill:
            return await _infill(request, flavour, body, gen, model, prompt_tokens, stream, text)
        return await _completion(request, flavour, body, gen, model, prompt_tokens, stream)
    except (asyncio.CancelledError, ConnectionResetError):
        gen.cancelled()
        raise
    finally:
        state.stats.end()


def _head(flavour, gen: _Gen, model: str, created: int) -> dict:
    head: dict = {"id": gen.id, "object": "text_completion", "created": created, "model": model}
    if flavour.name == "llamacpp":
        head["system_fingerprint"] = "b0-unknown"
    elif flavour.name == "ollama":
        head["system_fingerprint"] = "fp_ollama"
    return head


def _choice(flavour, text: str, finish: str | None, stop_reason: Any = None) -> dict:
    choice: dict = {"text": text, "index": 0, "finish_reason": finish}
    if flavour.name in ("vllm", "llamacpp"):
        choice["logprobs"] = None
    if flavour.name == "vllm":
        choice["stop_reason"] = stop_reason
    return choice


def _usage(prompt: int, completion: int) -> dict:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


async def _completion(request, flavour, body: dict, gen: _Gen, model: str, prompt_tokens: int,
                      stream: bool) -> web.StreamResponse:
    head = _head(flavour, gen, model, int(time.time()))
    if not stream:
        async for _ in gen.pieces():
            pass
        doc = {**head, "choices": [_choice(flavour, gen.text, gen.finish, gen.stopped_by)],
               "usage": _usage(prompt_tokens, gen.sent)}
        gen.completed()
        return web.Response(body=_encode(doc), content_type="application/json")
    opts = o if isinstance(o := body.get("stream_options"), dict) else {}
    include_usage = opts.get("include_usage") is True
    continuous = flavour.name == "vllm" and include_usage and opts.get("continuous_usage_stats") is True
    resp = web.StreamResponse(headers={"Content-Type": flavour.stream_content_type})
    await resp.prepare(request)
    async for piece in gen.pieces():
        chunk = {**head, "choices": [_choice(flavour, piece, None)]}
        if continuous:
            chunk["usage"] = _usage(prompt_tokens, gen.sent)
        await resp.write(_sse(chunk))
    last = {**head, "choices": [_choice(flavour, "", gen.finish, gen.stopped_by)]}
    if continuous:
        last["usage"] = _usage(prompt_tokens, gen.sent)
    await resp.write(_sse(last))
    if include_usage:
        usage_chunk = {**head, "choices": [], "usage": _usage(prompt_tokens, gen.sent)}
        if flavour.name == "llamacpp":
            usage_chunk["timings"] = _timings(prompt_tokens, gen.sent)
        await resp.write(_sse(usage_chunk))
    gen.completed()
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


def _nested_values(paths: list[str], doc: dict) -> dict:
    """llama.cpp's json_get_nested_values: each path's value under the path; missing ones left out."""
    out: dict = {}
    for path in paths:
        cur: Any = doc
        for key in path.split("/"):
            if not (isinstance(cur, dict) and key in cur):
                break
            cur = cur[key]
        else:
            out[path] = cur
    return out


def _n_probs(body: dict) -> int:
    n = _int(body.get("n_probs"))
    if n is None:
        n = _int(body.get("logprobs"))  # llama.cpp's alias
    return max(0, n or 0)


def _probs(piece: str, tok: int, n: int, post: bool) -> dict:
    """One token's `completion_probabilities` entry: the chosen token first among its top n."""
    p, top = ("prob", "top_probs") if post else ("logprob", "top_logprobs")
    value = (lambda i: 0.5 / (i + 1)) if post else (lambda i: -0.5 * (i + 1))
    tops = [{"id": tok + i, "token": piece if i == 0 else f" alt{i}", "bytes": list((piece if i == 0 else f" alt{i}").encode()),
             p: value(i)} for i in range(n)]
    return {"id": tok, "token": piece, "bytes": list(piece.encode()), p: value(0), top: tops}


def _settings(body: dict, limit: int, stream: bool) -> dict:
    return {"seed": _int(body.get("seed")) if _int(body.get("seed")) is not None else 4294967295,
            "temperature": body.get("temperature", 0.8), "top_k": body.get("top_k", 40),
            "top_p": body.get("top_p", 0.95), "stop": _stops(body.get("stop")), "max_tokens": limit,
            "n_predict": limit, "stream": stream, "n_probs": _n_probs(body),
            "timings_per_token": body.get("timings_per_token") is True,
            "post_sampling_probs": body.get("post_sampling_probs") is True}


class _Native:
    """llama.cpp's own objects for one /infill or /completion generation."""

    def __init__(self, gen: _Gen, body: dict, model: str, prompt_tokens: int, prompt: str, stream: bool) -> None:
        self.gen, self.body, self.model = gen, body, model
        self.prompt_tokens, self.prompt, self.stream = prompt_tokens, prompt, stream
        self.n_probs = _n_probs(body)
        self.post = body.get("post_sampling_probs") is True
        self.ids: list[int] = []
        self.probs: list[dict] = []

    def piece(self, text: str) -> dict:
        gen = self.gen
        tok = 1000 + gen.sent
        self.ids.append(tok)
        # a piece names the slot the request asked for (-1: any), the last object the one it ran in
        asked = _int(self.body.get("id_slot"))
        doc: dict = {"index": 0, "content": text, "tokens": [tok], "stop": False,
                     "id_slot": asked if asked is not None else -1,
                     "tokens_predicted": gen.sent, "tokens_evaluated": self.prompt_tokens}
        if self.body.get("timings_per_token") is True:
            doc["timings"] = _timings(self.prompt_tokens, gen.sent)
        if self.n_probs:
            entry = _probs(text, tok, self.n_probs, self.post)
            self.probs.append(entry)
            doc["completion_probabilities"] = [entry]
        return doc

    def last(self, content: str) -> dict:
        gen = self.gen
        stop_type = "word" if gen.stopped_by is not None else ("limit" if gen.finish == "length" else "eos")
        doc = {"index": 0, "content": content,
               "tokens": self.ids if not self.stream and self.body.get("return_tokens") is True else [],
               "id_slot": max(0, _int(self.body.get("id_slot")) or 0), "stop": True, "model": self.model, "tokens_predicted": gen.sent,
               "tokens_evaluated": self.prompt_tokens, "generation_settings": _settings(self.body, gen.limit, self.stream),
               "prompt": self.prompt, "has_new_line": "\n" in gen.text, "truncated": False, "stop_type": stop_type,
               "stopping_word": gen.stopped_by or "", "tokens_cached": self.prompt_tokens + gen.sent,
               "timings": _timings(self.prompt_tokens, gen.sent)}
        if not self.stream and self.probs:
            doc["completion_probabilities"] = self.probs
        fields = self.body.get("response_fields")
        if isinstance(fields, list) and fields:
            return _nested_values([f for f in fields if isinstance(f, str)], doc)
        return doc


async def _infill(request, flavour, body: dict, gen: _Gen, model: str, prompt_tokens: int,
                  stream: bool, text: str = "") -> web.StreamResponse:
    native = _Native(gen, body, model, prompt_tokens, text, stream)
    if not stream:
        async for piece in gen.pieces():
            native.piece(piece)
        doc = native.last(gen.text)
        gen.completed()
        return web.Response(body=_encode(doc), content_type="application/json")
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    async for piece in gen.pieces():
        await resp.write(_sse(native.piece(piece)))
    gen.completed()
    await resp.write(_sse(native.last("")))
    await resp.write_eof()
    return resp
