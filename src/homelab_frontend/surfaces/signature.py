"""Thinking-block signatures: an HMAC of the thinking text under the gateway's secret, or, for
thinking the client does not see (display "omitted"), the reasoning sealed into the signature.

Anthropic clients require a `signature` on every thinking block and send it back with the block in
later requests' history. Ours lets the gateway recognise a thinking block it produced itself
(and so send it upstream as reasoning) from one that was forged or came from elsewhere (dropped).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import zlib

_PREFIX = "hlf1."  # versioned, so a later scheme can be told apart


class ThinkingSigner:
    def __init__(self, secret: bytes | None = None) -> None:
        self._secret = secret if secret is not None else os.urandom(32)
        self._sealer = _Sealer(self._secret)

    def derive(self, label: bytes) -> bytes:
        """A key for another purpose under the same secret (the Responses surface seals its
        reasoning blobs with one), independent of the signing key and of every other label."""
        return hmac.new(self._secret, b"hlf-derive:" + label, hashlib.sha256).digest()

    def begin(self) -> "hmac.HMAC":
        """An incremental MAC: feed it each thinking delta (`mac.update(text.encode())`)."""
        return hmac.new(self._secret, digestmod=hashlib.sha256)

    @staticmethod
    def finish(mac: "hmac.HMAC") -> str:
        return _PREFIX + base64.urlsafe_b64encode(mac.digest()).decode().rstrip("=")

    def sign(self, text: str) -> str:
        mac = self.begin()
        mac.update(text.encode())
        return self.finish(mac)

    def verify(self, text: str, signature: str | None) -> bool:
        if not signature or not isinstance(signature, str):
            return False
        # compare bytes: compare_digest refuses non-ASCII str, and signatures are client input
        return hmac.compare_digest(self.sign(text).encode(), signature.encode("utf-8", "replace"))

    def seal(self, text: str) -> str:
        """A signature that carries `text` itself, encrypted and authenticated (see below)."""
        return self._sealer.seal(text)

    def unseal(self, signature: str | None) -> str | None:
        """The text `seal` put in `signature`; None if it is not one of ours, or was altered."""
        if not signature or not isinstance(signature, str) or not signature.isascii():
            return None
        return self._sealer.unseal(signature)


# -- sealed reasoning (thinking display "omitted") ----------------------------------------------
#
# With `thinking.display: "omitted"` the client gets thinking blocks with empty text, yet the
# model's reasoning must still go back upstream on the next turn: the signature then carries the
# reasoning itself, compressed, encrypted and authenticated (encrypt-then-MAC), so the gateway can
# restore it and nobody else can read or forge it. Stdlib only: the cipher is HMAC-SHA256 as a
# PRF in counter mode over a random 96-bit nonce, the tag HMAC-SHA256 over prefix, nonce and
# ciphertext, each under its own key derived from the secret.

_SEALED = "hlf2."
_NONCE = 12
_TAG = 32
_MAX_SEALED_CHARS = 8 * 1024 * 1024  # a bound before any work on client input


def _keystream(key: bytes, nonce: bytes, n: int) -> bytes:
    blocks = []
    for counter in range((n + 31) // 32):
        blocks.append(hmac.new(key, nonce + counter.to_bytes(8, "big"), hashlib.sha256).digest())
    return b"".join(blocks)[:n]


def _xor(data: bytes, stream: bytes) -> bytes:
    return (int.from_bytes(data, "big") ^ int.from_bytes(stream, "big")).to_bytes(len(data), "big")


class _Sealer:
    def __init__(self, secret: bytes) -> None:
        self._enc = hmac.new(secret, b"hlf2 encrypt", hashlib.sha256).digest()
        self._mac = hmac.new(secret, b"hlf2 authenticate", hashlib.sha256).digest()

    def seal(self, text: str) -> str:
        nonce = os.urandom(_NONCE)
        plain = zlib.compress(text.encode(), 6)
        ct = _xor(plain, _keystream(self._enc, nonce, len(plain)))
        tag = hmac.new(self._mac, _SEALED.encode() + nonce + ct, hashlib.sha256).digest()
        return _SEALED + base64.urlsafe_b64encode(nonce + ct + tag).decode().rstrip("=")

    def unseal(self, signature: str) -> str | None:
        if not signature.startswith(_SEALED) or len(signature) > _MAX_SEALED_CHARS:
            return None
        body = signature[len(_SEALED) :]
        try:
            raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
        except (ValueError, TypeError):
            return None
        if len(raw) < _NONCE + _TAG:
            return None
        nonce, ct, tag = raw[:_NONCE], raw[_NONCE:-_TAG], raw[-_TAG:]
        want = hmac.new(self._mac, _SEALED.encode() + nonce + ct, hashlib.sha256).digest()
        if not hmac.compare_digest(want, tag):
            return None
        try:
            # bounded: a sealed text is at most what one generation produced, 8 MiB of signature
            d = zlib.decompressobj()
            plain = d.decompress(_xor(ct, _keystream(self._enc, nonce, len(ct))), 64 * 1024 * 1024)
            return plain.decode() if not d.unconsumed_tail else None
        except (zlib.error, UnicodeDecodeError):
            return None
