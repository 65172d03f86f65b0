"""`GET /models` entries: the OpenAI shape whole, what the model is beside it."""

from __future__ import annotations

import openai.types

from homelab_frontend.surfaces.model_card import BackendCard, Card
from homelab_frontend.surfaces.openai.models import openai_entry
from homelab_frontend.upstream.capabilities import Facts


def _card(caps, state="loaded", ctx=8192):
    b = BackendCard("gpu0", "vllm", state, 8, 2, 1)
    return Card("r1", "reasoning", ctx, caps, state, (b,), Facts(caps))


def test_the_openai_sdk_parses_the_entry_and_keeps_the_extras():
    entry = openai_entry(_card(("completion", "tools", "thinking")), 1700000000)
    model = openai.types.Model.model_validate(entry)
    assert model.id == "r1" and model.object == "model" and model.owned_by == "homelab-frontend"
    assert entry["max_model_len"] == entry["context_length"] == entry["meta"]["n_ctx"] == 8192
    assert entry["capabilities"] == ["completion", "tools", "thinking"]
    assert entry["supports_reasoning"] and entry["supports_function_calling"] and not entry["supports_vision"]
    assert entry["mode"] == "chat"
    assert entry["status"] == {"value": "loaded"} and entry["loaded"] is True and entry["state"] == "loaded"
    assert entry["homelab"]["backends"] == [{"name": "gpu0", "kind": "vllm", "state": "loaded", "slots": 8,
                                             "in_use": 2, "queued": 1}]
    assert entry["homelab"]["slots"] == 8 and entry["homelab"]["model"] == "reasoning"


def test_states_in_llama_cpp_router_words():
    assert openai_entry(_card(("completion",), "loading"), 0)["status"] == {"value": "loading"}
    assert openai_entry(_card(("completion",), "stopped"), 0)["status"] == {"value": "unloaded"}
    assert openai_entry(_card(("completion",), "down"), 0)["status"] == {"value": "unloaded", "failed": True}
    assert openai_entry(_card(("completion",), "down"), 0)["loaded"] is False


def test_an_unknown_context_is_left_out_and_embedding_models_say_so():
    entry = openai_entry(_card(("embedding",), ctx=None), 0)
    assert not {"max_model_len", "context_length", "meta"} & entry.keys()
    assert entry["mode"] == "embedding"


def test_media_models_have_litellms_modes_and_their_paths():
    want = {("rerank",): "rerank", ("transcription",): "audio_transcription", ("speech",): "audio_speech",
            ("image",): "image_generation", ("completion", "speech"): "chat"}
    for caps, mode in want.items():
        entry = openai_entry(_card(caps), 1700000000)
        openai.types.Model.model_validate(entry)
        assert entry["mode"] == mode, caps
    rr = openai_entry(_card(("rerank",)), 1)
    assert rr["homelab"]["endpoints"] == ["/v1/rerank", "/v2/rerank", "/v1/score"]
    assert not rr["supports_audio_input"] and not rr["supports_audio_output"]
    stt = openai_entry(_card(("transcription",)), 1)
    assert stt["supports_audio_input"] and not stt["supports_audio_output"]
    assert "endpoints" not in openai_entry(_card(("completion",)), 1)["homelab"]
