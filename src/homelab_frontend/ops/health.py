"""Backend health: one cheap probe (GET /v1/models, never a generation) that also detects the
backend's kind when the config leaves it out, and, for vLLM and llama.cpp, the leak check against
the backend's own count of running requests.

That count is read when it matters, not only once per probe interval: a figure sampled seconds ago
beside slots held since reads as a leak (the dashboard showed `backend running 0` beside three
held slots). So the gateway re-reads it every `HELD_REFRESH_S` while any slot of the backend is
held, and on demand when `/admin/requests` is asked (reads coalesced, at most one per backend in
flight); the snapshot shows its age (`upstream_running_age_s`)."""

from __future__ import annotations

import logging
import time

import msgspec

from ..upstream import backend_kind
from ..errors import GatewayError
from ..policy.routing import BackendState
from ..upstream.client import UpstreamClient, UpstreamFailure

log = logging.getLogger("homelab_frontend")


# Late probes in a row before a backend that answers nothing in time counts as down
# (app/probes.py: late is not gone); a refused or reset connection counts at once.
LATE_PROBES = 3
LATE = object()  # what `probe` returns for a late answer it was allowed to overlook


def is_late(err: GatewayError) -> bool:
    """No answer in time (connected or not): the server may be slow, not gone. A refused or
    reset connection, or an answer that is an error, is not late."""
    return isinstance(err, UpstreamFailure) and err.cause in ("timeout", "connect_timeout")


async def probe(state: BackendState, client: UpstreamClient, late_allowed: bool = False) -> object:
    """Mark the backend up or down, and learn its models' context lengths on the way. A server
    without GET /v1/models (whisper.cpp's, a `health_path` in its config) is up when its health
    path answers 200; it has no model list to learn from. `late_allowed`: a backend that is up
    and answers too late is left as it is (-> LATE), the caller counting how often in a row.
    -> the models list it answered (a peer's says more: app/peers.py), None when it is down or
    has none, LATE."""
    timeout_s = min(5.0, state.cfg.health_interval_s)
    path = backend_kind.health_path(state.cfg)
    try:
        if path is not None:
            await client.get_text(path, timeout_s=timeout_s)
            doc = None
        else:
            doc = await client.get_json("/models", timeout_s=timeout_s)
            if state.auto_kind:
                _detect(state, doc)
            state.model_lens = context_lengths(doc)
            if state.cfg.kind in _RUNNING:
                await leak_check(state, client)
    except GatewayError as err:
        if late_allowed and state.up and is_late(err):
            log.warning("backend %s is late: %s (counted down after %d late probes in a row)",
                        state.name, err.message, LATE_PROBES)
            return LATE
        if state.up:
            log.warning("marked down: %s", err.message)  # the message names the backend
        state.up, state.last_error = False, err.message
        return None
    if not state.up:
        log.warning("backend %s is up again", state.name)
    state.up, state.last_error = True, None
    return doc


def context_lengths(doc: object) -> dict[str, int]:
    """Model id -> context length a request may use: vLLM's `max_model_len`; llama.cpp's
    `meta.n_ctx`, which is already per slot (the -c context divided by --parallel)."""
    lens = {}
    for m in doc.get("data", []) if isinstance(doc, dict) else []:
        if not isinstance(m, dict):
            continue
        n = m.get("max_model_len")
        meta = m.get("meta")
        if not isinstance(n, int) and isinstance(meta, dict):
            n = meta.get("n_ctx")
        if isinstance(n, int) and not isinstance(n, bool) and n > 0:
            lens[str(m.get("id"))] = n
    return lens


def _detect(state: BackendState, doc: object) -> None:
    kind = backend_kind.detect(doc)
    if kind is None or kind == state.detected_kind:
        return
    state.detected_kind = kind
    state.cfg = msgspec.structs.replace(state.cfg, kind=kind)
    log.info("backend %s: no kind configured, detected %s from /v1/models", state.name, kind)


# The gauge in each server's /metrics that counts the requests it is running right now.
_RUNNING: dict[str | None, str] = {"vllm": "vllm:num_requests_running", "llamacpp": "llamacpp:requests_processing"}
HELD_REFRESH_S = 1.0  # how often the running count is re-read while the gateway holds a slot there


def reads_running(state: BackendState) -> bool:
    """Whether the backend tells its own running count (vLLM, llama.cpp)."""
    return state.cfg.kind in _RUNNING


async def leak_check(state: BackendState, client: UpstreamClient, timeout_s: float = 2.0) -> None:
    """Compare our slot count with the backend's own count of running requests (vLLM's
    num_requests_running, llama.cpp's requests_processing). More running there than we hold
    means generations nobody is waiting for (or another client of the backend); it is reported
    on /admin/requests and /metrics, never acted on blindly."""
    try:
        text = await client.get_text("/metrics", timeout_s=timeout_s)
    except GatewayError:
        state.upstream_running = state.upstream_running_at = None
        return
    running = 0.0
    found = False
    gauge = _RUNNING[state.cfg.kind]
    for line in text.splitlines():
        if line.startswith(gauge):
            try:
                running += float(line.rsplit(" ", 1)[1])
                found = True
            except ValueError:
                pass
    state.upstream_running = int(running) if found else None
    state.upstream_running_at = time.monotonic() if found else None
