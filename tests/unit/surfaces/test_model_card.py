"""A model's card: its state from its backends', its capabilities from who tells (pure parts)."""

from __future__ import annotations

from hypothesis import given, strategies as st

from homelab_frontend.surfaces.model_card import (
    STATES, BackendCard, Card, backend_state, merge_capabilities, model_state,
)
from homelab_frontend.upstream.capabilities import Facts


def test_a_managed_backend_shows_its_lifecycle_state():
    assert backend_state("ready", True) == "loaded"
    assert backend_state("starting", True) == "loading"
    assert backend_state("sleeping", True) == "sleeping"
    assert backend_state("stopped", True) == "stopped"
    assert backend_state("draining", True) == backend_state("stopping", True) == "unloading"
    assert backend_state("failed", True) == "failed"


def test_an_unmanaged_backend_is_loaded_while_up():
    assert backend_state(None, True) == "loaded"
    assert backend_state(None, False) == "down"


def test_the_model_is_as_good_as_its_best_backend():
    assert model_state(["down", "loading"]) == "loading"
    assert model_state(["stopped", "loaded", "down"]) == "loaded"
    assert model_state(["sleeping", "stopped"]) == "sleeping"
    assert model_state([]) == "down"


@given(st.lists(st.sampled_from(STATES), min_size=1))
def test_model_state_is_one_of_its_backends(states):
    got = model_state(states)
    assert got in states and all(STATES.index(got) <= STATES.index(s) for s in states)


def test_backends_that_tell_win_and_agree():
    told = [("completion", "tools", "thinking"), ("completion", "thinking")]
    assert merge_capabilities(told, ["vision"], fim=False) == ("completion", "thinking")


def test_the_config_speaks_when_no_backend_does():
    assert merge_capabilities([], ["completion", "thinking"], fim=False) == ("completion", "thinking")
    assert merge_capabilities([], None, fim=False) == ("completion",)


def test_a_fim_template_adds_insert_once():
    assert merge_capabilities([], None, fim=True) == ("completion", "insert")
    assert merge_capabilities([("completion", "insert")], None, fim=True) == ("completion", "insert")


def test_a_card_counts_slots_of_backends_not_down():
    up = BackendCard("a", "vllm", "loaded", 4, 1, 0)
    down = BackendCard("b", "vllm", "down", 8, 0, 0)
    card = Card("m", "m", 4096, ("completion",), "loaded", (up, down), Facts(("completion",)))
    assert card.slots == 4 and card.loaded


def test_a_media_model_is_its_configured_list_or_its_kinds():
    from homelab_frontend.surfaces.model_card import media_capabilities

    assert media_capabilities(["rerank"], ["llamacpp"]) == ("rerank",)  # not what /props tells
    assert media_capabilities(None, ["whispercpp"]) == ("transcription",)
    assert media_capabilities(None, ["whispercpp", "whispercpp"]) == ("transcription",)
    assert media_capabilities(None, ["whispercpp", "openai"]) is None  # the openai one may chat
    assert media_capabilities(["completion", "tools"], ["vllm"]) is None
    assert media_capabilities(None, []) is None
    assert media_capabilities(["completion", "speech"], ["openai"]) == ("completion", "speech")  # as written
