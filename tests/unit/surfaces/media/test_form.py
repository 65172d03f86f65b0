"""The head of a multipart upload (surfaces/media/form.py): found in any split of the body's
bytes, whatever order the fields come in, the model rewritten without touching the file, and a
clear error for what is no form. The oracle for the bodies is httpx's own multipart encoder (what
the OpenAI SDK sends) and for the rewritten body the standard library's MIME parser."""

from __future__ import annotations

import email.parser
import email.policy

import httpx
import pytest
from hypothesis import given, settings, strategies as st

from homelab_frontend.surfaces.media.form import FormError, FormHead, boundary_of

FILE = bytes(range(256)) * 40  # 10 KiB holding every byte value, CRLFs and dashes among them


def encoded(fields: list[tuple[str, str]], files: list[tuple[str, tuple[str, bytes, str]]]) -> tuple[bytes, str]:
    """A form as httpx (the OpenAI SDK's client) encodes it: data fields first, then files."""
    req = httpx.Request("POST", "http://x/", data=dict(fields), files=files)
    return req.read(), req.headers["content-type"]


def curl_order(parts: list[tuple[str, bytes, str | None]], boundary: str = "XyZ-b0und") -> tuple[bytes, str]:
    """A form with its parts in the given order (curl -F writes them as given; JS FormData too)."""
    out = b""
    for name, value, filename in parts:
        disp = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
        out += f"--{boundary}\r\nContent-Disposition: {disp}\r\n".encode()
        if filename:
            out += b"Content-Type: audio/wav\r\n"
        out += b"\r\n" + value + b"\r\n"
    return out + f"--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


def parse(body: bytes, ctype: str) -> dict[str, bytes]:
    msg = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
        f"Content-Type: {ctype}\r\n\r\n".encode() + body)
    return {part.get_param("name", header="content-disposition"): part.get_payload(decode=True)
            for part in msg.iter_parts()}


def feed_split(head: FormHead, body: bytes, cuts: list[int]) -> None:
    pos = 0
    for cut in sorted(set(c % (len(body) + 1) for c in cuts)) + [len(body)]:
        if head.feed(body[pos:cut]):
            return
        pos = cut
    head.finish()


@settings(max_examples=200, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=20_000), max_size=12),
       model_first=st.booleans())
def test_the_head_is_found_in_any_split_and_the_rewrite_keeps_the_file(cuts, model_first):
    fields = [("model", b"whisper-1", None), ("language", b"en", None), ("response_format", b"verbose_json", None)]
    file = ("file", FILE, "a.wav")
    parts = [*fields, file] if model_first else [file, *fields]
    body, ctype = curl_order(parts)
    head = FormHead(boundary_of(ctype), ("file",), 64 * 1024)
    feed_split(head, body, cuts)
    assert head.model == "whisper-1"
    assert head.fields["language"] == ["en"] and head.file_name == "file" and head.filename == "a.wav"
    # the body the backend gets: the head rewritten, then every byte after it as it came
    new_head = head.relay_head("ggml-base.en.bin", {"translate": "true"})
    rebuilt = new_head + body[head.head_end:]
    got = parse(rebuilt, ctype)
    assert got["model"] == b"ggml-base.en.bin" and got["translate"] == b"true"
    assert got["file"] == FILE and got["language"] == b"en"
    if model_first:  # the file was never read: the head ends where its content begins
        assert head.head_end <= body.index(FILE)


def test_httpx_form_as_the_openai_sdk_sends_it():
    body, ctype = encoded([("model", "whisper-1"), ("response_format", "json")],
                          [("file", ("speech.mp3", FILE, "audio/mpeg"))])
    head = FormHead(boundary_of(ctype), ("file",), 1 << 20)
    assert head.feed(body)
    assert head.model == "whisper-1" and head.file_type == "audio/mpeg"
    assert head.head_end == body.index(FILE)


def test_model_after_a_file_too_big_for_the_head_is_a_400_naming_model():
    body, ctype = curl_order([("file", FILE * 4, "a.wav"), ("model", b"whisper-1", None)])
    head = FormHead(boundary_of(ctype), ("file",), 16 * 1024)
    with pytest.raises(FormError, match="send `model` before the file") as err:
        feed_split(head, body, list(range(0, len(body), 4096)))
    assert err.value.param == "model"


