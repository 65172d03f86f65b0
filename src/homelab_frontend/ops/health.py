"""Backend health: one cheap probe (GET /v1/models, never a generation) and, for vLLM, the leak
check against its own count of running sequences."""

from __future__ import annotations

import logging

from ..errors import GatewayError
from ..routing import BackendState
from ..upstream import UpstreamClient

log = logging.getLogger("homelab_frontend")


async def probe(state: BackendState, client: UpstreamClient) -> None:
    """Mark the backend up or down, and learn its models' context lengths on the way."""
    try:
        doc = await client.get_json("/models", timeout_s=min(5.0, state.cfg.health_interval_s))
        lens = {}
        for m in doc.get("data", []) if isinstance(doc, dict) else []:
            if isinstance(m, dict) and isinstance(m.get("max_model_len"), int):
                lens[str(m.get("id"))] = m["max_model_len"]
        state.model_lens = lens
        if state.cfg.kind == "vllm":
            await leak_check(state, client)
        if not state.up:
            log.warning("backend %s is up again", state.name)
        state.up, state.last_error = True, None
    except GatewayError as err:
        if state.up:
            log.warning("backend %s is down: %s", state.name, err.message)
        state.up, state.last_error = False, err.message


async def leak_check(state: BackendState, client: UpstreamClient) -> None:
    """Compare our slot count with vLLM's own count of running sequences. More running there
    than we hold means generations nobody is waiting for (or another client of the backend);
    it is reported on /admin/requests and /metrics, never acted on blindly."""
    try:
        text = await client.get_text("/metrics", timeout_s=2.0)
    except GatewayError:
        state.upstream_running = None
        return
    running = 0.0
    found = False
    for line in text.splitlines():
        if line.startswith("vllm:num_requests_running"):
            try:
                running += float(line.rsplit(" ", 1)[1])
                found = True
            except ValueError:
                pass
    state.upstream_running = int(running) if found else None
