"""The stub's prefix cache, seen through the gateway: cached prompt tokens as the upstream reports
them become Anthropic's `cache_read_input_tokens` (streamed and not), `input_tokens` then excludes
them, and an upstream that reports none gets no cache field at all (seed 2.11)."""

from __future__ import annotations

import anthropic
import pytest

from gwproc import Gateway, config_for
from stubproc import start_stub

R1 = "deepseek-ai/DeepSeek-R1-Distill-Qwen-32B"
QWEN = "qwen2.5:3b-instruct"
SYSTEM = "You are a careful assistant. " * 40  # several cache blocks before the first user word


@pytest.fixture(scope="module")
def stack():
    cache = ("--prefix-cache-tokens", "100000", "--prefix-block", "16")
    with start_stub("vllm", "--model", R1, "--max-model-len", "32768", *cache) as vllm, \
         start_stub("ollama", "--model", QWEN, *cache) as ollama, \
         start_stub("vllm", "--model", R1, "--max-model-len", "32768") as nocache:
        cfg = config_for(
            {"gpu0": {"url": vllm.base, "kind": "vllm"}, "ollama": {"url": ollama.base, "kind": "ollama"},
             "plain": {"url": nocache.base, "kind": "vllm"}},
            {"cached": {"backend": "gpu0", "upstream_model": R1}, QWEN: {"backend": "ollama"},
             "uncached": {"backend": "plain", "upstream_model": R1}},
        )
        with Gateway(cfg) as gw:
            yield gw, vllm, ollama, nocache


def _turns():
    first = [{"role": "user", "content": "What is a prefix cache? [stub content=3]"}]
    second = first + [
        {"role": "assistant", "content": "Hello from the"},
        {"role": "user", "content": "And why does it matter? [stub content=3]"},
    ]
    return first, second


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_cached_prompt_tokens_are_cache_read_input_tokens(stack, stream):
    gw, vllm, _, _ = stack
    vllm.reset()  # also empties its cache
    client = anthropic.Anthropic(base_url=gw.llm, api_key="x", max_retries=0)
    usages = []
    for messages in _turns():
        if stream:
            with client.messages.stream(model="cached", max_tokens=16, system=SYSTEM, messages=messages) as s:
                usage = s.get_final_message().usage
        else:
            usage = client.messages.create(model="cached", max_tokens=16, system=SYSTEM, messages=messages).usage
        usages.append(usage.model_dump(exclude_none=True))
    seen = [r["cached_tokens"] for r in vllm.requests()]  # the upstream's own account
    assert seen[0] == 0 and seen[1] > 100, seen
    stats = vllm.stats()
    # vLLM 0.32 (--enable-prompt-tokens-details) reports a 0, and so do we: it read nothing
    assert usages[0]["cache_read_input_tokens"] == 0
    assert usages[1]["cache_read_input_tokens"] == seen[1]
    # input_tokens excludes the cached part: the two add up to the upstream's prompt_tokens
    assert usages[0]["input_tokens"] + usages[1]["input_tokens"] + seen[1] == stats["prompt_tokens"]
    assert "cache_creation_input_tokens" not in usages[1]


@pytest.mark.parametrize("model", ["uncached", QWEN])
def test_no_cache_field_when_the_upstream_reports_none(stack, model):
    """A vLLM without the cache model, and Ollama (which never reports cached tokens even when it
    reuses its cache): input and output tokens only, nothing invented."""
    gw = stack[0]
    client = anthropic.Anthropic(base_url=gw.llm, api_key="x", max_retries=0)
    for messages in _turns():
        whole = client.messages.create(model=model, max_tokens=16, system=SYSTEM, messages=messages)
        assert set(whole.usage.model_dump(exclude_none=True)) == {"input_tokens", "output_tokens"}
        with client.messages.stream(model=model, max_tokens=16, system=SYSTEM, messages=messages) as s:
            final = s.get_final_message()
        assert set(final.usage.model_dump(exclude_none=True)) == {"input_tokens", "output_tokens"}
