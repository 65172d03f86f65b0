"""llama.cpp's own completion answers (`/infill`, `/completion`) relayed as llama.cpp wrote them
(pure: payloads in, bytes or a JSON body out).

A client that speaks llama.cpp's native API to a llama.cpp backend reads fields the canonical
events do not carry: `timings` (llama.vim's and llama.vscode's info lines), `tokens_cached`,
`truncated`, `generation_settings`, `prompt`, `id_slot`, `tokens` with `return_tokens`,
`completion_probabilities` with `n_probs` (`prob` instead of `logprob` with
`post_sampling_probs`), `timings` on every object with `timings_per_token`, `prompt_progress`
objects with `return_progress`. So the upstream's objects go out as they came (the partial
objects byte for byte), while the same objects are decoded into canonical events for the record,
the ledger and the failure rules (upstream/text_decode.py's `InfillDecoder`).

`response_fields` (a list of paths such as `content` or `timings/prompt_n`): llama.cpp answers
the last object with exactly those fields, each path flattened into one key (`{"timings/prompt_n":
12}`), a path that names nothing left out (`[""]`, llama.vim's warm-up: `{}`), and leaves the
partial objects of a stream whole (server-task.cpp `to_json_non_oaicompat`, server-common.cpp
`json_get_nested_values`). The gateway does not send it upstream: it reads the whole last object
(its counts are the ledger's, its `stop` ends the stream) and trims it here, the same way.

The last object's `model` is the name the client asked for (the backend's own name for it stays
behind the gateway, as on every other surface); nothing else is changed.

A whole answer (the client's `stream: false`) is read from an upstream stream too (so a client
that leaves stops the generation at its next token), and rebuilt as llama.cpp answers a plain
request: the last object, with `content` all the text, `tokens` the generated ids when the client
asked `return_tokens` (else `[]`), `completion_probabilities` every token's when it asked
`n_probs`, and `generation_settings.stream` false; then trimmed by `response_fields`.
(llama.cpp's plain answer leaves out the probabilities of a stop string's tokens; a streamed one
never sent them, so the rebuilt answer has none of them either.)
"""

from __future__ import annotations

from typing import Any

import msgspec

from ... import canonical as c
from ...upstream.text_decode import InfillDecoder

_decode = msgspec.json.decode
_encode = msgspec.json.encode


def nested_values(paths: list[str], doc: dict) -> dict:
    """llama.cpp's `json_get_nested_values`: for each path (keys joined by `/`), the value it names
    in `doc`, under the path itself; a path that names nothing is left out."""
    out: dict = {}
    for path in paths:
        cur: Any = doc
        for key in path.split("/"):
            if isinstance(cur, dict) and key in cur:
                cur = cur[key]
            else:
                break
        else:
            out[path] = cur
    return out


def trimmed(doc: dict, fields: list[str] | None) -> dict:
    """The last object as llama.cpp sends it for a request with `response_fields`."""
    return doc if not fields else nested_values(fields, doc)


def _named(doc: dict, model: str) -> dict:
    return {**doc, "model": model} if "model" in doc else doc


class _Partial(msgspec.Struct):
    """What a whole answer gathers from each partial object."""

    content: str | None = None
    tokens: list[int] | None = None
    completion_probabilities: list[msgspec.Raw] | None = None
    prompt_progress: dict | None = None  # a progress object (return_progress): no token


_partial = msgspec.json.Decoder(_Partial).decode


class NativeDecoder:
    """The upstream's llama.cpp objects -> canonical events (`InfillDecoder`), keeping each
    object for the relay: `take()` hands over those not yet written, `last` is the final one."""

    __slots__ = ("inner", "pending", "last", "error", "whole", "text", "tokens", "probs")

    def __init__(self, *, whole: bool) -> None:
        self.inner = InfillDecoder()
        self.pending: list[bytes] = []  # partial objects' payloads, to go out as they are
        self.last: dict | None = None  # the final object, decoded
        self.error: bytes | None = None  # the upstream's own error object
        self.whole = whole  # gather the text, tokens and probabilities for a whole answer
        self.text: list[str] = []
        self.tokens: list[int] = []
        self.probs: list[msgspec.Raw] = []

    @property
    def done(self) -> bool:
        return self.inner.done

    def feed(self, payload: bytes) -> list[c.Event]:
        if self.inner.done or self.inner.failed:
            return []
        events = self.inner.feed(payload)
        if self.inner.failed:
            try:
                doc = _decode(payload)
            except msgspec.DecodeError:
                doc = None
            if isinstance(doc, dict) and isinstance(doc.get("error"), dict):
                self.error = payload  # llama.cpp's own error object: relayed as it came
            return events
        if self.inner.done:
            self.last = _decode(payload)  # InfillDecoder read it: an object
        elif self.whole:
            try:
                part = _partial(payload)
            except msgspec.ValidationError as exc:
                self.inner.failed = True
                return [c.UpstreamError(f"the backend sent a malformed infill chunk: {exc}")]
            if part.prompt_progress is not None:
                return events  # llama.cpp's plain answer has no progress objects, nor their ids
            if part.content:
                self.text.append(part.content)
            if part.tokens:
                self.tokens.extend(part.tokens)
            if part.completion_probabilities:
                self.probs.extend(part.completion_probabilities)
        else:
            self.pending.append(payload)
        return events

    def take(self) -> list[bytes]:
        out, self.pending = self.pending, []
        return out


def _sse(payload: bytes) -> bytes:
    return b"data: " + payload + b"\n\n"


class NativeStream:
    """The stream to the client: the upstream's objects as they came, the last trimmed by the
    client's `response_fields`; an upstream error object relayed as it came."""

    def __init__(self, decoder: NativeDecoder, fields: list[str] | None, error: Any, *, model: str) -> None:
        self.decoder = decoder
        self.fields = fields
        self.model = model
        self._error = error  # (status, message) -> the error object, for the gateway's own failures
        self.ended = False

    def _flush(self) -> bytes:
        return b"".join(_sse(p) for p in self.decoder.take())

    def feed(self, ev: c.Event) -> bytes:
        if self.ended:
            return b""
        out = self._flush()
        if type(ev) is c.UpstreamError:
            self.ended = True
            err = self.decoder.error or _encode(self._error(500, f"the backend failed mid-stream: {ev.message}"))
            return out + _sse(err)
        return out

    def finish(self) -> bytes:
        self.ended = True
        out = self._flush()
        if self.decoder.last is not None:
            out += _sse(_encode(trimmed(_named(self.decoder.last, self.model), self.fields)))
        return out

    def fail(self, code: str, message: str) -> bytes:
        self.ended = True
        return self._flush() + _sse(_encode(self._error(504 if code == "timeout" else 500, message)))


def native_whole(decoder: NativeDecoder, fields: list[str] | None, *, model: str, return_tokens: bool) -> dict:
    """The plain answer llama.cpp gives, rebuilt from its stream (see the module docstring)."""
    doc = _named(decoder.last or {}, model)
    if "content" in doc:
        doc["content"] = "".join(decoder.text)
    if "tokens" in doc:
        doc["tokens"] = decoder.tokens if return_tokens else []
    settings = doc.get("generation_settings")
    if isinstance(settings, dict) and "stream" in settings:
        doc["generation_settings"] = {**settings, "stream": False}
    if decoder.probs:
        doc["completion_probabilities"] = decoder.probs
    return trimmed(doc, fields)
