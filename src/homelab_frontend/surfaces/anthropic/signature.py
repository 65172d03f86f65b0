"""Thinking-block signatures: an HMAC of the thinking text under the gateway's secret.

Anthropic clients require a `signature` on every thinking block and send it back with the block in
later requests' history. Ours lets the gateway recognise a thinking block it produced itself
(and so send it upstream as reasoning) from one that was forged or came from elsewhere (dropped).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os

_PREFIX = "hlf1."  # versioned, so a later scheme can be told apart


class ThinkingSigner:
    def __init__(self, secret: bytes | None = None) -> None:
        self._secret = secret if secret is not None else os.urandom(32)

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
