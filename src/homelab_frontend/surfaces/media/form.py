"""The head of a multipart/form-data upload: enough of it to route, never the file. Pure.

An audio or image upload is relayed to the backend as it arrives, so the gateway must learn
the form's `model` (to route it) without holding the file. `FormHead` is fed the body's bytes
as they come and says when it has seen enough: the `model` field and the start of the first
file part's content (or the body's end). Many clients put their text fields before the file
(OpenAI's Python SDK through httpx, `requests`, Open WebUI, curl in the usual order), so the
head is usually a few hundred bytes. Others send the file first (OpenAI's JS SDK appends the
form's fields in the order of the request object, `{file, model}` in its own examples): a
`model` after the file is still found. While the bytes read so far stay under `limit`
(limits.max_form_head_bytes) they are kept in memory; past it, with a `spill` file given, the
file's bytes already scanned move to that file (the caller's temporary file, on disk), so memory
stays bounded by `limit` whatever the file's size; without a spill, `FormError` says to put
`model` first.

What it keeps: each text field's value (at most `FIELD_BYTES`, decoded as UTF-8), the name,
filename and content type of the first file part, and where the model's value sits in the
buffered bytes, so `relay_head` can write the head again with the backend's model name and any
fields a backend kind needs added (whisper.cpp's `translate`, a part of its own right after the
model's), its length change known for the new Content-Length. The spilled bytes (`spilled` of
them) come first, unchanged, then `relay_head`'s. Nothing after the head is parsed: the file and
whatever follows it pass through as bytes.
"""

from __future__ import annotations

import re

__all__ = ["FormError", "FormHead", "boundary_of"]

FIELD_BYTES = 64 * 1024  # a text field longer than this is kept as it is, not decoded
_MAX_PART_HEADERS = 16 * 1024
_PARAM = re.compile(r';\s*([A-Za-z0-9_*-]+)\s*=\s*("(?:[^"\\]|\\.)*"|[^;]*)')


class FormError(ValueError):
    """The body is no multipart form the gateway can route; the message names what is wrong."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def boundary_of(content_type: str | None) -> bytes:
    """The boundary of a `multipart/form-data` content type; FormError for anything else."""
    if not content_type or content_type.split(";", 1)[0].strip().lower() != "multipart/form-data":
        raise FormError(f"the body must be multipart/form-data (got {(content_type or 'no content type')!r})")
    for name, value in _PARAM.findall(content_type):
        if name.lower() == "boundary":
            value = value.strip()
            if value.startswith('"'):
                value = value[1:-1]
            if 1 <= len(value) <= 200:
                return value.encode("latin-1", "replace")
    raise FormError("the multipart/form-data content type has no boundary")


def _disposition(headers: bytes) -> tuple[str | None, str | None, str | None]:
    """(name, filename, content type) of one part's headers."""
    name = filename = ctype = None
    for line in headers.decode("utf-8", "replace").split("\r\n"):
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key == "content-disposition":
            for pname, pvalue in _PARAM.findall(";" + value.split(";", 1)[1] if ";" in value else ""):
                pvalue = pvalue.strip()
                if pvalue.startswith('"'):
                    pvalue = pvalue[1:-1].replace('\\"', '"')
                if pname.lower() == "name":
                    name = pvalue
                elif pname.lower() == "filename":
                    filename = pvalue
        elif key == "content-type":
            ctype = value.strip()
    return name, filename, ctype


