"""The stub's aiohttp application: routes, the ops/test endpoints, and the server lifecycle."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import Any

import msgspec
from aiohttp import web

from .chat import FLAVOUR, STATE, authorized, handle_chat, json_response
from .completions import handle_completions, handle_infill, handle_native_completion
from .flavour import Flavour, Rejection, embedding_vector
from .audio import register_stt, register_tts, register_whispercpp
from .images import register_images
from .llamacpp import KEEP_ALIVE, LlamaCpp
from .media_flavours import Kokoro, SdCpp, Speaches, WhisperCpp
from .ollama import Ollama
from .prefix_cache import PrefixCache
from .rerank import llama_rerank, vllm_rerank, vllm_score
from .script import count_text_tokens, prompt_token_ids, text_token_ids
from .state import EventLog, StubConfig, StubState
from .vllm import Vllm

FLAVOURS: dict[str, type[Flavour]] = {"vllm": Vllm, "ollama": Ollama, "llamacpp": LlamaCpp,
                                      "whispercpp": WhisperCpp, "speaches": Speaches, "kokoro": Kokoro,
                                      "sdcpp": SdCpp}
# The servers of speech and images: none of the chat routes, each its own (audio.py, images.py).
MEDIA_FLAVOURS = ("whispercpp", "speaches", "kokoro", "sdcpp")
CHAT_PATH = "/v1/chat/completions"


def make_flavour(name: str) -> Flavour:
    return FLAVOURS[name]()


def _json(payload: Any, status: int = 200) -> web.Response:
    return web.Response(status=status, body=msgspec.json.encode(payload), content_type="application/json")


async def _read_json(request: web.Request) -> Any:
    try:
        return msgspec.json.decode(await request.read())
    except msgspec.DecodeError:
        return None


@web.middleware
async def _auth(request: web.Request, handler: Any) -> web.StreamResponse:
    # The chat handler checks for itself, after recording the request for the tests.
    state = request.app[STATE]
    path = request.path
    if path.startswith("/v1") and path != CHAT_PATH and not authorized(request, state.config.api_key):
        return json_response(request.app[FLAVOUR].unauthorized())
    return await handler(request)


async def _models(request: web.Request) -> web.Response:
    state = request.app[STATE]
    config = state.config
    return _json(request.app[FLAVOUR].models_list(list(config.models), config.max_model_len, int(time.time())))


async def _embeddings(request: web.Request) -> web.Response:
    flavour, config = request.app[FLAVOUR], request.app[STATE].config
    body = await _read_json(request)
    if not isinstance(body, dict):
        return json_response(flavour.error(400, "The request body must be a JSON object"))
    model = flavour.resolve_model(body.get("model"), config.models)
    if isinstance(model, Rejection):
        return json_response(model)
    raw = body.get("input")
    inputs = [raw] if isinstance(raw, str) else raw if isinstance(raw, list) else None
    if not inputs:
        return json_response(flavour.error(400, "invalid input"))
    texts = [item if isinstance(item, str) else msgspec.json.encode(item).decode() for item in inputs]
    vectors = [embedding_vector(text) for text in texts]
    tokens = sum(count_text_tokens(text) for text in texts)
    return _json(flavour.embeddings(model, vectors, tokens, int(time.time())))


async def _tokenize(request: web.Request) -> web.Response:
    flavour, config = request.app[FLAVOUR], request.app[STATE].config
    body = await _read_json(request)
    if not isinstance(body, dict):
        return json_response(flavour.error(400, "The request body must be a JSON object"))
    model = flavour.resolve_model(body.get("model"), config.models)
    if isinstance(model, Rejection):
        return json_response(model)
    if isinstance(body.get("messages"), list):
        ids = prompt_token_ids(body["messages"])
    else:
        ids = text_token_ids(p if isinstance(p := body.get("prompt"), str) else "")
    return _json({"count": len(ids), "max_model_len": config.max_model_len, "tokens": ids, "token_strs": None})


async def _metrics(request: web.Request) -> web.Response:
    state = request.app[STATE]
    # vLLM labels its metrics with the first served model name only.
    label = f'engine="0",model_name="{state.config.models[0]}"'
    text = (
        "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
        "# TYPE vllm:num_requests_running gauge\n"
        f"vllm:num_requests_running{{{label}}} {float(state.stats.in_flight)}\n"
        "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
        "# TYPE vllm:num_requests_waiting gauge\n"
        f"vllm:num_requests_waiting{{{label}}} 0.0\n"
    )
    return web.Response(text=text, content_type="text/plain", charset="utf-8")


async def _llama_metrics(request: web.Request) -> web.Response:
    running = request.app[STATE].stats.in_flight
    text = (
        "# HELP llamacpp:requests_processing Number of requests processing.\n"
        "# TYPE llamacpp:requests_processing gauge\n"
        f"llamacpp:requests_processing {running}\n"
        "# HELP llamacpp:requests_deferred Number of requests deferred.\n"
        "# TYPE llamacpp:requests_deferred gauge\n"
        "llamacpp:requests_deferred 0\n"
    )
    return web.Response(text=text, content_type="text/plain", charset="utf-8")


async def _llama_slots(request: web.Request) -> web.Response:
    running = request.app[STATE].stats.in_flight
    return _json([{"id": i, "n_ctx": request.app[STATE].config.max_model_len, "is_processing": i < running}
                  for i in range(max(2, running))])


async def _llama_apply_template(request: web.Request) -> web.Response:
    """The stub's pretend template renders one word per prompt token, so that /tokenize of it
    counts exactly the usage.prompt_tokens of the same messages (as on the real server)."""
    body = await _read_json(request)
    if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
        return json_response(request.app[FLAVOUR].error(400, "'messages' is required"))
    return _json({"prompt": " ".join(f"<{i}>" for i in prompt_token_ids(body["messages"]))})


async def _llama_tokenize(request: web.Request) -> web.Response:
    body = await _read_json(request)
    content = body.get("content") if isinstance(body, dict) else None
    if not isinstance(content, str):
        return json_response(request.app[FLAVOUR].error(400, "'content' is required"))
    return _json({"tokens": text_token_ids(content)})


async def _llama_headers(request: web.Request, response: web.StreamResponse) -> None:
    response.headers["Keep-Alive"] = KEEP_ALIVE


# llama-server closes the connection a moment after a streamed answer, though it announced
# keep-alive: a request sent on it in that moment gets no answer at all. One whose answer had
# already begun by then is not cut (the real server closes between requests, never inside one).
LLAMA_CLOSE_AFTER_STREAM_S = 0.05
_answering: dict[int, web.Request] = {}  # id(transport) -> the request being answered on it


def _close_between_requests(transport: asyncio.BaseTransport) -> None:
    current = _answering.get(id(transport))
    if current is not None and current.transport is transport and current.writer.output_size:
        return
    transport.close()


@web.middleware
async def _llama_close_after_stream(request: web.Request, handler: Any) -> web.StreamResponse:
    transport = request.transport
    key = id(transport)
    _answering[key] = request
    try:
        resp = await handler(request)
    finally:
        if _answering.get(key) is request:
            del _answering[key]
    if resp.headers.get("Content-Type", "").startswith("text/event-stream") and transport is not None:
        asyncio.get_running_loop().call_later(LLAMA_CLOSE_AFTER_STREAM_S, _close_between_requests, transport)
    return resp


async def _health(request: web.Request) -> web.Response:
    return web.Response(status=200)


_LOADER = web.AppKey("stub_loader", asyncio.Task)

# llama-server while it loads its model: every endpoint answers this (its /health too).
_LOADING = {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}


@web.middleware
async def _llama_loading(request: web.Request, handler: Any) -> web.StreamResponse:
    if request.app[STATE].loading and not request.path.startswith("/stub/"):
        return _json(_LOADING, status=503)
    return await handler(request)


@web.middleware
async def _vllm_sleeping(request: web.Request, handler: Any) -> web.StreamResponse:
    # vLLM's protected endpoints while asleep (the others, /v1/models among them, still answer)
    if request.app[STATE].sleeping and request.path in (CHAT_PATH, "/v1/embeddings", "/v1/completions"):
        return _json({"error": {"message": "The model is sleeping. Wake it up first.",
                                "type": "ServiceUnavailableError", "param": None, "code": 503}}, status=503)
    return await handler(request)


async def _sleep(request: web.Request) -> web.Response:
    """vLLM (VLLM_SERVER_DEV_MODE=1): returns once the GPU memory is freed; an empty 200."""
    state = request.app[STATE]
    try:
        level = int(request.query.get("level", "1"))
    except ValueError:
        return _json({"error": {"message": "level must be an integer", "type": "BadRequestError",
                                "param": "level", "code": 400}}, status=400)
    await asyncio.sleep(state.config.sleep_delay_s)
    state.sleeping = level
    state.log.write(f"sleep level={level}")
    return web.Response(status=200)


async def _wake_up(request: web.Request) -> web.Response:
    state = request.app[STATE]
    await asyncio.sleep(state.config.wake_delay_s)
    state.sleeping = 0
    state.log.write("wake_up")
    return web.Response(status=200)


async def _is_sleeping(request: web.Request) -> web.Response:
    return _json({"is_sleeping": bool(request.app[STATE].sleeping)})


async def _ollama_root(request: web.Request) -> web.Response:
    return web.Response(text="Ollama is running")


async def _ollama_version(request: web.Request) -> web.Response:
    return _json({"version": "0.12.0"})


async def _ollama_show(request: web.Request) -> web.Response:
    """Ollama's native /api/show, as much of it as the gateway reads (capabilities, model_info,
    details, template, parameters); an unknown model is Ollama's 404."""
    config = request.app[STATE].config
    body = await _read_json(request)
    model = body.get("model") or body.get("name") if isinstance(body, dict) else None
    if model not in config.models:
        return _json({"error": f"model '{model}' not found"}, status=404)
    return _json({
        "modelfile": f"FROM {model}",
        "parameters": 'stop "<|im_end|>"',
        "template": "{{ .Prompt }}",
        "details": {"parent_model": "", "format": "gguf", "family": "qwen2", "families": ["qwen2"],
                    "parameter_size": "3.1B", "quantization_level": "Q4_K_M"},
        "model_info": {"general.architecture": "qwen2", "general.basename": "Qwen2.5",
                       "qwen2.context_length": 32768},
        "capabilities": ["completion", "tools"],
        "modified_at": "2026-01-01T00:00:00Z",
    })


