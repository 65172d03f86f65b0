"""One entry of `GET /llm/v1/models` from a model's card (surfaces/model_card.py): pure.

The OpenAI shape (`id`, `object`, `created`, `owned_by`) stays whole for strict parsers; what a
model is rides beside it in the fields other servers made the ones clients read:
- context: `max_model_len` (vLLM's), `context_length` (llama-swap, LM Studio, OpenRouter; what
  opencode #40908 and Bifrost #969 ask for) and `meta.n_ctx` (llama.cpp's own list, which
  llama-swap copied in #984 for the tools that read it there);
- capabilities: `capabilities` in Ollama's vocabulary (completion, tools, thinking, vision,
  embedding, insert, audio), and LiteLLM's model_info booleans (`supports_function_calling`,
  `supports_reasoning`, `supports_vision`, `supports_audio_input`, `supports_audio_output`) with
  its `mode` (chat, embedding, completion, and a media model's: rerank, audio_transcription,
  audio_speech, image_generation, LiteLLM's words for them); `homelab.endpoints` names the
  gateway's paths a media model answers on (rerank's include /v1/score);
- state: `status.value` as llama.cpp's router mode writes it (loaded, loading, unloaded, sleeping),
  `loaded` (a boolean, as Unsloth Studio's list), and `state` in the gateway's own words;
- `homelab`: the gateway's own account (state, slots, the backends serving it with theirs), which a
  front gateway reads of a peer (its presence is how a front tells a peer from another server).
"""

from __future__ import annotations

from ..model_card import Card

__all__ = ["openai_entry"]

_STATUS = {"loaded": "loaded", "loading": "loading", "sleeping": "sleeping", "unloading": "unloading"}


# A media model's LiteLLM mode and the paths it answers on (surfaces/media/), in this order: a
# model configured with two media kinds is listed as the first
_MEDIA = {
    "rerank": ("rerank", ["/v1/rerank", "/v2/rerank", "/v1/score"]),
    "transcription": ("audio_transcription", ["/v1/audio/transcriptions", "/v1/audio/translations"]),
    "speech": ("audio_speech", ["/v1/audio/speech"]),
    "image": ("image_generation", ["/v1/images/generations", "/v1/images/edits"]),
}


def _mode(caps: tuple[str, ...]) -> str:
    if "completion" not in caps:
        for cap, (mode, _) in _MEDIA.items():
            if cap in caps:
                return mode
    if "embedding" in caps and "completion" not in caps:
        return "embedding"
    if "completion" not in caps and "insert" in caps:
        return "completion"
    return "chat"


def openai_entry(card: Card, created: int) -> dict:
    caps = card.capabilities
    entry: dict = {"id": card.name, "object": "model", "created": created, "owned_by": "homelab-frontend"}
    if card.context_length:
        entry["max_model_len"] = card.context_length
        entry["context_length"] = card.context_length
        entry["meta"] = {"n_ctx": card.context_length}
    entry["capabilities"] = list(caps)
    entry["mode"] = _mode(caps)
    entry["supports_function_calling"] = "tools" in caps
    entry["supports_reasoning"] = "thinking" in caps
    entry["supports_vision"] = "vision" in caps
    entry["supports_audio_input"] = "audio" in caps or "transcription" in caps
    entry["supports_audio_output"] = "speech" in caps
    entry["state"] = card.state
    entry["loaded"] = card.loaded
    entry["status"] = {"value": _STATUS.get(card.state, "unloaded")}
    if card.state in ("failed", "down"):
        entry["status"]["failed"] = True
    entry["homelab"] = {
        "model": card.model,
        "state": card.state,
        "slots": card.slots,
        "in_use": sum(b.in_use for b in card.backends),
        "queued": sum(b.queued for b in card.backends),
        "backends": [{"name": b.name, "kind": b.kind, "state": b.state, "slots": b.slots,
                      "in_use": b.in_use, "queued": b.queued,
                      **({"load_eta_s": b.load_eta_s} if b.load_eta_s is not None else {})}
                     for b in card.backends],
    }
    endpoints = [path for cap, (_, paths) in _MEDIA.items() if cap in caps for path in paths]
    if endpoints:
        entry["homelab"]["endpoints"] = endpoints
    return entry
