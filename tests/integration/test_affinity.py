"""Session affinity through a real gateway to two prefix-caching stubs: 8 interleaved 5-turn
sessions (bench/affinity.py's driver) must land where the policy says, judged by which stub
received each turn. Placement only: times are the bench's business."""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest

from bench.affinity import UPSTREAM, Spec, gateway_config, run_policy
from gwproc import Gateway
from stubproc import StubHandle, start_stub
from homelab_frontend.policy import affinity

SPEC = Spec(sessions=8, turns=5, opening_words=600, turn_words=60, prefill_us_per_token=10, think_ms=50)


@dataclass
class Named:
    name: str
    handle: StubHandle

    @property
    def url(self) -> str:
        return self.handle.url


@pytest.fixture(scope="module")
def stubs():
    args = ("--model", UPSTREAM, "--max-model-len", "65536", "--token-delay-ms", "2",
            "--prefix-cache-tokens", "400000", "--prefill-us-per-token", str(SPEC.prefill_us_per_token))
    with start_stub("vllm", *args) as a, start_stub("vllm", *args) as b:
        yield [Named("gpu0", a), Named("gpu1", b)]


def _metric(text: str, name: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        m = re.match(rf"^{name}(\{{[^}}]*\}})? (\S+)$", line)
        if m:
            out[m.group(1) or ""] = float(m.group(2))
    return out


@pytest.mark.parametrize("header", [False, True], ids=["prompt-prefix-key", "session-header"])
def test_sessions_stay_on_their_backend_and_spread_over_both(stubs, header):
    spec = Spec(**{**SPEC.__dict__, "session_header": header})
    with Gateway(gateway_config([s.url for s in stubs], affinity=True, slots=SPEC.slots)) as gw:
        result = run_policy(stubs, gw.url, spec, "affinity")
        status, text = gw.get("/metrics")
        log = [line for line in gw.access_log() if line["path"] == "/llm/v1/messages"]
    assert len(log) == 40 and {line["affinity"] for line in log} == {"hit"}, log[:2]
    assert sum(line["tokens_cached"] or 0 for line in log) == sum(result.cached_tokens.values())
    summary = result.summary(spec)
    assert summary["turns"] == 40
    assert summary["turns_on_session_backend"] >= 0.9, summary
    shares = summary["sessions_per_backend"]
    assert set(shares) == {"gpu0", "gpu1"} and all(0.3 <= v <= 0.7 for v in shares.values()), summary
    # each stub's own account: turns after the first found their prefix there
    assert all(result.cached_tokens[n] > 0 for n in ("gpu0", "gpu1")), result.cached_tokens
    later = [t for t in result.turns if t.turn >= 2]
    assert sum(1 for t in later if t.cached and t.cached > 500) >= 0.9 * len(later)
    # /metrics: the hits, the ratio, and the cached tokens per backend the stubs reported
    assert status == 200
    hits = _metric(text, "hlf_affinity_requests_total")
    assert sum(v for k, v in hits.items() if 'result="hit"' in k) >= 36, hits
    assert _metric(text, "hlf_affinity_hit_ratio")['{model="agent"}'] >= 0.9
    cached = _metric(text, "hlf_cached_input_tokens_total")
    for name in ("gpu0", "gpu1"):
        assert sum(v for k, v in cached.items() if f'backend="{name}"' in k) == result.cached_tokens[name]


def test_with_a_session_header_the_backend_is_the_rendezvous_choice(stubs):
    """Every replica picks the same backend for a session: its rendezvous winner. Two gateway
    processes (no shared memory) send each session's turns to the same stub."""
    spec = Spec(**{**SPEC.__dict__, "session_header": True, "sessions": 4, "turns": 2})
    cfg = gateway_config([s.url for s in stubs], affinity=True, slots=SPEC.slots)
    placements = []
    for _ in range(2):
        with Gateway(cfg) as gw:
            result = run_policy(stubs, gw.url, spec, "affinity")
        placements.append(sorted((t.session, t.turn, t.backend) for t in result.turns))
    assert placements[0] == placements[1]
    import random

    for session, _turn, backend in placements[0]:
        rng = random.Random(spec.seed * 1000 + session)
        key = "h:" + f"{rng.getrandbits(128):032x}"
        assert affinity.rank(key, ["gpu0", "gpu1"])[0] == backend


def test_affinity_off_is_least_loaded(stubs):
    """The model-level switch: with `affinity: false` nothing is routed by session."""
    spec = Spec(**{**SPEC.__dict__, "sessions": 4, "turns": 2})
    with Gateway(gateway_config([s.url for s in stubs], affinity=False, slots=SPEC.slots)) as gw:
        run_policy(stubs, gw.url, spec, "least_loaded")
        _, text = gw.get("/metrics")
    assert not _metric(text, "hlf_affinity_requests_total")


def test_responses_conversations_follow_their_prompt_cache_key(stubs):
    """Codex sends `prompt_cache_key` (and `session-id`) with every Responses turn: a conversation's
    turns go to that key's rendezvous backend, whichever replica takes them."""
    from bench.affinity import MODEL
    from rawhttp import post_raw

    keys = [f"codex-conversation-{i}" for i in range(8)]
    with Gateway(gateway_config([s.url for s in stubs], affinity=True, slots=SPEC.slots)) as gw:
        for _turn in range(2):
            for key in keys:
                for s in stubs:
                    s.handle.reset()
                status, _, raw = post_raw(gw.base + "/responses", {"model": MODEL, "input": "hi", "store": False,
                                                                   "prompt_cache_key": key})
                assert status == 200, raw
                got = [s.name for s in stubs if s.handle.requests()]
                assert got == [affinity.rank("k:" + key, ["gpu0", "gpu1"])[0]], (key, got)
                sent = [r["body"] for s in stubs for r in s.handle.requests()]
                assert "prompt_cache_key" not in sent[0]  # routing only, never forwarded
        log = [line for line in gw.access_log() if line["path"] == "/llm/v1/responses"]
    assert len(log) == 16 and {line["affinity"] for line in log} == {"hit"}