class FormHead:
    """Feed it bytes until `feed` returns True (or `finish()` at the body's end)."""

    def __init__(self, boundary: bytes, file_fields: tuple[str, ...], limit: int, spill=None) -> None:
        self.dash = b"--" + boundary
        self.delim = b"\r\n--" + boundary
        self.file_fields = file_fields  # names of the file parts (`file`; `image`, `image[]`)
        self.limit = limit
        self.buf = bytearray()
        self.fields: dict[str, list[str]] = {}
        self.file_name: str | None = None  # the form field's name of the first file part
        self.filename: str | None = None
        self.file_type: str | None = None
        self.model_span: tuple[int, int] | None = None
        self.first_part = -1  # where the first delimiter begins (after any preamble)
        self.head_end = -1  # the file part's content begins here (or the body's end)
        self.ended = False  # the closing delimiter was seen
        self.file_at_end = False  # the head ends where a file's content begins (its first bytes follow)
        self._pos = 0  # start of the next delimiter to read
        self._state = "start"  # start | headers | content | done
        self._content_start = 0
        self._part: tuple[str | None, str | None, str | None] = (None, None, None)
        self._scan_from = 0
        self.spill = spill  # a binary file the file's scanned bytes move to past `limit` (or None)
        self.spilled = 0  # bytes moved there: they precede buf

    @property
    def model(self) -> str | None:
        got = self.fields.get("model")
        return got[0] if got else None

    @property
    def done(self) -> bool:
        return self._state == "done"

    def feed(self, data: bytes) -> bool:
        """True once the head is complete: `model` known and a file part's content begun, or
        the body ended. Raises FormError for a malformed form or a head over the limit."""
        self.buf += data
        self._scan()
        if not self.done and len(self.buf) > self.limit and self._spill():
            return False
        if not self.done and len(self.buf) > self.limit:
            if self.file_name is not None and self.model is None:
                raise FormError(f"the form's `model` field was not found in its first {self.limit} bytes: "
                                "send `model` before the file (limits.max_form_head_bytes)", param="model")
            raise FormError(f"the form's fields take more than {self.limit} bytes before the file "
                            "(limits.max_form_head_bytes)")
        return self.done

    def _spill(self) -> bool:
        """Move the scanned bytes of a file part whose content is being read, with the model
        not yet seen, out to the spill file. -> whether memory is back under the limit."""
        if self.spill is None or self._state != "content" or self.model is not None:
            return False
        name, filename, _ = self._part
        if not self._is_file(name, filename):
            return False
        n = self._scan_from
        if n <= 0:
            return False
        self.spill.write(bytes(self.buf[:n]))
        del self.buf[:n]
        self.spilled += n
        # every position kept is relative to buf: those before the cut become negative, and
        # none of them is read again (the part's start and its content so far lie in the spill)
        self._pos -= n
        self._content_start -= n
        self._scan_from = 0
        self.first_part -= n
        return len(self.buf) <= self.limit

    def finish(self) -> None:
        """The body ended: it must have ended the form too."""
        if not self.done:
            raise FormError("the multipart body ends before its closing boundary")

    def _scan(self) -> None:
        buf = self.buf
        while self._state != "done":
            if self._state == "start":
                if self.first_part < 0:
                    i = buf.find(self.dash)
                    if i < 0:
                        return
                    self.first_part = self._pos = i
                end = self._pos + len(self.dash)
                if len(buf) < end + 2:
                    return
                tail = bytes(buf[end:end + 2])
                if tail == b"--":
                    self.ended = True
                    self.head_end = len(buf)
                    self._state = "done"
                    return
                if tail != b"\r\n":
                    raise FormError("malformed multipart body: a boundary is not followed by a line break")
                self._hstart = end + 2
                self._state = "headers"
            if self._state == "headers":
                i = buf.find(b"\r\n\r\n", self._hstart)
                if i < 0:
                    if len(buf) - self._hstart > _MAX_PART_HEADERS:
                        raise FormError("malformed multipart body: a part's headers are too long")
                    return
                self._part = _disposition(bytes(buf[self._hstart:i]))
                if self._part[0] is None:
                    raise FormError("malformed multipart body: a part without a form-data name")
                self._content_start = self._scan_from = i + 4
                name, filename, ctype = self._part
                if self._is_file(name, filename):
                    if self.file_name is None:
                        self.file_name, self.filename, self.file_type = name, filename, ctype
                    if self.model is not None:
                        self.head_end = self._content_start
                        self.file_at_end = True
                        self._state = "done"
                        return
                self._state = "content"
            if self._state == "content":
                j = buf.find(self.delim, self._scan_from)
                if j < 0:
                    self._scan_from = max(self._content_start, len(buf) - len(self.delim))
                    return
                name, filename, _ = self._part
                if not self._is_file(name, filename):
                    raw = bytes(buf[self._content_start:j])
                    if name == "model" and self.model_span is None:
                        self.model_span = (self._content_start, j)
                    if len(raw) <= FIELD_BYTES:
                        self.fields.setdefault(name or "", []).append(raw.decode("utf-8", "replace"))
                self._pos = j + 2
                self._state = "start"

    def _is_file(self, name: str | None, filename: str | None) -> bool:
        return filename is not None or name in self.file_fields

    def relay_head(self, model: str, extra: dict[str, str] | None = None) -> bytes:
        """The buffered head as the backend gets it (after the `spilled` bytes): the `model`
        field's value replaced by `model`, `extra` fields added as parts right after it. The
        bytes after it are `buf[head_end:]`."""
        assert self.done and self.model_span is not None
        a, b = self.model_span
        buf = self.buf
        added = b"".join(self.dash + b"\r\nContent-Disposition: form-data; name=\"" + k.encode() + b"\"\r\n\r\n"
                         + v.encode() + b"\r\n" for k, v in (extra or {}).items())
        after = b + 2  # the model's value ends with CRLF, and the next delimiter starts there
        return (bytes(buf[:a]) + model.encode("utf-8") + bytes(buf[b:after]) + added
                + bytes(buf[after:self.head_end]))

    @property
    def rest(self) -> bytes:
        """What was read past the head (the file's first bytes)."""
        return bytes(self.buf[self.head_end:])
