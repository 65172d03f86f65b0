"""Cached prompt tokens from a real llama.cpp server reach Anthropic clients as
`cache_read_input_tokens`, streamed and not.

llama-server keeps each slot's last prompt in its KV cache and reports the reused part as
`usage.prompt_tokens_details.cached_tokens` (0 on a cold slot: a reported 0, passed on as such).
With one slot, turn 2 of a conversation reuses turn 1's prompt. llama-server and the model come
from `.ci/deps/llama-cpp.sh`; without them these tests fail (never skip), as CI requires.
"""

from __future__ import annotations


import anthropic
import pytest

from gwproc import Gateway, config_for
from llamaproc import module_llama

pytestmark = pytest.mark.timeout(300)
SYSTEM = "You answer in one short sentence. " * 12


# one slot: turn two lands on the slot whose cache holds turn one
llama = module_llama(parallel=1, ctx=4096)


@pytest.fixture(scope="module")
def gateway(llama):
    cfg = config_for({"llama": {"url": llama + "/v1", "kind": "llamacpp", "slots": 1, "max_model_len": 4096}},
                     {"gemma": {"backend": "llama"}})
    with Gateway(cfg) as gw:
        yield gw


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_turn_two_reads_turn_one_from_llamacpps_cache(gateway, stream):
    client = anthropic.Anthropic(base_url=gateway.llm, api_key="x", max_retries=0)
    opening = f"Tell me about cats ({'streamed' if stream else 'whole'})."  # cold for this test

    def ask(messages):
        kw = dict(model="gemma", max_tokens=8, system=SYSTEM, messages=messages)
        if stream:
            with client.messages.stream(**kw) as s:
                return s.get_final_message()
        return client.messages.create(**kw)

    first = ask([{"role": "user", "content": opening}])
    second = ask([{"role": "user", "content": opening},
                  {"role": "assistant", "content": first.content[0].text if first.content else ""},
                  {"role": "user", "content": "And dogs?"}])
    u1, u2 = first.usage, second.usage
    # turn 1: a cold slot for this conversation; llama.cpp reports how much it reused, maybe 0,
    # and the prompt is split into what it read and what it had
    total1 = u1.input_tokens + (u1.cache_read_input_tokens or 0)
    assert u1.cache_read_input_tokens is not None  # llama.cpp reports the field: passed on, even 0
    # turn 2 starts with turn 1's prompt, which the one slot still holds
    assert u2.cache_read_input_tokens >= 0.8 * total1, (u1, u2)
    assert u2.input_tokens + u2.cache_read_input_tokens > total1
    assert u2.cache_creation_input_tokens is None