async def _llama_props(request: web.Request) -> web.Response:
    """llama-server's /props: the fields the gateway reads (the chat template's capabilities,
    the modalities, the context per slot)."""
    config = request.app[STATE].config
    return _json({
        "default_generation_settings": {"n_ctx": config.max_model_len, "params": {}},
        "total_slots": 2,
        "model_alias": config.models[0],
        "model_path": f"/models/{config.models[0]}.gguf",
        "chat_template_caps": {"supports_tool_calls": True, "supports_tools": True, "supports_system_role": True,
                               "supports_parallel_tool_calls": True},
        "modalities": {"vision": False, "audio": False},
        "build_info": "stub",
    })


async def _stats(request: web.Request) -> web.Response:
    return _json(request.app[STATE].stats.as_dict())


async def _reset(request: web.Request) -> web.Response:
    state = request.app[STATE]
    state.reset()
    return _json(state.stats.as_dict())


async def _fail(request: web.Request) -> web.Response:
    """Make every chat request fail ({"status": CODE, "message": TEXT} or {"reset": true});
    an empty body clears it."""
    raw = await request.read()
    doc = msgspec.json.decode(raw) if raw.strip() else None
    request.app[STATE].failing = doc if isinstance(doc, dict) and doc else None
    return _json({"failing": request.app[STATE].failing})


