"""The official google-genai SDK as the oracle for the Gemini encoders: its pydantic response
types (`extra="forbid"`: an unknown or misspelt field fails validation) and its real streaming
client (`models.generate_content_stream` over an in-memory httpx2 transport: its SSE line reader,
its JSON-array-free `data:` parsing and its error detection)."""

from __future__ import annotations

import httpx2
from google import genai
from google.genai import types

_BOX: dict = {}


def client() -> genai.Client:
    c = _BOX.get("client")
    if c is None:
        def handler(request):
            _BOX["request"] = request
            return httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=_BOX["raw"])

        c = genai.Client(api_key="test", http_options=types.HttpOptions(
            base_url="http://gateway.test/llm", httpx_client=httpx2.Client(transport=httpx2.MockTransport(handler)),
            retry_options=types.HttpRetryOptions(attempts=1)))
        _BOX["client"] = c
    return c


def sdk_stream(raw: bytes) -> list[types.GenerateContentResponse]:
    """The chunks the SDK's streaming client yields for the body `raw` (raises its APIError)."""
    _BOX["raw"] = raw
    return list(client().models.generate_content_stream(model="gemini-x", contents="hi"))


def sse_chunks(raw: bytes) -> list[bytes]:
    """The JSON of each `data:` frame; asserts the framing is exactly Google's and nothing else
    (no comments, no blank keep-alive frames, no `[DONE]`, no raw separators)."""
    assert b"\xe2\x80\xa8" not in raw and b"\xe2\x80\xa9" not in raw
    assert raw.endswith(b"\r\n\r\n"), raw[-40:]
    frames = raw.split(b"\r\n\r\n")[:-1]
    out = []
    for f in frames:
        assert f.startswith(b"data: {") and b"\n" not in f and b"\r" not in f, f[:80]
        out.append(f[len(b"data: "):])
    return out


def validate(chunk: bytes | dict) -> types.GenerateContentResponse:
    if isinstance(chunk, dict):
        return types.GenerateContentResponse.model_validate(chunk)
    return types.GenerateContentResponse.model_validate_json(chunk)


def view(responses: list[types.GenerateContentResponse]) -> dict:
    """What a client makes of a stream (or of one whole answer): thoughts, text, calls, finish, usage."""
    thought, text, calls, signatures, finish, usage = [], [], [], [], None, None
    for r in responses:
        for cand in r.candidates or ():
            if cand.finish_reason is not None:
                finish = cand.finish_reason.value
            for p in (cand.content.parts or ()) if cand.content else ():
                if p.thought_signature:
                    signatures.append(p.thought_signature)
                if p.function_call is not None:
                    calls.append((p.function_call.id, p.function_call.name, p.function_call.args))
                elif p.thought:
                    thought.append(p.text or "")
                elif p.text is not None:
                    text.append(p.text)
        if r.usage_metadata is not None:
            usage = r.usage_metadata
    return {"thought": "".join(thought), "text": "".join(text), "calls": calls, "signatures": signatures,
            "finish": finish, "usage": usage}
