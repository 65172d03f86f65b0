"""Completion request bodies -> a `TextCall` (pure: bytes in, a TextCall or a GatewayError out).

Three dialects ask for the same thing, text after (and before) a cursor:
* OpenAI's legacy `POST /v1/completions`: `prompt` (a string, or a list of one string), `suffix`,
  `max_tokens`, `stop`, `temperature`, `top_p`, `seed`, penalties, `stream` with
  `stream_options.include_usage`. One slot runs one sequence, so `n` and `best_of` above 1 are a
  400 naming the field; `echo` only vLLM does (the handler refuses it for other backends, naming
  the field); `logprobs` is a 400 (the answer is decoded into canonical events, which carry no
  token probabilities). Unknown fields are accepted and never forwarded.
* llama.cpp's `POST /infill`: `input_prefix`, `input_suffix` (both required, as llama.cpp says),
  `input_extra` ([{filename, text}]), `prompt` (appended to the prefix), `n_predict`,
  `t_max_predict_ms` and llama.cpp's samplers; `model` optional (a configured default). To a
  llama.cpp backend the client's own llama.cpp fields go as they are (an allow-list); to any other
  backend the request is rendered through the model's FIM template.
* Ollama's `POST /api/generate` with `raw: true` or `suffix` (surfaces/ollama/request.py decides
  and builds the TextCall with `ollama_call`).

Every refusal names its field in `param`.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from ... import canonical as c
from ...errors import GatewayError
from ..body import decode_object

Endpoint = Literal["completions", "infill", "generate"]


class TextCall(msgspec.Struct):
    endpoint: Endpoint
    model: str
    stream: bool
    prompt: str  # the text before the cursor (or the whole raw prompt)
    suffix: str | None = None  # the text after it: a fill-in-the-middle request
    extra: list[dict] = msgspec.field(default_factory=list)  # /infill's input_extra
    params: dict = msgspec.field(default_factory=dict)  # OpenAI-named sampling fields to forward
    include_usage: bool = False  # the client asked for the usage chunk (stream_options)
    vllm_only: str | None = None  # a field only vLLM can honour (echo)
    llama: dict | None = None  # /infill: the client's llama.cpp fields, for a llama.cpp backend
    warmup: bool = False  # a request that generates nothing (n_predict 0: a prefix-cache warm-up)

    @property
    def request(self) -> c.Request:
        """The canonical view the skeleton needs (model, stream, max_tokens; no stop: the
        completion surfaces send stop strings upstream themselves)."""
        return c.Request(model=self.model, messages=[], stream=self.stream,
                         max_tokens=self.params.get("max_tokens"))


def _bad(path: str, detail: str) -> GatewayError:
    return GatewayError("invalid_request", f"{path}: {detail}", param=path)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _stop(v: Any, path: str) -> list[str] | None:
    if v is None:
        return None
    if isinstance(v, str):
        return [v] if v else None
    if isinstance(v, list) and all(isinstance(s, str) for s in v):
        return [s for s in v if s] or None
    raise _bad(path, "expected a string or a list of strings")


# OpenAI-named sampling fields forwarded as they are, with the type each must have
_NUMBERS = ("temperature", "top_p", "presence_penalty", "frequency_penalty", "min_p", "repetition_penalty")
_INTS = ("seed", "top_k")


def _sampling(raw: dict, out: dict, names: dict[str, str] | None = None) -> None:
    """Copy the sampling fields of `raw` into `out`, type-checked. `names`: the dialect's name
    for an OpenAI field (Ollama's options use the same names)."""
    for keys, fits, kind in ((_NUMBERS, _is_num, "a number"), (_INTS, _is_int, "an integer")):
        for key in keys:
            v = raw.get(key)
            if v is None:
                continue
            if not fits(v):
                raise _bad(key, f"expected {kind}, got {type(v).__name__}")
            out[key] = v


def _optional(raw: dict, key: str, kind: type[str] | type[bool], path: str | None = None) -> Any:
    """`raw[key]`: None when absent, else a `kind` (str or bool), or the error naming `path`."""
    v = raw.get(key)
    if v is not None and not isinstance(v, kind):
        raise _bad(path or key, "expected a string" if kind is str else "expected true or false")
    return v


def _max_tokens(v: Any, path: str) -> int | None:
    if v is None:
        return None
    if not _is_int(v) or v < 0:
        raise _bad(path, f"expected a non-negative integer, got {v!r}")
    return v


def _model(raw: dict, default: str | None = None) -> str:
    v = raw.get("model")
    if v is None or v == "":
        if default:
            return default
        raise _bad("model", "required string field is missing")
    if not isinstance(v, str):
        raise _bad("model", "expected a string")
    return v


def parse_completions(body: bytes) -> TextCall:
    """`POST /v1/completions`."""
    raw = decode_object(body)
    model = _model(raw)
    prompt = raw.get("prompt")
    if isinstance(prompt, list):
        if len(prompt) != 1 or not isinstance(prompt[0], str):
            raise _bad("prompt", "expected a string or a list of one string (one completion per request)")
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise _bad("prompt", "required string field is missing")
    suffix = _optional(raw, "suffix", str)
    stream = _optional(raw, "stream", bool)
    for key in ("n", "best_of"):
        v = raw.get(key)
        if v is None:
            continue
        if not _is_int(v) or v < 1:
            raise _bad(key, "expected a positive integer")
        if v > 1:
            raise _bad(key, f"{v} completions per request are not available through this gateway: "
                            "one request runs one sequence in one backend slot; send 1 (or leave it out)")
    params: dict = {}
    mt = _max_tokens(raw.get("max_tokens"), "max_tokens")
    if mt is not None:
        params["max_tokens"] = mt
    stop = _stop(raw.get("stop"), "stop")
    if stop:
        params["stop"] = stop
    _sampling(raw, params)
    vllm_only = None
    echo = _optional(raw, "echo", bool)
    if echo:
        params["echo"] = True
        vllm_only = "echo"
    if raw.get("logprobs") is not None:
        # the answer is decoded into canonical events, which carry no token probabilities
        raise _bad("logprobs", "token log probabilities are not relayed by this gateway; leave it out")
    opts = raw.get("stream_options")
    include_usage = False
    if opts is not None:
        if not isinstance(opts, dict):
            raise _bad("stream_options", "expected an object")
        iu = _optional(opts, "include_usage", bool, "stream_options.include_usage")
        include_usage = bool(iu)
    return TextCall("completions", model, bool(stream), prompt, suffix, params=params,
                    include_usage=include_usage, vllm_only=vllm_only,
                    warmup=mt == 0)


# llama.cpp's own /infill fields a llama.cpp backend gets as the client sent them
_LLAMA_FIELDS = ("input_prefix", "input_suffix", "input_extra", "prompt", "n_predict", "t_max_predict_ms",
                 "t_max_prompt_ms", "n_indent", "temperature", "top_k", "top_p", "min_p", "typical_p", "seed",
                 "stop", "samplers", "cache_prompt", "repeat_penalty", "repeat_last_n", "presence_penalty",
                 "frequency_penalty", "n_probs", "id_slot", "response_fields")


def parse_infill(default_model: str | None):
    """llama.cpp's `POST /infill`; `default_model` for a body that names none."""

    def parse(body: bytes) -> TextCall:
        raw = decode_object(body)
        model = _model(raw, default_model)
        for key in ("input_prefix", "input_suffix"):
            if not isinstance(raw.get(key), str):
                raise _bad(key, "required string field is missing" if key not in raw else "expected a string")
        extra = raw.get("input_extra")
        if extra is None:
            extra = []
        if not isinstance(extra, list):
            raise _bad("input_extra", 'expected an array of {"filename": string, "text": string}')
        for i, ch in enumerate(extra):
            if not isinstance(ch, dict) or not isinstance(ch.get("text"), str):
                raise _bad(f"input_extra[{i}].text", "required string field is missing")
            _optional(ch, "filename", str, f"input_extra[{i}].filename")
        prompt = _optional(raw, "prompt", str)
        stream = _optional(raw, "stream", bool)
        params: dict = {}
        n = raw.get("n_predict")
        if n is not None:
            if not _is_int(n):
                raise _bad("n_predict", "expected an integer")
            if n >= 0:  # -1: no limit
                params["max_tokens"] = n
        stop = _stop(raw.get("stop"), "stop")
        if stop:
            params["stop"] = stop
        _sampling(raw, params)
        llama = {k: raw[k] for k in _LLAMA_FIELDS if k in raw}
        return TextCall("infill", model, bool(stream), raw["input_prefix"] + (prompt or ""), raw["input_suffix"],
                        extra=[{"filename": ch.get("filename"), "text": ch["text"]} for ch in extra],
                        params=params, llama=llama, warmup=n == 0)

    return parse
