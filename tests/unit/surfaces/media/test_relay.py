"""The relay's own decisions (surfaces/media/relay.py): an upload's bytes counted against its
limit and replayed only while none went out, a JSON answer checked before it is relayed, and a
kind without the endpoint said in a 400. Over real sockets: tests/integration/test_media_*.py."""

from __future__ import annotations

import asyncio

import pytest

from homelab_frontend.config import Backend
from homelab_frontend.errors import GatewayError
from homelab_frontend.surfaces.media.form import FormHead
from homelab_frontend.surfaces.media.relay import Upload, _checked, _is_json, path_for


class _Content:
    """The client's body as aiohttp hands it over: readany() until b""."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = list(chunks)

    async def readany(self) -> bytes:
        return self.chunks.pop(0) if self.chunks else b""

    def read_nowait(self, n: int = -1) -> bytes:
        return b""  # nothing else buffered: each piece comes by readany


class _Request:
    def __init__(self, chunks: list[bytes], length: int | None) -> None:
        self.content = _Content(chunks)
        self.content_length = length
        self.headers = {"content-type": "multipart/form-data; boundary=b"}


class _Gw:
    def __init__(self) -> None:
        self.noted = None

    def note_body(self, request, size: int) -> None:
        self.noted = size


HEAD = (b'--b\r\nContent-Disposition: form-data; name="model"\r\n\r\nwhisper-1\r\n'
        b'--b\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\n')
TAIL = b"\r\n--b--\r\n"


def _upload(file_chunks: list[bytes], limit: int = 1 << 20, declared: int | None = -1):
    first = HEAD + b"RIFF"
    rest = [*file_chunks, TAIL]
    total = len(first) + sum(map(len, rest))
    form = FormHead(b"b", ("file",), 1 << 16)
    assert form.feed(first)
    gw = _Gw()
    req = _Request(rest, total if declared == -1 else declared)
    return Upload(req, gw, form, len(first), limit), gw, total


async def _drain(it) -> bytes:
    return b"".join([c async for c in it])


def test_the_upload_goes_out_with_the_backends_model_and_its_length():
    up, gw, total = _upload([b"x" * 1000, b"y" * 1000])
    headers = up.prepare("ggml-base.bin", {})
    sent = asyncio.run(_drain(up.fresh()))
    assert b"ggml-base.bin" in sent and b"whisper-1" not in sent
    assert int(headers["content-length"]) == len(sent) == total + len("ggml-base.bin") - len("whisper-1")
    assert gw.noted == total


def test_an_upload_is_sent_twice_only_while_none_of_the_live_stream_went_out():
    up, _, _ = _upload([b"x" * 10])
    up.prepare("m", {})
    gen = up.fresh()
    asyncio.run(_drain(gen))
    with pytest.raises(GatewayError, match="cannot be sent twice"):
        up.fresh()


def test_a_body_read_whole_with_its_head_can_be_sent_again():
    form = FormHead(b"b", ("file",), 1 << 16)
    whole = HEAD + b"RIFF" + TAIL
    assert form.feed(whole)
    up = Upload(_Request([], len(whole)), _Gw(), form, len(whole), 1 << 20)
    up.prepare("m", {})
    first, second = asyncio.run(_drain(up.fresh())), asyncio.run(_drain(up.fresh()))
    assert first == second and first.endswith(TAIL) and not up.live


def test_growing_past_the_limit_is_a_413_the_client_is_blamed_for():
    up, _, _ = _upload([b"x" * 4000] * 5, limit=10_000, declared=None)
    up.prepare("m", {})
    with pytest.raises(GatewayError) as err:
        asyncio.run(_drain(up.fresh()))
    assert err.value.kind == "request_too_large" and up.failure is err.value


def test_a_body_shorter_than_it_said_is_the_clients_failure():
    up, _, total = _upload([b"x" * 100], declared=None)
    up.expected = total + 50
    up.prepare("m", {})
    with pytest.raises(GatewayError, match="ended after"):
        asyncio.run(_drain(up.fresh()))
    assert up.failure is not None


def test_json_answers_are_checked():
    assert _checked(b'{"results": []}', "b") == {"results": []}
    for raw, kind in ((b"[1]", "upstream_malformed"), (b"nope", "upstream_malformed"),
                      (b'{"error": {"message": "boom"}}', "upstream_error")):
        with pytest.raises(GatewayError) as err:
            _checked(raw, "b")
        assert err.value.kind == kind and "'b'" in err.value.message


def test_answers_that_must_carry_a_list_do():
    assert _checked(b'{"results": [{"index": 0}]}', "b", "results")["results"]
    for raw in (b'{"results": "x"}', b'{"data": []}', b'{"results": [1]}'):
        with pytest.raises(GatewayError) as err:
            _checked(raw, "b", "results")
        assert err.value.kind == "upstream_malformed" and "`results`" in err.value.message


def test_json_content_types():
    assert _is_json("application/json; charset=utf-8") and _is_json("application/problem+json")
    assert not _is_json("text/event-stream") and not _is_json("audio/mpeg") and not _is_json("text/plain")


def test_a_kind_without_the_endpoint_is_a_400_naming_the_model():
    with pytest.raises(GatewayError) as err:
        path_for(Backend(url="http://h/v1", kind="llamacpp"), "score", "rr")
    assert err.value.kind == "invalid_request" and "'rr'" in err.value.message and err.value.param == "model"


def test_a_file_spilled_to_disk_goes_out_first_then_the_rewritten_head_then_the_rest():
    from homelab_frontend.surfaces.media.relay import Spill

    file = bytes(range(256)) * 64  # 16 KiB
    body = (b'--b\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\n' + file
            + b'\r\n--b\r\nContent-Disposition: form-data; name="model"\r\n\r\nwhisper-1\r\n--b--\r\n')
    spill = Spill()
    form = FormHead(b"b", ("file",), 4096, spill=spill)
    pieces = [body[i:i + 1024] for i in range(0, len(body), 1024)]
    read = 0
    while pieces:
        piece = pieces.pop(0)
        read += len(piece)
        if form.feed(piece):
            break
    assert form.spilled > 0 and form.model == "whisper-1"
    up = Upload(_Request(pieces, len(body)), _Gw(), form, read, 1 << 20)
    headers = up.prepare("ggml.bin", {"translate": "true"})
    try:
        sent = asyncio.run(_drain(up.fresh()))
        assert asyncio.run(_drain(up.fresh())) == sent  # read whole with its head: it can go again
    finally:
        spill.close()
    assert int(headers["content-length"]) == len(sent)
    assert sent == body.replace(b"whisper-1\r\n", b'ggml.bin\r\n--b\r\nContent-Disposition: form-data; '
                                                  b'name="translate"\r\n\r\ntrue\r\n')
    assert up.audio_seconds() is None  # the file's header went by before the head: not guessed
