"""A model of an inference server's prefix (KV) cache, for the stub: which part of a prompt it
would not have to prefill again.

vLLM's automatic prefix caching and llama.cpp's slot cache keep the KV blocks of prompts they
have seen; a new prompt that starts with the same tokens reuses them, so its time to first token
is the cost of the *uncached* tokens only. That is the whole effect that makes a session's turns
cheap on the backend that served the previous turn and expensive anywhere else, so the stub
models exactly that, and nothing of attention itself:

- prompts are token-id sequences (the stub's pretend tokenizer, `script.prompt_token_ids`);
- a lookup finds the longest common prefix with any cached prompt, counted in whole blocks (vLLM
  hashes full blocks of `block` tokens; a partial block is recomputed), and never the whole prompt
  (the last token is always computed, as in vLLM, to produce the first output);
- each prompt is then cached itself (a cached prompt it extends is replaced by it), and the least
  recently used prompts are evicted once the total exceeds `capacity` tokens: a KV cache is a
  fixed amount of GPU memory, so one stub process holds a bounded amount however long it runs.

Pure: no I/O, no clocks. One instance per stub process (a "GPU").
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Sequence


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two sequences (binary search over C-speed slice
    comparisons: a Claude Code prompt is tens of thousands of tokens)."""
    lo, hi = 0, min(len(a), len(b))
    if a[:hi] == b[:hi]:
        return hi
    while lo < hi:  # invariant: a[:lo] == b[:lo], a[:hi+1] != b[:hi+1] once hi shrinks
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class PrefixCache:
    def __init__(self, capacity: int, block: int = 16) -> None:
        if capacity < 0 or block < 1:
            raise ValueError("capacity must be >= 0 and block >= 1")
        self.capacity = capacity
        self.block = block
        self._entries: OrderedDict[int, tuple[int, ...]] = OrderedDict()  # key -> prompt, LRU first
        self._next_key = 0
        self.total = 0  # tokens held
        self.hits = 0  # lookups that reused at least one block

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, ids: Sequence[int]) -> int:
        """Tokens of `ids` this cache already holds (whole blocks, at most len(ids) - 1), and
        caches `ids` for the prompts that follow it."""
        prompt = tuple(ids)
        best, best_key = 0, None
        for key, cached in self._entries.items():
            n = common_prefix(cached, prompt)
            if n > best:
                best, best_key = n, key
        reusable = min(best, len(prompt) - 1) // self.block * self.block if prompt else 0
        if reusable > 0:
            self.hits += 1
        if best_key is not None:
            self._entries.move_to_end(best_key)
        self._insert(prompt)
        return max(reusable, 0)

    def _insert(self, prompt: tuple[int, ...]) -> None:
        if not prompt or len(prompt) > self.capacity:
            return
        for key, cached in list(self._entries.items()):
            if len(cached) <= len(prompt) and prompt[: len(cached)] == cached:
                del self._entries[key]  # the new prompt holds all of it
                self.total -= len(cached)
            elif len(cached) > len(prompt) and cached[: len(prompt)] == prompt:
                self._entries.move_to_end(key)  # already held inside a longer prompt
                return
        self._entries[self._next_key] = prompt
        self._next_key += 1
        self.total += len(prompt)
        while self.total > self.capacity:
            _, old = self._entries.popitem(last=False)
            self.total -= len(old)

    def clear(self) -> None:
        self._entries.clear()
        self.total = 0
        self.hits = 0
