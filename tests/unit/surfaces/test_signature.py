"""Thinking-block signatures (surfaces/signature.py): the HMAC of a thinking text, the keys
derived from the same secret, and reasoning sealed into a signature: pure."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.scale import examples

from homelab_frontend.surfaces.signature import ThinkingSigner

SIGNER = ThinkingSigner(b"unit-test-secret")


def test_a_signature_verifies_its_text_under_its_secret_only():
    sig = SIGNER.sign("Okay, greet.")
    assert sig.startswith("hlf1.") and "=" not in sig
    assert SIGNER.verify("Okay, greet.", sig)
    assert ThinkingSigner(b"unit-test-secret").verify("Okay, greet.", sig)  # a replica sharing the secret
    assert not SIGNER.verify("Okay, greet!", sig)
    assert not ThinkingSigner(b"another gateway").verify("Okay, greet.", sig)
    assert ThinkingSigner().sign("x") != ThinkingSigner().sign("x")  # no secret: a random one each


@pytest.mark.parametrize("signature", [None, "", "hlf1.", "é" * 10, 42, SIGNER.seal("Okay, greet.")],
                         ids=["none", "empty", "prefix-only", "non-ascii", "not-a-string", "a-seal-of-the-text"])
def test_anything_else_does_not_verify(signature):
    assert SIGNER.verify("Okay, greet.", signature) is False


@given(st.lists(st.text(max_size=50), max_size=6))
def test_the_incremental_mac_over_the_deltas_is_the_signature_of_their_text(deltas):
    mac = SIGNER.begin()
    for d in deltas:
        mac.update(d.encode())
    assert SIGNER.finish(mac) == SIGNER.sign("".join(deltas))


def test_derived_keys_differ_by_label_and_secret_and_repeat_for_both():
    a = SIGNER.derive(b"responses-reasoning-enc")
    assert len(a) == 32 and a == ThinkingSigner(b"unit-test-secret").derive(b"responses-reasoning-enc")
    assert a != SIGNER.derive(b"responses-reasoning-mac")
    assert a != ThinkingSigner(b"other").derive(b"responses-reasoning-enc")
    assert a != b"unit-test-secret"


def test_a_plain_signature_or_another_gateways_seal_unseals_to_nothing():
    assert SIGNER.unseal(SIGNER.sign("x")) is None
    assert ThinkingSigner(b"another gateway").unseal(SIGNER.seal("x")) is None
    for junk in (None, "", "hlf2.", "hlf2.!!!!", "hlf2." + "A" * 20, "é" * 10):
        assert SIGNER.unseal(junk) is None


def test_sealing_hides_the_text_and_every_seal_differs():
    a, b = SIGNER.seal("secret reasoning"), SIGNER.seal("secret reasoning")
    assert a != b and "secret" not in a
    assert SIGNER.unseal(a) == SIGNER.unseal(b) == "secret reasoning"


@settings(max_examples=examples(200), deadline=None)
@given(st.text(max_size=2000), st.integers(min_value=0), st.sampled_from("AQgw-_"))
def test_sealed_text_round_trips_and_any_altered_character_is_refused(text, where, char):
    sealed = SIGNER.seal(text)
    assert SIGNER.unseal(sealed) == text
    i = len("hlf2.") + where % (len(sealed) - len("hlf2."))
    altered = sealed[:i] + char + sealed[i + 1:]
    if altered != sealed:
        # base64 padding bits aside (the last character may encode bits that are dropped), any
        # change to nonce, ciphertext or tag fails the tag
        assert SIGNER.unseal(altered) in (None, text)
        if i < len(sealed) - 1:
            assert SIGNER.unseal(altered) is None
