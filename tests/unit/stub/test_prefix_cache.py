"""The stub's prefix-cache model: longest common prefix in whole blocks, bounded, LRU."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from support.scale import examples

from homelab_frontend.stub.prefix_cache import PrefixCache, common_prefix

ids = st.lists(st.integers(0, 3), max_size=60)


def _naive(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@given(ids, ids)
def test_common_prefix_matches_the_naive_definition(a, b):
    assert common_prefix(a, b) == _naive(a, b)
    assert common_prefix(tuple(a), tuple(a + b)) == len(a)


@settings(max_examples=examples(200))
@given(st.lists(ids, min_size=1, max_size=8), st.integers(1, 8), st.integers(1, 200))
def test_lookup_is_whole_blocks_of_a_prompt_seen_before(prompts, block, capacity):
    cache = PrefixCache(capacity, block)
    seen: list[list[int]] = []
    for p in prompts:
        got = cache.lookup(p)
        best = max((_naive(s, p) for s in seen), default=0)
        assert got % block == 0
        assert 0 <= got <= max(len(p) - 1, 0)
        assert got <= best  # never more than some earlier prompt shares
        assert cache.total <= capacity
        seen.append(p)


def test_a_growing_conversation_reuses_all_but_the_new_tail():
    cache = PrefixCache(10_000, block=4)
    turn1 = list(range(40))
    assert cache.lookup(turn1) == 0
    turn2 = turn1 + list(range(100, 110))
    assert cache.lookup(turn2) == 40
    assert len(cache) == 1  # turn 2 replaced turn 1, which it contains
    assert cache.lookup(turn2) == 48  # the whole prompt less the last (partial) block
    other = [7] + turn1
    assert cache.lookup(other) == 0  # a different first token shares nothing


def test_least_recently_used_prompts_go_first():
    cache = PrefixCache(100, block=1)
    a, b, c = [1] * 40, [2] * 40, [3] * 40
    cache.lookup(a)
    cache.lookup(b)
    cache.lookup(a + [0])  # touches a (now a+[0])
    cache.lookup(c)  # over capacity: b, the least recently used, goes
    assert cache.lookup(b + [9]) == 0
    assert cache.lookup(c + [9]) == 40
