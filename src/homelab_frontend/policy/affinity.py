"""Session affinity: which backend a conversation's turns should go to, so they find their prefix
in that backend's KV cache.

Design note
-----------
A backend that served turn k of a conversation holds turn k's prompt in its prefix cache; turn
k+1 starts with those same tokens, so on that backend only the new tail is prefilled, while any
other backend prefills all of it (for a Claude Code turn, ~20k tokens: seconds on a homelab GPU).
Least-loaded routing scatters a session's turns over the backends; affinity keeps them together.

The choice is stateless, so every gateway replica makes the same one with no shared memory:

1. The conversation is named by a key: a client session header (`x-claude-code-session-id`, which
   Claude Code sends, or `session-id`), else `prompt_cache_key` from an OpenAI body, else a hash
   of the conversation's opening (its system text before the first user message, and that first
   user message). The opening is part of every later turn unchanged (history is append-only), so
   every turn of one conversation hashes alike, and two conversations that open alike share the
   prefix anyway.
2. Rendezvous (highest-random-weight) hashing of the key over the backends that are up: each
   backend scores `hash(key, backend name)`, the highest wins. Every replica computes the same
   ranking; a backend going down moves only its own sessions, and each to its next choice.
3. The preferred backend is taken while it has a free slot, or its queue has room and the wait
   there (estimated from recent slot hold times) is at most `affinity_max_wait_s` longer than on
   the least-loaded backend. Otherwise the turn spills to the least-loaded one: a cache hit is
   not worth an unbounded queue.

Pure: no I/O, no state.
"""

from __future__ import annotations

import hashlib
from typing import Mapping

from .. import canonical as c

SESSION_HEADERS = ("x-claude-code-session-id", "session-id")
_MAX_KEY = 256  # a header is client input: bounded before hashing
_MAX_PART = 1 << 16  # of each opening part, this much is hashed: enough to tell conversations apart


def _digest(*parts: str) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    for p in parts:
        h.update(p.encode("utf-8", "surrogatepass"))
        h.update(b"\x00")
    return h.digest()


def opening_key(req: c.Request) -> str | None:
    """A hash of the conversation's opening: the system text before the first user message, and
    that message (text and image URLs). None when there is no user message to anchor it."""
    parts: list[str] = []
    for m in req.messages:
        if m.role == "system":
            parts.append("s:" + m.text()[:_MAX_PART])
            continue
        if m.role != "user":
            return None  # a conversation that does not open with the user: nothing stable to hash
        parts.append("u:" + "\n".join((p.text if isinstance(p, c.TextPart) else p.url)[:_MAX_PART] for p in m.parts))
        return "o:" + _digest(*parts).hex()
    return None


def session_key(headers: Mapping[str, str], req: c.Request) -> str | None:
    for name in SESSION_HEADERS:
        value = headers.get(name)
        if value:
            return "h:" + value[:_MAX_KEY]
    if req.cache_key:
        return "k:" + req.cache_key[:_MAX_KEY]
    return opening_key(req)


def score(key: str, backend: str) -> int:
    return int.from_bytes(_digest(key, backend)[:8], "big")


def rank(key: str, names: list[str]) -> list[str]:
    """Backend names in rendezvous order for this key, the preferred first."""
    return sorted(names, key=lambda n: score(key, n), reverse=True)
