"""The flavours of the non-chat servers: whisper.cpp's server, speaches, kokoro-fastapi and
stable-diffusion.cpp's sd-server. Each owns its error shape and its model list; their endpoints
live in audio.py and images.py.
"""

from __future__ import annotations

from typing import Any

from .flavour import Flavour, Rejection


class WhisperCpp(Flavour):
    """whisper.cpp's examples/server: errors `{"error": "text"}`, no /v1/models at all, one model
    per server (a request's `model` is not read), GET /health `{"status":"ok"}` (503
    `{"status":"loading model"}` meanwhile)."""

    name = "whispercpp"
    default_model = "ggml-tiny.en"

    def error(self, status: int, message: str, *, param: str | None = None) -> Rejection:
        return Rejection(status, {"error": message})

    def unauthorized(self) -> Rejection:
        # whisper.cpp's server has no API key; the stub refuses as a proxy in front of it would
        return self.error(401, "Unauthorized")

    def model_not_found(self, model: str, served: tuple[str, ...] = ()) -> Rejection:
        return self.error(404, f"model '{model}' not found")

    def resolve_model(self, requested: Any, served: tuple[str, ...]) -> str | Rejection:
        return served[0]


class _FastApi(Flavour):
    """FastAPI servers: an HTTPException's detail under `detail`."""

    def error(self, status: int, message: str, *, param: str | None = None) -> Rejection:
        return Rejection(status, {"detail": message})

    def unauthorized(self) -> Rejection:
        return self.error(401, "Unauthorized")

    def model_not_found(self, model: str, served: tuple[str, ...] = ()) -> Rejection:
        return self.error(404, f"Model '{model}' not found")

    def models_list(self, models: list[str], max_model_len: int, created: int) -> dict:
        return {"data": [{"id": m, "created": 0, "object": "model", "owned_by": self.owner} for m in models],
                "object": "list"}

    owner = ""


class Speaches(_FastApi):
    """speaches (src/speaches/routers: stt.py, speech.py, models.py): speech to text with
    faster-whisper models and text to speech with Kokoro/Piper ones, both named by model id."""

    name = "speaches"
    default_model = "Systran/faster-whisper-tiny.en"
    default_models = ("Systran/faster-whisper-tiny.en", "speaches-ai/Kokoro-82M-v1.0-ONNX")
    owner = "Systran"


class Kokoro(_FastApi):
    """kokoro-fastapi (api/src/routers/openai_compatible.py): text to speech only, its models
    `tts-1`, `tts-1-hd`, `kokoro`, `gpt-4o-mini-tts`; an unsupported model is a 400 whose detail
    is an object."""

    name = "kokoro"
    default_model = "kokoro"
    default_models = ("tts-1", "tts-1-hd", "kokoro", "gpt-4o-mini-tts")
    owner = "kokoro"

    def model_not_found(self, model: str, served: tuple[str, ...] = ()) -> Rejection:
        return Rejection(400, {"detail": {"error": "invalid_model", "message": f"Unsupported model: {model}",
                                          "type": "invalid_request_error"}})

    def models_list(self, models: list[str], max_model_len: int, created: int) -> dict:
        return {"object": "list", "data": [{"id": m, "object": "model", "created": 1686935002, "owned_by": "kokoro"}
                                           for m in models]}


class SdCpp(Flavour):
    """stable-diffusion.cpp's examples/server (routes_openai.cpp): errors `{"error": "text"}`,
    /v1/models lists the one loaded model as `sd-cpp-local`; a request's `model` is not read."""

    name = "sdcpp"
    default_model = "sd-cpp-local"

    def error(self, status: int, message: str, *, param: str | None = None) -> Rejection:
        return Rejection(status, {"error": message})

    def model_not_found(self, model: str, served: tuple[str, ...] = ()) -> Rejection:
        return self.error(404, f"model '{model}' not found")

    def resolve_model(self, requested: Any, served: tuple[str, ...]) -> str | Rejection:
        return served[0]

    def models_list(self, models: list[str], max_model_len: int, created: int) -> dict:
        return {"object": "list", "data": [{"id": m, "object": "model", "owned_by": "local"} for m in models]}
