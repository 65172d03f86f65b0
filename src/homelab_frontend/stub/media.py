"""What every non-chat stub endpoint shares (rerank, score, speech, images): its directives, its
lifecycle in the log and the counters, and an upload read as it arrives.

Directives ride in the one text field the gateway relays unchanged: a rerank's `query` (or a
score's first text), a transcription's multipart `prompt` field, a speech's `input`, an image's
`prompt`, as the same bracketed `[stub key=value ...]` the chat stub reads:

  status=CODE     answer at once with that status, in the server's own error shape
  headers_ms=N    wait before answering at all (no headers yet)
  delay_ms=N      the time one unit of work takes: a document scored, a transcript segment, an
                  audio chunk, an image's render step
  chunks=N        speech: how many audio chunks (default 8); transcription: segments (default 3)
  chunk_bytes=N   speech: bytes per audio chunk (default 4800: 0.1 s of 24 kHz 16-bit mono)
  steps=N         images: render steps (default 4)
  read_ms=N       uploads: wait N ms after each 64 KiB read (a slow reader; the directive must
                  come before the file part, as clients send form fields first)
  fail_after=N    drop the connection after N units (no end of answer)

The evidence (tests judge the gateway by it, never by its own word): one `request` line per
call (`request path=… model=… seq=…`), `upload bytes=N seq=…` when an upload has been read,
then exactly one of `completed … seq=…`, `cancelled … seq=…` (the client's socket closed:
mid-upload, mid-work or mid-stream; the word appears on no other line), `failed … seq=…` (a
fail_after drop) or `rejected status=… seq=…`. `/stub/stats` counts `in_flight` from the first
byte of the request to the last of the answer, its high-water mark `max_in_flight` (the
concurrency the gateway let through), and `upload_bytes`, the bytes of uploads received so far,
updated per read (a test watches it grow while its client is still sending: the gateway streams
the upload instead of collecting it first).
"""

from __future__ import annotations

import asyncio
import struct
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

import msgspec
from aiohttp import BodyPartReader, web

from .chat import STATE, authorized
from .flavour import Rejection
from .script import _directive_tokens
from .state import StubState

READ_CHUNK = 64 * 1024
_KEYS = ("status", "headers_ms", "delay_ms", "chunks", "chunk_bytes", "steps", "read_ms", "fail_after")


@dataclass(frozen=True)
class MediaDirectives:
    status: int | None = None
    headers_ms: int = 0
    delay_ms: int | None = None
    chunks: int | None = None
    chunk_bytes: int | None = None
    steps: int | None = None
    read_ms: int | None = None
    fail_after: int | None = None


def parse_media_directives(text: Any) -> MediaDirectives:
    items = _directive_tokens(text) if isinstance(text, str) else None
    values: dict[str, int] = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if key in _KEYS and sep:
            try:
                values[key] = max(int(value), 0)
            except ValueError:
                pass
    return MediaDirectives(**values)


class Dropped(Exception):
    """fail_after: the stub drops the connection mid-answer."""


@dataclass
class Job:
    """One call in the stub's hands, from its first request byte to the last answer byte."""

    request: web.Request
    state: StubState
    seq: int = 0
    received: int = 0  # upload bytes read so far
    done: int = 0  # units of work done (documents, segments, chunks, steps)
    unit: str = "units"
    outcome: str = ""
    fields: dict[str, str] = field(default_factory=dict)

    def describe(self, body: Any) -> None:
        """Record the request (its JSON body, or an upload's form fields) and log its line."""
        self.seq = self.state.record(body, self.request.headers)
        model = body.get("model") if isinstance(body, dict) else None
        self.state.log.write(f"request path={self.request.path} model={model} seq={self.seq}")

    def reject(self, status: int) -> None:
        self.outcome = "rejected"
        self.state.log.write(f"rejected status={status} seq={self.seq}")

    async def work(self, directives: MediaDirectives, default_ms: int = 0) -> None:
        """One unit of work: its time, then the fail_after check."""
        await sleep_ms(directives.delay_ms if directives.delay_ms is not None else default_ms)
        self.done += 1
        if directives.fail_after is not None and self.done > directives.fail_after:
            raise Dropped


async def sleep_ms(ms: float) -> None:
    if ms > 0:
        await asyncio.sleep(ms / 1000)


def json_body(payload: Any, status: int = 200, content_type: str = "application/json") -> web.Response:
    return web.Response(status=status, body=msgspec.json.encode(payload), content_type=content_type)


def rejection_response(rejection: Rejection) -> web.Response:
    return json_body(rejection.body, rejection.status)


