"""Images, as stable-diffusion.cpp's sd-server answers them (examples/server/routes_openai.cpp;
directives and evidence: media.py).

- `POST /v1/images/generations`, JSON `{prompt, n, size ("WxH"), output_format (png|jpeg|webp),
  …}`: an empty body 400 `{"error": "empty body"}`, no prompt 400 `{"error": "prompt required"}`.
  The `model` and `response_format` fields are not read: every image comes back as `b64_json`,
  never a `url`. The answer: `{"created", "data": [{"b64_json"}], "output_format"}`.
- `POST /v1/images/edits`, multipart (`prompt`, `image[]` or `image`, `mask`, `n`, `size`,
  `output_format`): not multipart 400 `{"error": "Content-Type must be multipart/form-data"}`, no
  prompt "prompt required", no image "at least one image[] required".
- one image job at a time (sd-server renders synchronously); each image takes `steps=N` render
  steps (default 4) of `delay_ms` each (default 0); the stub notices a client that left between
  steps (the real server renders on regardless: its evidence of a cancellation is only that no
  answer was written).
- `GET /v1/models`: `{"data": [{"id": "sd-cpp-local", "object": "model", "owned_by": "local"}]}`.

The images are real PNGs of the size asked (a flat colour chosen by the prompt, small to send),
whatever output_format says.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import struct
import time
import zlib

import msgspec
from aiohttp import web

from .chat import FLAVOUR
from .media import (Job, MediaDirectives, NotMultipart, check_key, json_body, parse_media_directives, read_upload,
                    rejection_response, run_job, sleep_ms)

DEFAULT_STEPS = 4
MAX_SIDE = 2048
_RENDER_LOCK = web.AppKey("render_lock", asyncio.Lock)


def png(width: int, height: int, seed: str) -> bytes:
    """A flat-colour RGB PNG, the colour from the seed text."""
    r, g, b = hashlib.sha256(seed.encode()).digest()[:3]
    row = b"\x00" + bytes((r, g, b)) * width
    raw = zlib.compress(row * height, 9)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", raw) + chunk(b"IEND", b""))


def _size(text: str | None) -> tuple[int, int] | None:
    if not text:
        return 512, 512
    w, sep, h = text.partition("x")
    try:
        width, height = int(w), int(h)
    except ValueError:
        return None
    if not sep or not (0 < width <= MAX_SIDE and 0 < height <= MAX_SIDE):
        return None
    return width, height


def _error(job: Job, status: int, message: str) -> web.Response:
    job.reject(status)
    return rejection_response(job.request.app[FLAVOUR].error(status, message))


async def _opening(job: Job, directives: MediaDirectives) -> web.Response | None:
    await sleep_ms(directives.headers_ms)
    refused = check_key(job, job.request.app[FLAVOUR].unauthorized)
    if refused is not None:
        return refused
    if directives.status is not None:
        return _error(job, directives.status, f"stub error {directives.status}")
    return None


async def _render(job: Job, directives: MediaDirectives, prompt: str, n: int, size: tuple[int, int],
                  output_format: str) -> web.Response:
    steps = directives.steps if directives.steps is not None else DEFAULT_STEPS
    data = []
    async with job.request.app[_RENDER_LOCK]:
        for i in range(n):
            for _ in range(max(steps, 1)):
                await job.work(directives)
            data.append({"b64_json": base64.b64encode(png(size[0], size[1], f"{prompt}#{i}")).decode()})
    return json_body({"created": int(time.time()), "data": data, "output_format": output_format})


async def generations(request: web.Request) -> web.StreamResponse:
    return await run_job(request, _generations, unit="steps")


async def _generations(job: Job) -> web.StreamResponse:
    raw = await job.request.read()
    try:
        body = msgspec.json.decode(raw) if raw.strip() else None
    except msgspec.DecodeError:
        body = None
    job.describe(body)
    if not raw.strip():
        return _error(job, 400, "empty body")
    if not isinstance(body, dict):
        return _error(job, 400, "invalid json")
    directives = parse_media_directives(body.get("prompt"))
    opened = await _opening(job, directives)
    if opened is not None:
        return opened
    if not isinstance(body.get("prompt"), str) or not body["prompt"]:
        return _error(job, 400, "prompt required")
    size = _size(body.get("size"))
    n = body.get("n", 1)
    if size is None or not isinstance(n, int) or isinstance(n, bool):
        return _error(job, 400, "invalid params")
    return await _render(job, directives, body["prompt"], max(1, n), size, str(body.get("output_format", "png")))


async def edits(request: web.Request) -> web.StreamResponse:
    return await run_job(request, _edits, unit="steps")


async def _edits(job: Job) -> web.StreamResponse:
    job.describe({"upload": True})
    try:
        upload = await read_upload(job)
    except NotMultipart:
        return _error(job, 400, "Content-Type must be multipart/form-data")
    entry = job.state.requests[-1] if job.state.requests else None
    if entry is not None and entry.get("body") == {"upload": True}:
        entry["body"] = {**upload.fields, "files": {k: [{"filename": f, "bytes": n} for f, n, _ in v]
                                                    for k, v in upload.files.items()}}
    directives = parse_media_directives(upload.fields.get("prompt"))
    opened = await _opening(job, directives)
    if opened is not None:
        return opened
    if not upload.fields.get("prompt"):
        return _error(job, 400, "prompt required")
    if not upload.files.get("image[]") and not upload.files.get("image"):
        return _error(job, 400, "at least one image[] required")
    size = _size(upload.fields.get("size"))
    try:
        n = int(upload.fields.get("n", "1"))
    except ValueError:
        n = 1
    if size is None:
        return _error(job, 400, "invalid params")
    return await _render(job, directives, upload.fields["prompt"], max(1, n), size,
                         upload.fields.get("output_format", "png"))


def register_images(app: web.Application) -> None:
    app[_RENDER_LOCK] = asyncio.Lock()
    app.router.add_post("/v1/images/generations", generations)
    app.router.add_post("/v1/images/edits", edits)
