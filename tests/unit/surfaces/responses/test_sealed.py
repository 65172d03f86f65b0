"""`encrypted_content` of reasoning items (surfaces/responses/sealed.py): sealed by this gateway,
opened by it and by a replica sharing its secret, and by nobody else: pure."""

from __future__ import annotations

import base64

import pytest
from hypothesis import given
from hypothesis import strategies as st

from homelab_frontend.surfaces.responses.sealed import ReasoningSealer
from homelab_frontend.surfaces.signature import ThinkingSigner

SEALER = ReasoningSealer(ThinkingSigner(b"test-secret"))


@given(st.text(max_size=3000))
def test_what_is_sealed_opens_to_the_same_text(text):
    assert SEALER.open(SEALER.seal(text)) == text


def test_a_blob_hides_its_text_differs_each_time_and_opens_on_a_replica_only():
    a, b = SEALER.seal("secret plan"), SEALER.seal("secret plan")
    assert a.startswith("hlfr1.") and a != b and "secret" not in a and "=" not in a
    assert ReasoningSealer(ThinkingSigner(b"test-secret")).open(a) == "secret plan"
    assert ReasoningSealer(ThinkingSigner(b"other")).open(a) is None


def test_the_thinking_signature_of_the_same_secret_is_no_blob():
    signer = ThinkingSigner(b"test-secret")
    assert SEALER.open(signer.seal("secret plan")) is None
    assert SEALER.open(signer.sign("secret plan")) is None


@given(st.integers(min_value=0), st.integers(min_value=1, max_value=255))
def test_any_changed_byte_of_nonce_ciphertext_or_tag_is_refused(where, flip):
    blob = SEALER.seal("a reasoning of some length")
    body = blob[len("hlfr1."):]
    raw = bytearray(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    raw[where % len(raw)] ^= flip
    forged = "hlfr1." + base64.urlsafe_b64encode(bytes(raw)).decode().rstrip("=")
    assert SEALER.open(forged) is None


@pytest.mark.parametrize("blob", [
    None, 1, b"hlfr1.", "", "hlfr1.", "hlfr1.!!!", "hlfr1.A", "hlfr1." + "A" * 40, "hlf2.abc", "x" * 100,
])
def test_junk_opens_to_nothing(blob):
    assert SEALER.open(blob) is None
