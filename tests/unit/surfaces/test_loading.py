"""surfaces/loading.py and the dialects' loading frames: the SSE comment (a comment line, one
event, the model named, no line break smuggled in), frames each SDK's own types accept, and the
admission untouched for a request that is not a stream or never waits for a load."""

from __future__ import annotations

import asyncio
import json

import ollama
from openai.types.chat import ChatCompletionChunk

from homelab_frontend.errors import GatewayError
from homelab_frontend.request.tracker import Tracked
from homelab_frontend.surfaces import loading
from homelab_frontend.surfaces.ollama.handler import OllamaTurn
from homelab_frontend.surfaces.ollama.request import parse_chat, parse_generate
from homelab_frontend.surfaces.openai.handler import _Loading


def test_the_sse_comment_is_one_comment_naming_the_model():
    frame = loading.sse_comment("qwen\n\ndata: {}", 12.4)
    assert frame.startswith(b": loading model ") and frame.endswith(b"\n\n") and frame.count(b"\n") == 2
    assert b"(12 s)" in frame


def test_the_openai_note_is_a_chunk_the_sdk_reads_and_the_rest_are_comments():
    an = _Loading("m")
    assert an.loading_frame("m", 3.0, False, True).startswith(b": loading")
    assert an.loading_frame("m", 0.0, True, False).startswith(b": loading")
    note = an.loading_frame("m", 0.0, True, True)
    chunk = ChatCompletionChunk.model_validate(json.loads(note.removeprefix(b"data: ")))
    assert chunk.choices[0].delta.model_extra["reasoning_content"] == "loading model m...\n"
    err = json.loads(an.early_failure(GatewayError("overloaded", "backend 'a' failed to start")).removeprefix(b"data: "))
    assert err["error"]["message"] == "backend 'a' failed to start"


def _ollama(body: bytes, parse=parse_chat) -> OllamaTurn:
    async def make():
        return OllamaTurn(parse(body), Tracked("r", "ollama", "m", None, True))
    return asyncio.run(make())


def test_ollamas_frames_are_empty_chunks_the_library_reads():
    chat = _ollama(b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}')
    plain = ollama.ChatResponse.model_validate_json(chat.loading_frame("m", 1.0, False, True))
    assert plain.message.content == "" and plain.message.thinking is None and plain.done is False
    noted = ollama.ChatResponse.model_validate_json(chat.loading_frame("m", 0.0, True, True))
    assert noted.message.thinking == "loading model m...\n"
    gen = _ollama(b'{"model": "m", "prompt": "hi"}', parse_generate)
    doc = ollama.GenerateResponse.model_validate_json(gen.loading_frame("m", 0.0, True, False))
    assert doc.response == "" and doc.done is False


def test_admission_is_untouched_without_a_stream_a_load_or_an_interval():
    async def main():
        calls = []

        async def admit():
            calls.append(1)

        for stream, interval in ((False, 5.0), (True, 0.0)):
            t = Tracked("r", "openai", "m", None, stream)
            request: dict = {}
            await loading.admit(request, t, admit, _Loading("m"), dict, interval, False)
            assert loading.EARLY not in request
        t = Tracked("r", "openai", "m", None, True)
        t.queued()  # waits for a busy backend, not a load: no early headers

        async def slow():
            await asyncio.sleep(0.2)

        request = {}
        await loading.admit(request, t, slow, _Loading("m"), dict, 0.05, False)
        assert loading.EARLY not in request and calls == [1, 1]

    asyncio.run(main())
