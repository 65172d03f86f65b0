"""Speech to text and text to speech, as whisper.cpp's server, vLLM 0.32, speaches and
kokoro-fastapi answer them (directives and evidence: media.py).

What the stub "hears": a WAV's duration is read from its header (any other file counts as 16 kB
a second); the transcript is TRANSCRIPT's sentences, one per segment (`chunks=N`, default 3),
each segment taking `delay_ms` to "decode" (default 0), spread evenly over the duration.

whisper.cpp (examples/server/server.cpp):
- `POST {--request-path}{--inference-path}` (default `/inference`), multipart; the upload is read
  whole before the handler runs (cpp-httplib), then one request at a time (a mutex round the
  model): requests beyond the first wait in the server, counted in flight all the same.
- no `file`: 400 `{"error":"no 'file' field in the request"}`; not a WAV (the server runs without
  --convert): 400 `{"error":"failed to read audio data"}`. The `model` field is not read.
- `response_format`: `json` (also anything unknown) `{"text"}`; `text` as `text/html;
  charset=utf-8`; `srt` as `application/x-subrip`; `vtt` as `text/vtt` ("WEBVTT" first);
  `verbose_json` `{"task", "language", "duration", "text", "segments": [{"id", "text", "start",
  "end", "tokens", "words", "temperature", "avg_logprob", "no_speech_prob"}],
  "detected_language", "detected_language_probability", "language_probabilities"}`.
- a client gone mid-inference aborts it (its log: "client disconnected, aborted processing").
- `GET /health` `{"status":"ok"}`; no `/v1/models` (404).

vLLM (entrypoints/speech_to_text):
- `POST /v1/audio/transcriptions`, `/v1/audio/translations`, multipart (`file`, `model`,
  `language`, `prompt`, `response_format`, `temperature`, `stream`, `stream_include_usage`, …).
- `response_format` `json` and `text` are both JSON `{"text", "usage": {"type": "duration",
  "seconds": ceil(duration)}}` (a translation: `{"text"}` alone); `verbose_json` `{"duration",
  "language", "text", "segments", "words": null}`; `srt`/`vtt`: 400 "Currently only support
  response_format: `text`, `json`, `verbose_json` or `diarized_json`"; verbose_json with
  `stream`: 400.
- `stream=true`: SSE `data: {"id": "transcribe-…", "object": "transcription.chunk", "created",
  "model", "choices": [{"delta": {"content"}}]}` per piece, the last with `finish_reason: "stop"`
  and `stop_reason: null`, a `choices: []` chunk with usage when `stream_include_usage`, then
  `data: [DONE]` (translations: `translate-…`, `translation.chunk`).

speaches (src/speaches/routers/stt.py, speech.py, models.py):
- transcriptions/translations: `json` `{"text", "logprobs": null, "usage": null}`; `text` and
  `srt` as `text/plain`, `vtt` as `text/vtt`, `verbose_json` OpenAI's TranscriptionVerbose;
  `stream=true`: `data: {"type": "transcript.text.delta", "delta", "logprobs": null}` per
  segment, then `transcript.text.done` with the whole text; no `[DONE]`. A missing field: 422
  with FastAPI's `detail` list.
- `POST /v1/audio/speech` `{model, input, voice, response_format (default mp3), speed,
  stream_format: audio|sse}`: audio streamed as made, content type by format; `sse`:
  `data: {"type": "speech.audio.delta", "audio": base64}` per chunk, then `speech.audio.done`
  with `token_usage` (all 0: speaches does not count them).
- `GET /v1/audio/voices` `{"voices": [{"name", "language", "gender", "id"}], "object": "list"}`;
  `GET /v1/audio/models` `{"models": [...], "object": "list"}`; `GET /v1/models`.

kokoro-fastapi (api/src/routers/openai_compatible.py):
- `POST /v1/audio/speech`: `stream` defaults to true (chunked, with `Content-Disposition:
  attachment; filename=speech.FMT`, `X-Accel-Buffering: no`, `Cache-Control: no-cache`); false:
  the whole file at once. No `stream_format` (an unknown field, ignored). An unsupported model:
  400 `{"detail": {"error": "invalid_model", "message", "type"}}`.
- `GET /v1/audio/voices` `{"voices": [{"id", "name"}]}` (what Open WebUI reads); no
  /v1/audio/models.

The audio itself: a 440 Hz tone as 16-bit mono PCM at 24 kHz, `chunks=N` chunks (default 8) of
`chunk_bytes` (default 4800, 0.1 s) `delay_ms` apart (default 20); `wav` starts with a streaming
WAV header, every other format carries the same PCM bytes under its own content type (the stub
encodes no mp3: the gateway relays bytes, it never decodes them).
"""

