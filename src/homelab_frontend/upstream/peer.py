"""A peer box's account of itself, read off its `/llm/v1/models` (pure).

A peer is another homelab-frontend. Its models list says, per model, in the `homelab` block
(surfaces/openai/models.py): the model's state, context length and capabilities, and the peer's
own backends serving it, each with its slots, what is in use and queued there, its state for the
model and, for a managed one, how long a start takes (`load_eta_s`). That block is also how a
peer is told from any other OpenAI-compatible server (upstream/backend_kind.py).

`parse_models` turns it into `PeerModel`s; anything malformed in one entry drops that entry (a
peer is untrusted input like any upstream), never the whole list.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["HEADER_BACKEND", "HEADER_PERSON", "PeerBackend", "PeerModel", "is_peer_list", "parse_models"]

# What a front sends a peer with its request (believed only from a key marked `peer` there):
HEADER_PERSON = "x-hlf-on-behalf-of"  # the name of the key the front admitted
HEADER_BACKEND = "x-hlf-peer-backend"  # the peer's backend whose slot the front holds for it

_STATES = ("loaded", "loading", "unloading", "sleeping", "stopped", "failed", "down")
_MAX_MODELS = 4096


@dataclass(frozen=True)
class PeerBackend:
    name: str
    state: str
    slots: int
    in_use: int = 0
    queued: int = 0
    load_eta_s: float | None = None


@dataclass(frozen=True)
class PeerModel:
    name: str
    state: str
    context_length: int | None
    capabilities: tuple[str, ...]
    backends: tuple[PeerBackend, ...]


def is_peer_list(doc: object) -> bool:
    """Whether a `/v1/models` answer is a homelab-frontend's (its entries carry a `homelab` block)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("data"), list):
        return False
    return any(isinstance(m, dict) and isinstance(m.get("homelab"), dict) and m.get("owned_by") == "homelab-frontend"
               for m in doc["data"])


def _pos_int(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def _count(v: object) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else 0


def _state(v: object) -> str:
    return v if isinstance(v, str) and v in _STATES else "down"


def _backend(raw: object) -> PeerBackend | None:
    if not isinstance(raw, dict) or not isinstance(raw.get("name"), str) or not raw["name"]:
        return None
    slots = _pos_int(raw.get("slots"))
    if slots is None or slots > 100_000:
        return None
    eta = raw.get("load_eta_s")
    eta = float(eta) if isinstance(eta, (int, float)) and not isinstance(eta, bool) and 0 <= eta < 1e6 else None
    return PeerBackend(raw["name"], _state(raw.get("state")), slots, _count(raw.get("in_use")),
                       _count(raw.get("queued")), eta)


def _model(raw: object) -> PeerModel | None:
    if not isinstance(raw, dict) or not isinstance(raw.get("id"), str) or not raw["id"]:
        return None
    home = raw.get("homelab")
    if not isinstance(home, dict):
        return None
    caps = raw.get("capabilities")
    caps = tuple(c for c in caps if isinstance(c, str) and c) if isinstance(caps, list) else ()
    listed = home.get("backends")
    backends = tuple(b for b in map(_backend, listed if isinstance(listed, list) else []) if b is not None)
    ctx = _pos_int(raw.get("context_length")) or _pos_int(raw.get("max_model_len"))
    return PeerModel(raw["id"], _state(home.get("state")), ctx, caps, backends)


def parse_models(doc: object) -> dict[str, PeerModel]:
    """The peer's models by name (those with a readable `homelab` block)."""
    out: dict[str, PeerModel] = {}
    data = doc.get("data") if isinstance(doc, dict) else None
    for raw in (data if isinstance(data, list) else [])[:_MAX_MODELS]:
        m = _model(raw)
        if m is not None and m.backends:
            out[m.name] = m
    return out
