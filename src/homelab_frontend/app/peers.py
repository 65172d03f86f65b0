"""Peer boxes (docs/several-boxes.md): another homelab-frontend as a backend (`kind: peer`).

A peer's `/llm/v1/models` (polled by the health probe, every `health_interval_s`) says its models,
their state and its own backends with their slots (upstream/peer.py). From that report this
gateway keeps one backend per backend of the peer's, named `<peer>/<its backend>` (`box1/gpu0`),
with the peer's slots as its slots: a request for a peer's model waits in this gateway's queue for
one of those, so the peer is never sent more than that backend of its can run, and nothing waits
twice (the peer is told which of its backends the slot is of, with every request of that backend's
client here, `x-hlf-peer-backend`, and takes it: no choice of its own).
Those backends appear, resize and go as the peer's report does, without a restart; the router is
remade when the set of the peer's models or backends changes.

What is not exact: a peer's own local clients compete for the same slots, which this gateway
learns of only at its next poll (they then wait at the peer); a backend of the peer that serves
several of its models is one backend here too, with the peer's slots.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

import msgspec

from .. import config as cfgmod
from ..admission.slots import SlotPool
from ..policy.auth import BACKEND_HEADER
from ..policy.routing import BackendState, PeerLink
from ..upstream.client import UpstreamClient
from ..upstream.peer import PeerModel, parse_models

log = logging.getLogger("homelab_frontend")

__all__ = ["child_name", "note_poll", "reconcile"]


def child_name(peer: str, backend: str) -> str:
    return f"{peer}/{backend}"


def reconcile(peer: BackendState, doc: object, backends: dict[str, BackendState],
              clients: dict[str, UpstreamClient], drop: Callable[[str], bool]) -> bool:
    """Apply a peer's models list to its backends here. -> whether the routes must be remade
    (a model or a backend came or went). `drop(name)`: forget a child once idle (True: gone)."""
    models = parse_models(doc) if peer.up else {}
    if peer.peer is None:
        peer.peer = PeerLink(peer.name)
    before = set(peer.peer.models)
    peer.peer.models = models
    changed = before != set(models)
    reported: dict[str, list[PeerModel]] = {}
    slots: dict[str, int] = {}
    for m in models.values():
        for b in m.backends:
            reported.setdefault(b.name, []).append(m)
            slots[b.name] = b.slots
    cfg = peer.cfg
    for bname, served in reported.items():
        name = child_name(peer.name, bname)
        child = backends.get(name)
        child_cfg = msgspec.structs.replace(cfg, slots=slots[bname])
        if child is None:
            pool = SlotPool(name, slots[bname], cfg.queue.depth, cfg.queue.timeout_s)
            child = backends[name] = BackendState(name, child_cfg, pool, peer=PeerLink(peer.name, bname))
            clients[name] = UpstreamClient(name, cfg, {BACKEND_HEADER: bname})  # its requests: this backend
            log.info("peer %s: backend %s (%d slots)", peer.name, name, slots[bname])
            changed = True
        else:
            child.cfg = child_cfg
            if child.pool.slots != slots[bname]:
                child.pool.resize(slots[bname], cfg.queue.depth, cfg.queue.timeout_s)
        assert child.peer is not None
        if set(child.peer.models) != {m.name for m in served}:
            changed = True  # a model moved between the peer's backends: its route changes
        child.peer.models = {m.name: m for m in served}
        states = [b.state for m in served for b in m.backends if b.name == bname]
        child.up = any(s not in ("down", "failed") for s in states)
        child.last_error = None if child.up else f"backend {name!r} is down: its peer {peer.name!r} reports it {states[0]}"
        child.model_lens = {m.name: m.context_length for m in served if m.context_length}
        assert isinstance(child.pool, SlotPool)  # a peer's backend's slots are counted here (made above)
        child.pool.queue.set_loading(child.loading)
        child.passive.probed(child.up)
    for name, child in list(backends.items()):
        link = child.peer
        if link is None or link.parent != peer.name or not link.backend or link.backend in reported:
            continue
        child.up, child.last_error = False, f"backend {name!r} is gone: its peer {peer.name!r} no longer reports it"
        link.models = {}
        if drop(name):
            changed = True
    return changed


def note_poll(peer: BackendState) -> None:
    """The peer's probe just ended: when it was polled, and, if it answered, answered."""
    if peer.peer is None:
        peer.peer = PeerLink(peer.name)
    peer.peer.polled_at = time.monotonic()
    if peer.up:
        peer.peer.answered_at = peer.peer.polled_at


def mark_down(peer: BackendState, backends: dict[str, BackendState]) -> None:
    """The peer did not answer its probe: its backends here are down with it (requests fail
    over to another box that serves the model, or get a 503 naming the peer), and so are the
    requests sent there that have no answer's headers yet: a black-holed box (a link that
    accepts and says nothing) would keep them for their whole first_token_s; they fail over
    (cause `box_down`). A stream already answering is left to its idle_s: a box too busy to
    answer one poll may still be streaming."""
    for child in backends.values():
        if child.peer is not None and child.peer.parent == peer.name and child.peer.backend:
            child.up = False
            child.last_error = f"backend {child.name!r} is down with its peer: {peer.last_error}"
            child.peer.mark_down()  # its requests still waiting for their answer's headers fail over


def configured(cfg: cfgmod.Backend) -> bool:
    return cfg.kind == "peer"
