"""What a media model is, in every models list, through real gateways in front of the media stubs
(stub/: whisper.cpp, speaches' speech, sd.cpp's images, llama.cpp and vLLM rerankers): rerank,
transcription, speech and image models named as such from the config's `capabilities` and the
backend's kind (whisper.cpp), never claiming `completion` (the llama.cpp reranker's /props says
it: the card must not pass it on); LiteLLM's `mode`, Ollama's `/api/tags` and `/api/show`,
Gemini's list; and the same cards at a front whose box serves them (docs/several-boxes.md)."""

from __future__ import annotations

import openai
import pytest

from gwproc import Gateway, config_for
from stubproc import start_stub, wait_for

FRONT_KEY = "sk-front-media"
ENV = {"HLF_PEER_KEY": FRONT_KEY, "ADMIN_KEY": "sk-admin-media"}
HA = {"authorization": "Bearer sk-admin-media"}
MODES = {"rr-v": "rerank", "rr-l": "rerank", "whisper-1": "audio_transcription", "tts": "audio_speech",
         "sd": "image_generation", "chat": "chat"}


@pytest.fixture(scope="module")
def stubs():
    with start_stub("whispercpp") as whisper, start_stub("speaches") as speaches, \
            start_stub("sdcpp") as sd, start_stub("vllm", "--model", "BAAI/bge-reranker-base") as vllm, \
            start_stub("llamacpp", "--model", "bge-reranker-v2-m3-Q8_0.gguf") as llama:
        yield {"whisper": whisper, "speaches": speaches, "sd": sd, "vllm": vllm, "llama": llama}


def box_config(s: dict) -> dict:
    return config_for(
        {"w": {"url": s["whisper"].url, "kind": "whispercpp", "slots": 1, "health_interval_s": 0.5},
         "s": {"url": s["speaches"].base, "kind": "openai", "slots": 1, "health_interval_s": 0.5},
         "sd": {"url": s["sd"].base, "kind": "openai", "slots": 1, "health_interval_s": 0.5},
         "v": {"url": s["vllm"].base, "kind": "vllm", "slots": 1, "health_interval_s": 0.5},
         "l": {"url": s["llama"].base, "kind": "llamacpp", "slots": 1, "health_interval_s": 0.5}},
        {"whisper-1": {"backend": "w", "upstream_model": "ggml-tiny.en"},  # no capabilities: its kind's
         "tts": {"backend": "s", "upstream_model": "speaches-ai/Kokoro-82M-v1.0-ONNX", "capabilities": ["speech"]},
         "sd": {"backend": "sd", "upstream_model": "sd-turbo", "capabilities": ["image"]},
         "rr-v": {"backend": "v", "upstream_model": "BAAI/bge-reranker-base", "capabilities": ["rerank"]},
         "rr-l": {"backend": "l", "upstream_model": "bge-reranker-v2-m3-Q8_0.gguf", "capabilities": ["rerank"]},
         "chat": {"backend": "l", "upstream_model": "bge-reranker-v2-m3-Q8_0.gguf"}},  # told by /props
        auth={"keys": [{"name": "front", "key_env": "HLF_PEER_KEY", "peer": True}], "admin_key_env": "ADMIN_KEY"},
    )


@pytest.fixture(scope="module")
def box(stubs):
    with Gateway(box_config(stubs), env=ENV) as g:
        wait_for(lambda: all(b["up"] for b in g.admin(HA)["backends"].values()), 15)
        yield g


@pytest.fixture(scope="module")
def front(box):
    cfg = {"backends": {"box": {"url": box.base, "api_key_env": "HLF_PEER_KEY", "health_interval_s": 0.3}},
           "auth": {"admin_key_env": "ADMIN_KEY"}}
    with Gateway(cfg, env=ENV) as g:
        wait_for(lambda: set(MODES) <= set(_openai(g)), 15, 0.05)
        yield g


def _openai(gw) -> dict[str, dict]:
    status, doc = gw.get("/llm/v1/models", {"authorization": f"Bearer {FRONT_KEY}"})
    assert status == 200, doc
    return {m["id"]: m for m in doc["data"]}


def _check_openai_list(gw):
    listed = {m.id for m in openai.OpenAI(base_url=gw.base, api_key=FRONT_KEY).models.list()}
    assert set(MODES) <= listed  # the strict SDK parses the list with the media entries in it
    models = _openai(gw)
    assert {n: models[n]["mode"] for n in MODES} == MODES
    assert models["whisper-1"]["capabilities"] == ["transcription"]  # from whisper.cpp's kind
    assert models["rr-l"]["capabilities"] == ["rerank"]  # llama.cpp's /props says completion: not passed on
    assert models["chat"]["capabilities"][0] == "completion"  # the same server, not marked: what it tells
    assert models["tts"]["capabilities"] == ["speech"] and models["sd"]["capabilities"] == ["image"]
    assert models["whisper-1"]["supports_audio_input"] is True and models["whisper-1"]["supports_audio_output"] is False
    assert models["tts"]["supports_audio_output"] is True and models["tts"]["supports_audio_input"] is False
    for name in ("rr-v", "rr-l", "whisper-1", "tts", "sd"):
        assert "completion" not in models[name]["capabilities"], name
        assert models[name]["supports_function_calling"] is False
        assert models[name]["state"] == "loaded"
    assert models["rr-v"]["homelab"]["endpoints"] == ["/v1/rerank", "/v2/rerank", "/v1/score"]
    assert models["whisper-1"]["homelab"]["endpoints"] == ["/v1/audio/transcriptions", "/v1/audio/translations"]
    assert "endpoints" not in models["chat"]["homelab"]


def _check_ollama_and_gemini(gw):
    h = {"authorization": f"Bearer {FRONT_KEY}"}
    status, tags = gw.get("/api/tags", h)
    assert status == 200
    caps = {m["name"]: m["capabilities"] for m in tags["models"]}
    assert caps["rr-l:latest"] == ["rerank"] and caps["whisper-1:latest"] == ["transcription"]
    assert caps["tts:latest"] == ["speech"] and caps["sd:latest"] == ["image"]
    for name in ("rr-l", "whisper-1", "tts", "sd"):
        status, show = gw.post("/api/show", {"model": name}, h)
        assert status == 200 and show["capabilities"] == caps[f"{name}:latest"], show
        assert "completion" not in show["capabilities"]
    status, show = gw.post("/api/show", {"model": "chat"}, h)
    assert status == 200 and "completion" in show["capabilities"]
    status, doc = gw.get("/llm/v1beta/models", {"x-goog-api-key": FRONT_KEY})
    assert status == 200, doc
    methods = {m["name"]: m["supportedGenerationMethods"] for m in doc["models"]}
    assert methods["models/rr-v"] == methods["models/tts"] == methods["models/sd"] == []
    assert "generateContent" in methods["models/chat"]


def test_a_gateway_names_its_media_models_as_such(box):
    _check_openai_list(box)
    _check_ollama_and_gemini(box)


def test_a_front_names_its_boxes_media_models_as_such(front):
    _check_openai_list(front)
    _check_ollama_and_gemini(front)
    assert [b["name"] for b in _openai(front)["tts"]["homelab"]["backends"]] == ["box/s"]