async def _requests(request: web.Request) -> web.Response:
    return _json(list(request.app[STATE].requests))


def build_app(config: StubConfig) -> web.Application:
    flavour = make_flavour(config.flavour)
    flavour.legacy_context_errors = config.legacy_context_errors
    if not config.models:
        config = replace(config, models=flavour.default_models or (flavour.default_model,))
    state = StubState(config=config, log=EventLog(config.log))
    if config.prefix_cache_tokens > 0:
        state.cache = PrefixCache(config.prefix_cache_tokens, config.prefix_block)
    middlewares = ([_llama_loading, _auth, _llama_close_after_stream] if config.flavour == "llamacpp"
                   else [_vllm_sleeping, _auth] if config.flavour == "vllm" else [_auth])
    app = web.Application(middlewares=middlewares, client_max_size=64 * 1024 * 1024)
    app[STATE] = state
    app[FLAVOUR] = flavour
    if config.flavour in MEDIA_FLAVOURS:
        _media_routes(app, config)
    else:
        _chat_routes(app, config)
    app.router.add_get("/stub/stats", _stats)
    app.router.add_post("/stub/reset", _reset)
    app.router.add_post("/stub/fail", _fail)
    app.router.add_get("/stub/requests", _requests)

    async def close_log(app: web.Application) -> None:
        state.log.close()

    if config.flavour == "llamacpp" and config.start_delay_s > 0:
        state.loading = True

        async def load(app: web.Application) -> None:
            async def loaded() -> None:
                await asyncio.sleep(config.start_delay_s)
                state.loading = False
                state.log.write("model loaded")

            app[_LOADER] = asyncio.get_running_loop().create_task(loaded())

        app.on_startup.append(load)
    app.on_cleanup.append(close_log)
    return app


