"""`encrypted_content` of reasoning items: the reasoning text sealed so that only this gateway
(any replica sharing its secret) can read it back, and nobody can forge one.

Clients that keep no server-side state (`store: false`, Codex) get their reasoning back across
turns by sending this blob in the next request's `input`. The gateway opens it and passes the text
upstream as the assistant's reasoning; a blob that does not open (forged, truncated, another
gateway's, made before a secret change) is dropped, never a 4xx/5xx: the conversation goes on
without that reasoning.

Construction (no third-party crypto in the dependency set): encrypt-then-MAC over the standard
library. Keys come from the thinking-signature secret (`ThinkingSigner.derive`), one for the
keystream and one for the MAC. The keystream is HMAC-SHA256(k_enc, nonce || counter) blocks (a PRF
in counter mode) XORed with the UTF-8 text; the tag is HMAC-SHA256(k_mac, version || nonce ||
ciphertext). The nonce is 16 random bytes per blob. Wire form: "hlfr1." + urlsafe base64 of
nonce || ciphertext || tag.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os

from ..signature import ThinkingSigner

_PREFIX = "hlfr1."
_NONCE = 16
_TAG = 32


class ReasoningSealer:
    def __init__(self, signer: ThinkingSigner) -> None:
        self._enc = signer.derive(b"responses-reasoning-enc")
        self._mac = signer.derive(b"responses-reasoning-mac")

    def _stream(self, nonce: bytes, n: int) -> bytes:
        out = bytearray()
        counter = 0
        while len(out) < n:
            out += hmac.new(self._enc, nonce + counter.to_bytes(8, "big"), hashlib.sha256).digest()
            counter += 1
        return bytes(out[:n])

    def _tag(self, nonce: bytes, ct: bytes) -> bytes:
        return hmac.new(self._mac, _PREFIX.encode() + nonce + ct, hashlib.sha256).digest()

    def seal(self, text: str) -> str:
        data = text.encode()
        nonce = os.urandom(_NONCE)
        ct = _xor(data, self._stream(nonce, len(data)))
        blob = nonce + ct + self._tag(nonce, ct)
        return _PREFIX + base64.urlsafe_b64encode(blob).decode().rstrip("=")

    def open(self, blob: object) -> str | None:
        """The sealed text, or None for anything this gateway did not seal."""
        if not isinstance(blob, str) or not blob.startswith(_PREFIX):
            return None
        body = blob[len(_PREFIX):]
        try:
            raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
        except (binascii.Error, ValueError):
            return None
        if len(raw) < _NONCE + _TAG:
            return None
        nonce, ct, tag = raw[:_NONCE], raw[_NONCE:-_TAG], raw[-_TAG:]
        if not hmac.compare_digest(tag, self._tag(nonce, ct)):
            return None
        data = _xor(ct, self._stream(nonce, len(ct)))
        try:
            return data.decode()
        except UnicodeDecodeError:
            return None


def _xor(a: bytes, b: bytes) -> bytes:
    return (int.from_bytes(a, "big") ^ int.from_bytes(b, "big")).to_bytes(len(a), "big")