from __future__ import annotations

import asyncio
import base64
import math
import time
import uuid
from typing import Any

import msgspec
from aiohttp import web

from .chat import FLAVOUR, STATE
from .media import (Job, MediaDirectives, NotMultipart, Upload, check_key, json_body, parse_media_directives,
                    pcm_tone, read_upload, rejection_response, run_job, sleep_ms, wav_header, wav_seconds)

TRANSCRIPT = ("Hello from the homelab stub.", "This is a transcription.", "It is made of segments.",
              "Each one takes its time.")
DEFAULT_SEGMENTS = 3
UNKNOWN_BYTES_PER_SECOND = 16000
DEFAULT_CHUNKS = 8
DEFAULT_CHUNK_BYTES = 4800
DEFAULT_CHUNK_MS = 20
SAMPLE_RATE = 24000
AUDIO_TYPES = {"mp3": "audio/mpeg", "opus": "audio/opus", "aac": "audio/aac", "flac": "audio/flac",
               "wav": "audio/wav", "pcm": "audio/pcm"}
VOICES = (("af_heart", "en-us", "female"), ("am_michael", "en-us", "male"), ("bf_emma", "en-gb", "female"))
_WHISPER_LOCK = web.AppKey("whisper_lock", asyncio.Lock)


def _segments(count: int, duration: float) -> list[tuple[float, float, str]]:
    count = max(count, 1)
    step = duration / count if duration > 0 else 1.0
    return [(round(i * step, 2), round((i + 1) * step, 2), " " + TRANSCRIPT[i % len(TRANSCRIPT)]) for i in range(count)]


