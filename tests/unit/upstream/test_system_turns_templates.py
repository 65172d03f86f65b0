"""The translated conversation rendered with real chat templates (tests/support/templates/):
why `system_turns: merge` is the default (tests/support/chat_templates.py has the method)."""

from __future__ import annotations

import pytest

from support.chat_templates import MODELS, measure

ALL = list(MODELS)
TOOLS = [t for t, (_, _, tools) in MODELS.items() if tools]


# Gemma 3's template has no tool role at all (a `tool` message fails it whatever the gateway
# does): it is measured on the plain conversation only.
CASES = [(t, True) for t in TOOLS] + [(t, False) for t in ALL]


@pytest.mark.parametrize("template, with_tools", CASES)
def test_merged_system_turns_every_template_accepts_and_the_start_never_moves(template, with_tools):
    row = measure(template, "merge", with_tools)
    assert row.error is None, row
    assert not row.late_system, row
    if template != "mistralai-Mistral-Nemo-Instruct-2407":  # it puts the system prompt at the LAST user turn
        assert row.start_stable, row


@pytest.mark.parametrize("template", [
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", "Qwen-Qwen2.5-7B-Instruct", "meta-llama-Llama-3.1-8B-Instruct"])
def test_merged_each_turn_renders_as_the_start_of_the_next(template):
    for with_tools in (True, False):
        assert measure(template, "merge", with_tools).prefix_stable


def test_native_system_turns_are_what_breaks_r1_gemma_and_mistral():
    """The measured reason for the default (docs/anthropic.md: System turns)."""
    r1 = measure("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", "native", True)
    # the last system message is hoisted over the system prompt (with the token counters dropped, the
    # output_config turn is what replaces it; the prefix may then hold from the third turn on)
    assert r1.error is None and not r1.start_stable
    for t in ("google-gemma-3-it", "mistralai-Mistral-Nemo-Instruct-2407", "Mistral-Small-3.2-24B-Instruct-2506"):
        assert measure(t, "native", False).error is not None, t
    # ... while these render native system turns in place, so `native` is an option for them
    for t in ("Qwen-Qwen2.5-7B-Instruct", "meta-llama-Llama-3.1-8B-Instruct"):
        row = measure(t, "native", True)
        assert row.error is None and row.start_stable and row.prefix_stable, row
