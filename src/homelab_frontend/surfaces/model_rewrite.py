"""Putting the client's model name back into an upstream's own JSON (OpenAI surface).

The upstream's `model` may be an internal id, even a file path (llama.cpp names the GGUF it
loaded): it must never reach the client, whatever the upstream's JSON spacing or key order.

1. fast path, compact JSON (vLLM, Ollama, llama.cpp): one `bytes.replace` of `"model":"<name>"`,
   exactly the cost the unconditional replace always had. The `"model":` key cannot occur
   unescaped inside JSON string content, so only keys are ever touched.
2. when that replaced nothing, the chunk's `model` is decoded (a struct of one field): absent or
   already the client's, the payload goes as it is; another compact name (llama.cpp answers with
   the file it loaded, whatever was asked for) becomes the needle, so the rest of the stream
   takes the fast path again; anything else (`"model": "x"` after `json.dumps`, escapes such as
   `\\/`) is decoded to a generic object, given the client's `model`, and encoded: exact, and
   paid only by upstreams that need it.
"""

from __future__ import annotations

import msgspec

_encode = msgspec.json.encode


class _Named(msgspec.Struct):
    model: str | None = None


_model_of = msgspec.json.Decoder(_Named).decode
_decode_any = msgspec.json.decode


class ModelRewriter:
    __slots__ = ("client", "needle", "repl")

    def __init__(self, upstream_model: str, client_model: str) -> None:
        self.client = client_model
        self.needle = b'"model":' + _encode(upstream_model)
        self.repl = b'"model":' + _encode(client_model)

    def __call__(self, payload: bytes) -> bytes:
        """`payload` (a JSON object the caller has already decoded) with `model` the client's."""
        out = payload.replace(self.needle, self.repl)
        if out is not payload:  # CPython returns the very object when nothing was replaced
            return out
        return self.miss(payload)

    def miss(self, payload: bytes) -> bytes:
        """The fast replace found nothing: look at what the upstream wrote (path 2 above)."""
        seen = _model_of(payload).model
        if seen is None or seen == self.client:
            return payload
        needle = b'"model":' + _encode(seen)
        if needle != self.needle:
            out = payload.replace(needle, self.repl)
            if out is not payload:
                self.needle = needle
                return out
        doc = _decode_any(payload)
        doc["model"] = self.client
        return _encode(doc)