def _stamp(seconds: float, comma: bool) -> str:
    ms = int(round(seconds * 1000))
    h, rest = divmod(ms, 3_600_000)
    m, rest = divmod(rest, 60_000)
    s, ms = divmod(rest, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{',' if comma else '.'}{ms:03d}"


def _srt(segments: list[tuple[float, float, str]]) -> str:
    return "".join(f"{i + 1}\n{_stamp(a, True)} --> {_stamp(b, True)}\n{t}\n\n" for i, (a, b, t) in enumerate(segments))


def _vtt(segments: list[tuple[float, float, str]]) -> str:
    return "WEBVTT\n\n" + "".join(f"{_stamp(a, False)} --> {_stamp(b, False)}\n{t}\n\n" for a, b, t in segments)


def _tokens(text: str) -> list[int]:
    return [sum(w.encode()) % 50000 + 1 for w in text.split()]


def _error(job: Job, status: int, message: str) -> web.Response:
    job.reject(status)
    return rejection_response(job.request.app[FLAVOUR].error(status, message))


def _fastapi_missing(job: Job, field: str) -> web.Response:
    job.reject(422)
    return json_body({"detail": [{"type": "missing", "loc": ["body", field], "msg": "Field required", "input": None}]},
                     422)


async def _read(job: Job) -> Upload | None:
    """The upload, or None: the body is not a multipart form."""
    job.describe({"upload": True})
    try:
        upload = await read_upload(job)
    except NotMultipart:
        return None
    entry = job.state.requests[-1] if job.state.requests else None
    if entry is not None and entry.get("body") == {"upload": True}:
        entry["body"] = {**upload.fields, **upload.lists,
                         "files": {k: [{"filename": f, "bytes": n} for f, n, _ in v] for k, v in upload.files.items()}}
    model = upload.fields.get("model")
    job.state.log.write(f"upload model={model} bytes={job.received} seq={job.seq}")
    return upload


async def _opening(job: Job, directives: MediaDirectives) -> web.Response | None:
    await sleep_ms(directives.headers_ms)
    refused = check_key(job, job.request.app[FLAVOUR].unauthorized)
    if refused is not None:
        return refused
    if directives.status is not None:
        return _error(job, directives.status, f"stub error {directives.status}")
    return None


def _duration(upload: Upload) -> float:
    name, size, head = upload.file("file") or ("", 0, b"")
    seconds = wav_seconds(head, size)
    return seconds if seconds is not None else size / UNKNOWN_BYTES_PER_SECOND


async def _decode(job: Job, directives: MediaDirectives, duration: float):
    """The segments, one unit of work each, yielded as they are decoded."""
    for segment in _segments(directives.chunks or DEFAULT_SEGMENTS, duration):
        await job.work(directives)
        yield segment


# -- whisper.cpp --

async def whisper_inference(request: web.Request) -> web.StreamResponse:
    return await run_job(request, _whisper_inference, unit="segments")


async def _whisper_inference(job: Job) -> web.StreamResponse:
    upload = await _read(job)
    if upload is None:
        # cpp-httplib answers a non-multipart body's missing file the same way
        return _error(job, 400, "no 'file' field in the request")
    directives = parse_media_directives(upload.fields.get("prompt"))
    opened = await _opening(job, directives)
    if opened is not None:
        return opened
    file = upload.file("file")
    if file is None:
        return _error(job, 400, "no 'file' field in the request")
    name, size, head = file
    duration = wav_seconds(head, size)
    if duration is None:
        return _error(job, 400, "failed to read audio data")
    lock = job.request.app[_WHISPER_LOCK]
    async with lock:  # whisper_mutex: one inference at a time
        segments = [s async for s in _decode(job, directives, duration)]
    fmt = upload.fields.get("response_format", "json")
    text = "".join(t for _, _, t in segments)
    if fmt == "text":
        return _exact(text, "text/html; charset=utf-8")
    if fmt == "srt":
        return _exact(_srt(segments), "application/x-subrip")
    if fmt == "vtt":
        return _exact(_vtt(segments), "text/vtt")
    if fmt == "verbose_json":
        temperature = float(upload.fields.get("temperature", "0") or 0)
        return json_body({
            "task": "translate" if upload.fields.get("translate") == "true" else "transcribe",
            "language": "english", "duration": duration, "text": text,
            "segments": [{"id": i, "text": t, "start": a, "end": b, "tokens": _tokens(t),
                          "words": [{"word": " " + w, "start": a, "end": b, "t_dtw": -1, "probability": 0.9}
                                    for w in t.split()],
                          "temperature": temperature, "avg_logprob": -0.2, "no_speech_prob": 0.01}
                         for i, (a, b, t) in enumerate(segments)],
            "detected_language": "english", "detected_language_probability": 0.97,
            "language_probabilities": {"en": 0.97}})
    return json_body({"text": text})


def _exact(text: str, content_type: str) -> web.Response:
    """cpp-httplib sends the content type as given (no charset added, as aiohttp's text= would)."""
    return web.Response(body=text.encode(), headers={"Content-Type": content_type})


async def whisper_health(request: web.Request) -> web.Response:
    return json_body({"status": "ok"})


# -- OpenAI-style: vLLM and speaches --

async def transcriptions(request: web.Request) -> web.StreamResponse:
    return await run_job(request, lambda job: _openai_stt(job, "transcribe"), unit="segments")


async def translations(request: web.Request) -> web.StreamResponse:
    return await run_job(request, lambda job: _openai_stt(job, "translate"), unit="segments")


async def _openai_stt(job: Job, task: str) -> web.StreamResponse:
    flavour = job.request.app[FLAVOUR]
    vllm = flavour.name == "vllm"
    upload = await _read(job)
    if upload is None:
        if vllm:
            return _error(job, 400, "1 validation error: file Field required")
        return _fastapi_missing(job, "file")
    directives = parse_media_directives(upload.fields.get("prompt"))
    opened = await _opening(job, directives)
    if opened is not None:
        return opened
    if upload.file("file") is None:
        return _error(job, 400, "1 validation error: file Field required") if vllm else _fastapi_missing(job, "file")
    served = job.state.config.models
    model = upload.fields.get("model") or (served[0] if vllm else None)
    if model is None:
        return _fastapi_missing(job, "model")
    if model not in served:
        job.reject(404)
        return rejection_response(flavour.model_not_found(model, served))
    fmt = upload.fields.get("response_format", "json")
    stream = upload.fields.get("stream", "false").lower() == "true"
    if vllm and fmt not in ("text", "json", "verbose_json", "diarized_json"):
        return _error(job, 400, "Currently only support response_format: `text`, `json`, `verbose_json` or "
                                "`diarized_json`")
    if not vllm and fmt not in ("text", "json", "verbose_json", "srt", "vtt"):
        job.reject(422)
        return json_body({"detail": [{"type": "literal_error", "loc": ["body", "response_format"],
                                      "msg": "Input should be 'text', 'json', 'verbose_json', 'srt' or 'vtt'",
                                      "input": fmt}]}, 422)
    if vllm and stream and fmt == "verbose_json":
        return _error(job, 400, "verbose_json format doesn't support streaming case")
    duration = _duration(upload)
    if stream:
        return await (_vllm_stream(job, directives, duration, model, task, upload) if vllm
                      else _speaches_stream(job, directives, duration))
    segments = [s async for s in _decode(job, directives, duration)]
    text = "".join(t for _, _, t in segments)
    language = upload.fields.get("language") or "en"
    verbose_segments = [{"id": i, "avg_logprob": -0.2, "compression_ratio": 1.1, "end": b, "no_speech_prob": 0.01,
                         "seek": 0, "start": a, "temperature": 0.0, "text": t, "tokens": _tokens(t)}
                        for i, (a, b, t) in enumerate(segments)]
    if vllm:
        if fmt == "verbose_json":
            return json_body({"duration": duration, "language": language, "text": text,
                              "segments": verbose_segments, "words": None})
        if task == "translate":
            return json_body({"text": text})
        return json_body({"text": text, "usage": {"type": "duration", "seconds": int(math.ceil(duration))}})
    if fmt == "text":
        return web.Response(text=text, content_type="text/plain")
    if fmt == "srt":
        return web.Response(text=_srt(segments), content_type="text/plain")
    if fmt == "vtt":
        return web.Response(text=_vtt(segments), content_type="text/vtt")
    if fmt == "verbose_json":
        return json_body({"duration": duration, "language": language, "text": text, "segments": verbose_segments,
                          "usage": None, "words": None})
    return json_body({"text": text, "logprobs": None, "usage": None})


async def _sse(job: Job) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
    await response.prepare(job.request)
    return response


async def _vllm_stream(job: Job, directives: MediaDirectives, duration: float, model: str, task: str,
                       upload: Upload) -> web.StreamResponse:
    response = await _sse(job)
    rid = f"{task}-{uuid.uuid4().hex}"
    obj = "transcription.chunk" if task == "transcribe" else "translation.chunk"
    created = int(time.time())
    segments = _segments(directives.chunks or DEFAULT_SEGMENTS, duration)
    completion = 0
    async for index, (_, _, text) in _enumerate(_decode(job, directives, duration)):
        completion += len(text.split())
        choice: dict[str, Any] = {"delta": {"content": text}}
        if index == len(segments) - 1:
            choice.update(finish_reason="stop", stop_reason=None)
        chunk = {"id": rid, "object": obj, "created": created, "model": model, "choices": [choice]}
        await response.write(b"data: " + msgspec.json.encode(chunk) + b"\n\n")
    if upload.fields.get("stream_include_usage", "false").lower() == "true":
        prompt = int(math.ceil(duration * 50))  # Whisper's encoder: 50 audio tokens a second
        usage = {"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion}
        chunk = {"id": rid, "object": obj, "created": created, "model": model, "choices": [], "usage": usage}
        await response.write(b"data: " + msgspec.json.encode(chunk) + b"\n\n")
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


async def _speaches_stream(job: Job, directives: MediaDirectives, duration: float) -> web.StreamResponse:
    response = await _sse(job)
    texts = []
    async for _, _, text in _decode(job, directives, duration):
        texts.append(text)
        event = {"type": "transcript.text.delta", "delta": text, "logprobs": None}
        await response.write(b"data: " + msgspec.json.encode(event) + b"\n\n")
    done = {"type": "transcript.text.done", "text": "".join(texts), "logprobs": None, "usage": None}
    await response.write(b"data: " + msgspec.json.encode(done) + b"\n\n")
    await response.write_eof()
    return response


async def _enumerate(items):
    i = 0
    async for item in items:
        yield i, item
        i += 1


# -- text to speech: speaches and kokoro-fastapi --

async def speech(request: web.Request) -> web.StreamResponse:
    return await run_job(request, _speech, unit="chunks")


async def _speech(job: Job) -> web.StreamResponse:
    request = job.request
    flavour = request.app[FLAVOUR]
    kokoro = flavour.name == "kokoro"
    try:
        body = msgspec.json.decode(await request.read())
    except msgspec.DecodeError:
        body = None
    job.describe(body)
    if not isinstance(body, dict):
        job.reject(422)
        return json_body({"detail": [{"type": "model_attributes_type", "loc": ["body"],
                                      "msg": "Input should be a valid dictionary or object", "input": None}]}, 422)
    directives = parse_media_directives(body.get("input"))
    opened = await _opening(job, directives)
    if opened is not None:
        return opened
    for required in (("model", "input") if kokoro else ("model", "input", "voice")):
        if not isinstance(body.get(required), str):
            return _fastapi_missing(job, required)
    served = job.state.config.models
    if body["model"] not in served:
        job.reject(400 if kokoro else 404)
        return rejection_response(flavour.model_not_found(body["model"], served))
    fmt = body.get("response_format", "mp3")
    if fmt not in AUDIO_TYPES:
        job.reject(422)
        return json_body({"detail": [{"type": "literal_error", "loc": ["body", "response_format"],
                                      "msg": "Input should be 'mp3', 'opus', 'aac', 'flac', 'wav' or 'pcm'",
                                      "input": fmt}]}, 422)
    stream_format = "audio" if kokoro else body.get("stream_format", "audio")
    if stream_format not in ("audio", "sse"):
        job.reject(422)
        return json_body({"detail": [{"type": "literal_error", "loc": ["body", "stream_format"],
                                      "msg": "Input should be 'audio' or 'sse'", "input": stream_format}]}, 422)
    chunks = directives.chunks if directives.chunks is not None else DEFAULT_CHUNKS
    size = directives.chunk_bytes or DEFAULT_CHUNK_BYTES
    pace = MediaDirectives(delay_ms=directives.delay_ms if directives.delay_ms is not None else DEFAULT_CHUNK_MS,
                           fail_after=directives.fail_after)
    job.state.stats.prompt_tokens += len(body["input"])  # characters of speech input
    if kokoro and body.get("stream") is False:
        pieces = [wav_header(SAMPLE_RATE, chunks * size)] if fmt == "wav" else []
        for i in range(chunks):
            await job.work(pace)
            pieces.append(pcm_tone(size, i * size))
        return web.Response(body=b"".join(pieces), content_type=AUDIO_TYPES[fmt],
                            headers={"Content-Disposition": f"attachment; filename=speech.{fmt}",
                                     "Cache-Control": "no-cache"})
    if stream_format == "sse":
        response = await _sse(job)
        for i in range(chunks):
            await job.work(pace)
            event = {"type": "speech.audio.delta", "audio": base64.b64encode(pcm_tone(size, i * size)).decode()}
            await response.write(b"data: " + msgspec.json.encode(event) + b"\n\n")
        done = {"type": "speech.audio.done", "token_usage": {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0}}
        await response.write(b"data: " + msgspec.json.encode(done) + b"\n\n")
        await response.write_eof()
        return response
    headers = {"Content-Type": AUDIO_TYPES[fmt]}
    if kokoro:
        headers.update({"Content-Disposition": f"attachment; filename=speech.{fmt}", "X-Accel-Buffering": "no",
                        "Cache-Control": "no-cache"})
    response = web.StreamResponse(headers=headers)
    response.enable_chunked_encoding()
    await response.prepare(request)
    if fmt == "wav":
        await response.write(wav_header(SAMPLE_RATE))
    for i in range(chunks):
        await job.work(pace)
        await response.write(pcm_tone(size, i * size))
    await response.write_eof()
    return response


async def voices(request: web.Request) -> web.Response:
    if request.app[FLAVOUR].name == "kokoro":
        return json_body({"voices": [{"id": v, "name": v} for v, _, _ in VOICES]})
    return json_body({"voices": [{"name": v, "language": lang, "gender": g, "id": v} for v, lang, g in VOICES],
                      "object": "list"})


def _task(model: str) -> str:
    return "automatic-speech-recognition" if "whisper" in model.lower() else "text-to-speech"


async def audio_models(request: web.Request) -> web.Response:
    """speaches: the text-to-speech models."""
    models = [m for m in request.app[STATE].config.models if _task(m) == "text-to-speech"]
    return json_body({"models": [{"id": m, "created": 0, "object": "model", "owned_by": m.split("/")[0],
                                  "language": ["en"], "task": "text-to-speech"} for m in models],
                      "object": "list"})


def register_whispercpp(app: web.Application, request_path: str, inference_path: str) -> None:
    app[_WHISPER_LOCK] = asyncio.Lock()
    app.router.add_post(request_path + inference_path, whisper_inference)
    app.router.add_get(request_path + "/health", whisper_health)


def register_stt(app: web.Application) -> None:
    app.router.add_post("/v1/audio/transcriptions", transcriptions)
    app.router.add_post("/v1/audio/translations", translations)


def register_tts(app: web.Application, *, audio_models_route: bool) -> None:
    app.router.add_post("/v1/audio/speech", speech)
    app.router.add_get("/v1/audio/voices", voices)
    if audio_models_route:
        app.router.add_get("/v1/audio/models", audio_models)
