"""Completion request bodies -> a `TextCall` (pure: bytes in, a TextCall or a GatewayError out).

Three dialects ask for the same thing, text after (and before) a cursor:
* OpenAI's legacy `POST /v1/completions`: `prompt` (a string, or a list of one string), `suffix`,
  `max_tokens`, `stop`, `temperature`, `top_p`, `seed`, penalties, `stream` with
  `stream_options.include_usage`. One slot runs one sequence, so `n` and `best_of` above 1 are a
  400 naming the field; `echo` only vLLM does (the handler refuses it for other backends, naming
  the field); `logprobs` is a 400 (the answer is decoded into canonical events, which carry no
  token probabilities). Unknown fields are accepted and never forwarded.
* llama.cpp's `POST /infill`: `input_prefix`, `input_suffix` (both required, as llama.cpp says),
  `input_extra` ([{filename, text}]), `prompt` (appended to the prefix), `n_predict` (or its
  aliases `max_tokens`, `max_completion_tokens`, as llama.cpp reads them), `t_max_predict_ms`,
  `response_fields` (a list of strings) and llama.cpp's samplers; `model` optional (a configured
  default). To a llama.cpp backend the client's own llama.cpp fields go as they are (an
  allow-list, `_LLAMA_FIELDS`: `response_fields` and `stream` excepted, which the gateway applies
  itself, and `n_cmpl` / `n`, since one request runs one sequence in one slot: the answer is one
  object); to any other backend the request is rendered through the model's FIM template.
* llama.cpp's `POST /completion` (Continue's and Twinny's llama.cpp providers): `prompt` (a
  string) and the same llama.cpp fields; to a llama.cpp backend relayed to its `/completion`, to
  any other the prompt to its `/v1/completions`, answered in llama.cpp's shape alike.
* Ollama's `POST /api/generate` with `raw: true` or `suffix` (surfaces/ollama/request.py decides
  and builds the TextCall with `ollama_call`).

Every refusal names its field in `param`.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from ... import canonical as c
from ..body import decode_object
from ..fields import invalid as _bad

Endpoint = Literal["completions", "infill", "completion", "generate"]


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
    llama: dict | None = None  # /infill, /completion: the client's llama.cpp fields, for a llama.cpp backend
    fields: list[str] | None = None  # llama.cpp's response_fields: the last object trimmed to these
    warmup: bool = False  # a request that generates nothing (n_predict 0: a prefix-cache warm-up)

    @property
    def request(self) -> c.Request:
        """The canonical view the skeleton needs (model, stream, max_tokens; no stop: the
        completion surfaces send stop strings upstream themselves)."""
        return c.Request(model=self.model, messages=[], stream=self.stream,
                         max_tokens=self.params.get("max_tokens"))


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


# llama.cpp's own fields (server-schema.cpp) a llama.cpp backend gets as the client sent them. Left
# out: `stream` and `response_fields` (the gateway reads a stream and trims the answer itself),
# `n_cmpl` / `n` (one request runs one sequence in one slot), `verbose` (no effect on these answers)
_LLAMA_FIELDS = ("input_prefix", "input_suffix", "input_extra", "prompt", "n_predict", "max_tokens",
                 "max_completion_tokens", "t_max_predict_ms", "t_max_prompt_ms", "n_indent", "n_keep", "n_discard",
                 "n_cache_reuse", "temperature", "dynatemp_range", "dynatemp_exponent", "top_k", "top_p", "min_p",
                 "top_n_sigma", "xtc_probability", "xtc_threshold", "typical_p", "seed", "stop", "samplers",
                 "cache_prompt", "repeat_penalty", "repeat_last_n", "presence_penalty", "frequency_penalty",
                 "dry_multiplier", "dry_base", "dry_allowed_length", "dry_penalty_last_n", "dry_sequence_breakers",
                 "mirostat", "mirostat_tau", "mirostat_eta", "ignore_eos", "logit_bias", "grammar", "json_schema",
                 "n_probs", "logprobs", "min_keep", "post_sampling_probs", "return_tokens", "return_progress",
                 "timings_per_token", "id_slot", "lora", "sse_ping_interval")


def _fields(raw: dict) -> list[str] | None:
    v = raw.get("response_fields")
    if v is None:
        return None
    if not isinstance(v, list) or not all(isinstance(f, str) for f in v):
        raise _bad("response_fields", "expected an array of strings (field names; `a/b` names b inside a)")
    return v or None  # an empty list: every field, as llama.cpp answers it


def _n_predict(raw: dict) -> int | None:
    """llama.cpp's `n_predict`, or its aliases; -1 (no limit) -> None."""
    for key in ("n_predict", "max_tokens", "max_completion_tokens"):
        n = raw.get(key)
        if n is None:
            continue
        if not _is_int(n) or n < -1:
            raise _bad(key, f"expected an integer of at least -1 (-1: no limit), got {n!r}")
        return n if n >= 0 else None
    return None


def _native(raw: dict, endpoint: Endpoint, model: str, prompt: str, suffix: str | None,
            extra: list[dict]) -> TextCall:
    """The TextCall of a llama.cpp-native request (/infill, /completion)."""
    stream = _optional(raw, "stream", bool)
    params: dict = {}
    n = _n_predict(raw)
    if n is not None:
        params["max_tokens"] = n
    stop = _stop(raw.get("stop"), "stop")
    if stop:
        params["stop"] = stop
    _sampling(raw, params)
    for key in ("return_tokens", "post_sampling_probs", "timings_per_token", "return_progress", "cache_prompt"):
        _optional(raw, key, bool)
    llama = {k: raw[k] for k in _LLAMA_FIELDS if k in raw}
    return TextCall(endpoint, model, bool(stream), prompt, suffix, extra=extra, params=params, llama=llama,
                    fields=_fields(raw), warmup=n == 0)


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
        return _native(raw, "infill", model, raw["input_prefix"] + (prompt or ""), raw["input_suffix"],
                       [{"filename": ch.get("filename"), "text": ch["text"]} for ch in extra])

    return parse


def parse_native_completion(default_model: str | None):
    """llama.cpp's `POST /completion`; `default_model` for a body that names none."""

    def parse(body: bytes) -> TextCall:
        raw = decode_object(body)
        model = _model(raw, default_model)
        prompt = raw.get("prompt")
        if not isinstance(prompt, str):
            raise _bad("prompt", "required string field is missing" if prompt is None else
                       "expected a string (token arrays are not taken through this gateway)")
        return _native(raw, "completion", model, prompt, None, [])

    return parse