async def run_job(request: web.Request, handler: Callable[[Job], Awaitable[web.StreamResponse]],
                  *, unit: str = "units") -> web.StreamResponse:
    """Run `handler` as one job: counted in flight throughout, its end logged exactly once.

    The app runs with handler_cancellation, so a client that goes away cancels the handler
    wherever it waits (reading the upload, working, between streamed chunks); a write to a socket
    already closed raises ConnectionResetError instead. Both are the client leaving."""
    state = request.app[STATE]
    job = Job(request, state, unit=unit)
    state.stats.begin()
    try:
        response = await handler(job)
    except asyncio.CancelledError:
        _cancelled(job)
        raise
    except (ConnectionResetError, ConnectionError):
        _cancelled(job)
        raise
    except Dropped:
        state.stats.failed += 1
        state.log.write(f"failed path={request.path} after {job.done} {job.unit} seq={job.seq}")
        if request.transport is not None:
            request.transport.close()
        raise ConnectionResetError("stub: fail_after") from None
    finally:
        state.stats.end()
    if not job.outcome:
        state.stats.completed += 1
        state.log.write(f"completed path={request.path} {job.unit}={job.done} bytes_in={job.received} seq={job.seq}")
    return response


def _cancelled(job: Job) -> None:
    job.state.stats.cancelled += 1
    job.state.log.write(f"cancelled path={job.request.path} after {job.done} {job.unit} "
                        f"and {job.received} bytes in seq={job.seq}")


def check_key(job: Job, rejection: Callable[[], Rejection]) -> web.Response | None:
    if authorized(job.request, job.state.config.api_key):
        return None
    job.reject(401)
    return rejection_response(rejection())


@dataclass
class Upload:
    """A multipart form read as it arrives: the text fields kept, each file only counted (and its
    first bytes kept, for a WAV header), never held whole."""

    fields: dict[str, str] = field(default_factory=dict)
    lists: dict[str, list[str]] = field(default_factory=dict)
    files: dict[str, list[tuple[str, int, bytes]]] = field(default_factory=dict)  # name -> (filename, size, head)

    def file(self, name: str) -> tuple[str, int, bytes] | None:
        got = self.files.get(name)
        return got[0] if got else None


class NotMultipart(Exception):
    pass


async def read_upload(job: Job, *, head_bytes: int = 64) -> Upload:
    """Read the request's multipart body part by part, 64 KiB at a time, counting every byte
    into the job and /stub/stats' upload_bytes as it comes. A `read_ms` directive in a text field
    read before the file slows the reading down (or --upload-read-ms for every upload)."""
    request = job.request
    if not request.content_type.startswith("multipart/"):
        raise NotMultipart
    stats = job.state.stats
    read_ms = job.state.config.upload_read_ms
    upload = Upload()
    reader = await request.multipart()
    while True:
        part = await reader.next()
        if part is None:
            break
        # a part that is itself a multipart form: no client of these endpoints sends one, and
        # the stub reads none (as before, where it failed on the part's missing name)
        assert isinstance(part, BodyPartReader), "a nested multipart part"
        name = part.name or ""
        if part.filename is None:  # a text field
            value = (await part.read(decode=True)).decode("utf-8", errors="replace")
            job.received += len(value)
            if name.endswith("[]"):
                upload.lists.setdefault(name, []).append(value)
            else:
                upload.fields[name] = value
            directive = parse_media_directives(value)
            if directive.read_ms is not None:
                read_ms = directive.read_ms
            continue
        size, head = 0, b""
        while True:
            chunk = await part.read_chunk(READ_CHUNK)
            if not chunk:
                break
            if len(head) < head_bytes:
                head += chunk[: head_bytes - len(head)]
            size += len(chunk)
            job.received += len(chunk)
            stats.upload_bytes += len(chunk)
            await sleep_ms(read_ms)
        upload.files.setdefault(name, []).append((part.filename, size, head))
    job.state.log.write(f"upload bytes={job.received} seq={job.seq}")
    return upload


def wav_seconds(head: bytes, size: int) -> float | None:
    """The duration of a WAV file from its header (RIFF, fmt chunk first, as espeak-ng, sox and
    the tests write it), or None when it is not one. A streamed WAV's sizes may be 0 or
    0xFFFFFFFF: then the file's size stands in for the data chunk's."""
    if len(head) < 44 or head[:4] != b"RIFF" or head[8:12] != b"WAVE" or head[12:16] != b"fmt ":
        return None
    byte_rate = struct.unpack_from("<I", head, 28)[0]
    if byte_rate <= 0:
        return None
    return max(size - 44, 0) / byte_rate


def pcm_tone(nbytes: int, offset: int = 0, rate: int = 24000) -> bytes:
    """16-bit mono PCM of a quiet 440 Hz square-ish tone: audible bytes, deterministic."""
    period = rate // 440
    samples = []
    for i in range(offset // 2, offset // 2 + nbytes // 2):
        samples.append(2000 if (i % period) < period // 2 else -2000)
    return struct.pack(f"<{len(samples)}h", *samples)


def wav_header(rate: int = 24000, data_bytes: int = 0xFFFFFFFF - 36) -> bytes:
    """A WAV header for a stream whose length is not known yet (sizes at their maximum, as
    streaming TTS servers write it)."""
    riff = min(data_bytes + 36, 0xFFFFFFFF)
    return (b"RIFF" + struct.pack("<I", riff) + b"WAVE" + b"fmt " + struct.pack("<IHHIIHH", 16, 1, 1, rate, rate * 2, 2, 16)
            + b"data" + struct.pack("<I", min(data_bytes, 0xFFFFFFFF)))
