"""Failover before the first byte: which failures of a backend another backend may answer instead.

A model served by several backends should not fail a request because the one chosen for it
refused the connection or said "not now": the request moves to another backend of the same model
(`Exchange.attempt`, request/exchange.py), gives its slot back and takes one there through the
fair queue, within the request's own deadlines, at most once per backend. Only while no byte of
the answer has reached the client: `attempt` wraps the opening of the upstream answer, and every
surface writes its first byte only after that returned.

The causes (the `cause` label of `hlf_failovers_total`):

| cause | what the backend did |
|---|---|
| `unreachable` | refused the connection, no route, any other failure to connect |
| `connect_timeout` | no connection within `timeouts.connect_s` |
| `reset` | accepted the connection, then closed or reset it before answering |
| `status_502`, `status_503`, `status_504` | a gateway error or "unavailable" (llama.cpp's "Loading model" is a 503) |
| `status_429` | the backend itself rate limiting (the gateway's own 429s come before any backend) |
| `model_not_loaded` | a 400/404 saying the model is not there (Ollama "not found, try pulling it", vLLM "does not exist") |
| `box_down` | a peer box's backend whose box stopped answering its polls while the request waited for its answer's headers (app/peers.py) |
| `broke` | broke off a whole (non-streaming) answer read as a stream (llama.cpp), whose client has seen none of it (`Exchange.whole`) |

Never: any other 4xx (it is about the request: another backend would refuse it too); an answer
whose bytes were bad (`upstream_malformed`, `upstream_too_large`: it answered); the gateway's own
deadlines (first token, idle, total: they are the request's, and spent for every backend).
"""

from __future__ import annotations

import re

from ..upstream.client import UpstreamFailure

_RETRY_STATUS = {429, 502, 503, 504}
# the wordings of "this server does not have that model (loaded)": Ollama, vLLM, llama-swap, LM Studio
_NOT_LOADED = re.compile(
    r"model\b.{0,200}?\b(?:not found|does not exist|not loaded|is not available|no such model|try pulling)"
    r"|\bloading model\b|\bmodel is loading\b|\bno model loaded\b",
    re.I | re.S,
)
CONNECTION_CAUSES = frozenset({"unreachable", "connect_timeout", "reset"})  # passive health counts these


def cause_of(err: Exception) -> str | None:
    """The failover cause of a failure to open an upstream answer, or None when another backend
    may not answer it instead."""
    if not isinstance(err, UpstreamFailure):
        return None
    if err.cause != "status":
        return err.cause
    status = err.upstream_status
    if status in _RETRY_STATUS:
        return f"status_{status}"
    if status in (400, 404) and _NOT_LOADED.search(err.message):
        return "model_not_loaded"
    return None