def _media_routes(app: web.Application, config: StubConfig) -> None:
    if config.flavour == "whispercpp":  # no /v1/models: the real server has none
        register_whispercpp(app, config.request_path, config.inference_path)
        return
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/health", _health)
    if config.flavour == "speaches":
        register_stt(app)
        register_tts(app, audio_models_route=True)
    elif config.flavour == "kokoro":
        register_tts(app, audio_models_route=False)
    else:
        register_images(app)


def _chat_routes(app: web.Application, config: StubConfig) -> None:
    app.router.add_post(CHAT_PATH, handle_chat)
    app.router.add_post("/v1/completions", handle_completions)
    app.router.add_get("/v1/models", _models)
    app.router.add_post("/v1/embeddings", _embeddings)
    if config.flavour == "vllm":
        app.router.add_post("/tokenize", _tokenize)
        app.router.add_get("/metrics", _metrics)
        app.router.add_get("/health", _health)
        app.router.add_post("/sleep", _sleep)
        app.router.add_post("/wake_up", _wake_up)
        app.router.add_get("/is_sleeping", _is_sleeping)
        for path in ("/rerank", "/v1/rerank", "/v2/rerank"):
            app.router.add_post(path, vllm_rerank)
        for path in ("/score", "/v1/score"):
            app.router.add_post(path, vllm_score)
        register_stt(app)
    elif config.flavour == "llamacpp":
        app.router.add_post("/tokenize", _llama_tokenize)
        app.router.add_post("/apply-template", _llama_apply_template)
        app.router.add_get("/metrics", _llama_metrics)
        app.router.add_get("/slots", _llama_slots)
        app.router.add_get("/props", _llama_props)
        app.router.add_post("/infill", handle_infill)
        app.router.add_post("/completion", handle_native_completion)
        app.router.add_get("/health", _health)
        for path in ("/rerank", "/reranking", "/v1/rerank", "/v1/reranking"):
            app.router.add_post(path, llama_rerank)
        app.on_response_prepare.append(_llama_headers)
    else:
        app.router.add_get("/", _ollama_root)
        app.router.add_get("/api/version", _ollama_version)
        app.router.add_post("/api/show", _ollama_show)


class StubServer:
    """Run a stub inside the current event loop: `async with StubServer(config) as stub: stub.url`.

    Handy for in-process tests; `cli.run` uses it too. Handler cancellation is on, so a client
    that goes away cancels its generation at once.
    """

    def __init__(self, config: StubConfig, *, shutdown_timeout: float = 0.25) -> None:
        self.config = config
        self.url = ""
        self._shutdown_timeout = shutdown_timeout
        self._runner: web.AppRunner | None = None

    @property
    def state(self) -> StubState:
        assert self._runner is not None
        return self._runner.app[STATE]

    async def start(self) -> str:
        app = build_app(self.config)
        self._runner = web.AppRunner(
            app, handler_cancellation=True, access_log=None, shutdown_timeout=self._shutdown_timeout
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.config.host, self.config.port)
        await site.start()
        port = self._runner.addresses[0][1]
        host = self.config.host if self.config.host not in ("", "0.0.0.0", "::") else "127.0.0.1"
        if ":" in host:
            host = f"[{host}]"
        self.url = f"http://{host}:{port}"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> "StubServer":
        await self.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()