def test_a_form_without_a_file_or_a_model_ends_at_its_closing_boundary():
    body, ctype = curl_order([("model", b"m", None)])
    head = FormHead(boundary_of(ctype), ("file",), 1 << 20)
    assert head.feed(body) and head.ended and head.file_name is None
    body, ctype = curl_order([("file", b"RIFF", "a.wav")])
    head = FormHead(boundary_of(ctype), ("file",), 1 << 20)
    assert head.feed(body) and head.model is None and head.file_name == "file"


def test_a_file_part_is_known_by_its_filename_or_its_field_name():
    body, ctype = curl_order([("model", b"sd", None), ("prompt", b"a cat", None), ("image[]", b"PNG", "x.png")])
    head = FormHead(boundary_of(ctype), ("image", "image[]"), 1 << 20)
    assert head.feed(body) and head.file_name == "image[]" and head.fields["prompt"] == ["a cat"]


@pytest.mark.parametrize("ctype, message", [
    (None, "must be multipart/form-data"),
    ("application/json", "must be multipart/form-data"),
    ("multipart/form-data", "has no boundary"),
    ("multipart/mixed; boundary=x", "must be multipart/form-data"),
])
def test_what_is_no_form_says_so(ctype, message):
    with pytest.raises(FormError, match=message):
        boundary_of(ctype)


def test_quoted_boundary():
    assert boundary_of('multipart/form-data; boundary="a b;c"') == b"a b;c"


def test_a_body_cut_short_is_malformed():
    body, ctype = curl_order([("model", b"m", None), ("file", FILE, "a.wav")])
    head = FormHead(boundary_of(ctype), ("file",), 1 << 20)
    assert not head.feed(body[:40])
    with pytest.raises(FormError, match="ends before its closing boundary"):
        head.finish()


def test_garbage_after_a_boundary_is_malformed():
    head = FormHead(b"b", ("file",), 1 << 20)
    with pytest.raises(FormError, match="malformed"):
        head.feed(b"--bXX\r\n")


def test_fields_that_never_end_hit_the_limit():
    head = FormHead(b"b", ("file",), 4096)
    head.feed(b'--b\r\nContent-Disposition: form-data; name="prompt"\r\n\r\n')
    with pytest.raises(FormError, match="more than 4096 bytes before the file"):
        head.feed(b"x" * 5000)


@settings(max_examples=150, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=60_000), max_size=20)
       .map(lambda c: c + list(range(0, 60_000, 3000))))  # pieces no larger than a socket read
def test_a_model_after_a_big_file_is_found_with_the_file_spilled_out_of_memory(cuts):
    """OpenAI's JS SDK sends `file` before `model`: past the limit the file's scanned bytes go to
    the spill file, memory stays within the limit (plus one read), and the body rebuilt from
    the spill, the rewritten head and the rest is the form with the backend's model."""
    import io

    big = FILE * 5  # 50 KiB
    body, ctype = curl_order([("file", big, "a.wav"), ("language", b"en", None), ("model", b"whisper-1", None)])
    spill = io.BytesIO()
    head = FormHead(boundary_of(ctype), ("file",), 4096, spill=spill)
    pos, peak = 0, 0
    for cut in sorted(set(c % (len(body) + 1) for c in cuts)) + [len(body)]:
        piece = body[pos:cut]
        pos = cut
        if head.feed(piece):
            break
        peak = max(peak, len(head.buf))
        assert len(head.buf) <= 4096 + len(piece) + len(head.delim)
    else:
        head.finish()
    assert head.model == "whisper-1" and head.spilled == len(spill.getvalue()) > 0
    rebuilt = spill.getvalue() + head.relay_head("ggml.bin", {"translate": "true"}) \
        + body[head.spilled + head.head_end:]
    got = parse(rebuilt, ctype)
    assert got["file"] == big and got["model"] == b"ggml.bin" and got["translate"] == b"true"
    assert got["language"] == b"en"


def test_without_a_spill_fields_before_the_file_over_the_limit_are_still_an_error():
    import io

    body, ctype = curl_order([("prompt", b"x" * 10_000, None), ("file", FILE, "a.wav"), ("model", b"m", None)])
    head = FormHead(boundary_of(ctype), ("file",), 4096, spill=io.BytesIO())
    with pytest.raises(FormError, match="before the file"):
        feed_split(head, body, list(range(0, len(body), 1000)))
