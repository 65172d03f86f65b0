"""A backend's `/embeddings` answer as every surface that offers embeddings reads it (OpenAI's
/v1/embeddings, Gemini's embedContent and batchEmbedContents, Ollama's /api/embed and
/api/embeddings), so the dialects cannot drift apart on what they accept from an upstream.

`embed` opens the backend's `/embeddings` (through `Exchange.attempt`: a backend that refuses
fails over, as a chat does) and reads the answer whole; `read_embeddings` checks it: not an embeddings list ->
`upstream_malformed`, an error sent in a 200 body -> `upstream_error`, both naming the backend.
Every surface reads through these two. The dialects that re-shape the vectors (Gemini, Ollama)
take them out with `vectors` (`vectors_of`, pure): in input order, each a list of numbers, as
many as the inputs, else `upstream_malformed` naming the backend (a base64 or a short answer is
not relayed as if it were). OpenAI's surface relays the checked answer as the backend wrote it:
its clients may ask for base64 (`encoding_format`), which is no list of numbers.
"""

from __future__ import annotations

import aiohttp

from ..errors import GatewayError, clean_message
from ..request.exchange import Exchange
from ..upstream.decode import ErrorBody, Malformed, validate_embeddings

__all__ = ["embed", "read_embeddings", "vectors", "vectors_of"]


async def embed(ex: Exchange, body: bytes):
    """The backend's embeddings for `body` (its JSON): (the body as sent, its checked document)."""
    upstream = await ex.attempt(lambda: ex.open("/embeddings", body, stream=False))
    return await read_embeddings(ex, upstream)


async def read_embeddings(ex: Exchange, upstream: aiohttp.ClientResponse):
    """(the body as the backend sent it, its checked document); the exchange is complete."""
    assert ex.client is not None and ex.backend is not None  # the exchange is open
    raw = await ex.client.read_all(upstream)
    ex.complete = True
    try:
        return raw, validate_embeddings(raw)
    except Malformed as err:
        raise GatewayError("upstream_malformed", f"backend {ex.backend.name!r}: {clean_message(str(err))}") from None
    except ErrorBody as err:
        raise GatewayError("upstream_error", f"backend {ex.backend.name!r} failed: {clean_message(str(err))}") from None


def vectors_of(data: list[dict], count: int) -> list[list[float]]:
    """The vectors of an OpenAI embeddings answer's `data`, in input order; ValueError when it
    is not `count` float vectors."""
    def index(d: dict) -> int:
        i = d.get("index")
        return i if isinstance(i, int) and not isinstance(i, bool) else 0

    out = []
    for d in sorted(data, key=index):
        v = d.get("embedding")
        if not isinstance(v, list) or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
            raise ValueError("an embedding is not a list of numbers")
        out.append(v)
    if len(out) != count:
        raise ValueError(f"{len(out)} embeddings for {count} inputs")
    return out


def vectors(ex: Exchange, data: list[dict] | None, count: int) -> list[list[float]]:
    """`vectors_of` for a surface: a wrong answer is the backend's fault, said naming it."""
    try:
        return vectors_of(data or [], count)
    except ValueError as err:
        assert ex.backend is not None  # it answered
        raise GatewayError("upstream_malformed", f"backend {ex.backend.name!r}: {clean_message(str(err))}") from None
