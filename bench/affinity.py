"""`python -m bench.affinity`: session affinity against least-loaded routing, on two backends that
model a prefix cache.

Two vLLM-flavoured stubs with a prefix (KV) cache (`--prefix-cache-tokens`) whose time to first
token grows with the *uncached* prompt tokens (`--prefill-us-per-token`) serve one model behind
one gateway. N agent-like sessions run interleaved, each for T turns over the Anthropic surface
(streamed, as Claude Code does): a shared system prompt, a long session-specific first message
(the files an agent reads), and a tool-result-sized addition per turn. The same sessions run
twice from cold caches: once with affinity (the default), once with `affinity: false` (most free
slots wins).

Reported per policy: where each turn landed by the upstreams' own record (which stub received
it), the share of turns on their session's backend (the one holding most of its turns), how the
sessions split over the backends, the cached prompt tokens the stubs reported, and the mean
client-side time to first token of turns 2+. Loopback only, bounded.

    python -m bench.affinity [--sessions 8] [--turns 5] [--prefill-us-per-token 100] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass, field

import aiohttp
import yaml

from .procs import Proc, workdir

MODEL = "agent"
UPSTREAM = "deepseek-ai/DeepSeek-R1-Distill-Qwen-32B"
WORDS = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho "
         "sigma tau upsilon phi chi psi omega").split()


@dataclass
class Spec:
    sessions: int = 8
    turns: int = 5
    system_words: int = 400  # shared by every session, like an agent's system prompt
    opening_words: int = 3000  # per session: the files it read
    turn_words: int = 150  # per turn: a tool result
    answer_tokens: int = 20
    token_delay_ms: int = 3
    prefill_us_per_token: int = 100
    think_ms: int = 150  # at most, between a session's turns (seeded)
    slots: int = 4  # per backend
    seed: int = 18
    session_header: bool = False  # name sessions by x-claude-code-session-id instead of the prompt


@dataclass
class Turn:
    session: int
    turn: int
    ttft: float
    backend: str = ""
    cached: int | None = None


@dataclass
class Result:
    policy: str
    turns: list[Turn] = field(default_factory=list)
    cached_tokens: dict[str, int] = field(default_factory=dict)
    prompt_tokens: dict[str, int] = field(default_factory=dict)

    def summary(self, spec: Spec) -> dict:
        by_session: dict[int, list[Turn]] = {}
        for t in self.turns:
            by_session.setdefault(t.session, []).append(t)
        home = {s: Counter(t.backend for t in ts).most_common(1)[0][0] for s, ts in by_session.items()}
        on_home = sum(1 for t in self.turns if t.backend == home[t.session])
        sticky = [ts[i].backend == ts[i - 1].backend for ts in by_session.values()
                  for i in range(1, len(ts))]
        later = [t.ttft for t in self.turns if t.turn >= 2]
        split = Counter(home.values())
        return {
            "policy": self.policy,
            "turns": len(self.turns),
            "turns_on_session_backend": round(on_home / len(self.turns), 3),
            "turns_on_previous_turns_backend": round(sum(sticky) / len(sticky), 3) if sticky else None,
            "sessions_per_backend": {b: round(n / len(home), 3) for b, n in sorted(split.items())},
            "mean_ttft_turn1_ms": round(statistics.mean(t.ttft for t in self.turns if t.turn == 1) * 1000, 1),
            "mean_ttft_turns2plus_ms": round(statistics.mean(later) * 1000, 1),
            "cached_prompt_share": round(sum(self.cached_tokens.values()) / max(1, sum(self.prompt_tokens.values())), 3),
            "cached_tokens_per_backend": self.cached_tokens,
        }


def _text(rng: random.Random, n: int, tag: str) -> str:
    return tag + " " + " ".join(rng.choice(WORDS) + str(rng.randrange(100)) for _ in range(n))


def start_stubs(wd: str, spec: Spec) -> list[Proc]:
    stubs = []
    for name in ("gpu0", "gpu1"):
        stubs.append(Proc(name, [
            sys.executable, "-m", "homelab_frontend.stub", "--flavour", "vllm", "--port", "0", "--model", UPSTREAM,
            "--max-model-len", "65536", "--token-delay-ms", str(spec.token_delay_ms),
            "--prefix-cache-tokens", "400000", "--prefill-us-per-token", str(spec.prefill_us_per_token),
        ], wd))
    return stubs


def gateway_config(stub_urls: list[str], affinity: bool, slots: int) -> dict:
    return {
        "backends": {f"gpu{i}": {"url": u + "/v1", "kind": "vllm", "slots": slots,
                                 "queue": {"depth": 64, "timeout_s": 60}} for i, u in enumerate(stub_urls)},
        "models": {MODEL: {"backends": [f"gpu{i}" for i in range(len(stub_urls))], "upstream_model": UPSTREAM,
                           "affinity": affinity}},
    }


def start_gateway(wd: str, stub_urls: list[str], affinity: bool, slots: int) -> Proc:
    name = "gw-affinity" if affinity else "gw-leastloaded"
    path = os.path.join(wd, f"{name}.yaml")
    with open(path, "w") as f:
        # the usage ledger in this run's directory, not the user's
        yaml.safe_dump({**gateway_config(stub_urls, affinity, slots),
                        "usage": {"path": os.path.join(wd, f"{name}-usage.sqlite3")}}, f, sort_keys=False)
    return Proc(name, [sys.executable, "-m", "homelab_frontend", "serve", "--config", path, "--port", "0"], wd)


async def _turn(http: aiohttp.ClientSession, url: str, body: dict, headers: dict) -> tuple[float, str]:
    """One streamed Messages turn -> (seconds to the first text delta, the answer's text)."""
    started = time.monotonic()
    ttft = None
    text = []
    async with http.post(url + "/llm/v1/messages", json=body, headers=headers) as resp:
        if resp.status != 200:
            raise RuntimeError(f"turn failed: {resp.status} {await resp.text()}")
        async for line in resp.content:
            if not line.startswith(b"data: "):
                continue
            ev = json.loads(line[6:])
            if ev.get("type") == "content_block_delta" and ev["delta"].get("type") == "text_delta":
                if ttft is None:
                    ttft = time.monotonic() - started
                text.append(ev["delta"]["text"])
    if ttft is None:
        raise RuntimeError("turn had no text")
    return ttft, "".join(text)


async def _session(http, url: str, spec: Spec, k: int, system: str, out: list[Turn]) -> None:
    rng = random.Random(spec.seed * 1000 + k)
    headers = {"x-api-key": "x"}
    if spec.session_header:
        headers["x-claude-code-session-id"] = f"{rng.getrandbits(128):032x}"
    messages = [{"role": "user", "content": _text(rng, spec.opening_words, f"session {k} reads its files:")}]
    for turn in range(1, spec.turns + 1):
        messages[-1]["content"] += f" [stub content={spec.answer_tokens}] (s{k}t{turn})"
        body = {"model": MODEL, "max_tokens": 64, "stream": True, "system": system, "messages": messages}
        ttft, answer = await _turn(http, url, body, headers)
        out.append(Turn(k, turn, ttft))
        messages = messages + [{"role": "assistant", "content": answer},
                               {"role": "user", "content": _text(rng, spec.turn_words, f"tool result {turn}:")}]
        await asyncio.sleep(rng.random() * spec.think_ms / 1000)


def _fetch(url: str, path: str, method: str = "GET"):
    import urllib.request

    req = urllib.request.Request(url + path, method=method, data=b"" if method == "POST" else None)
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def run_policy(stubs: list[Proc], gw_url: str, spec: Spec, policy: str) -> Result:
    for s in stubs:
        _fetch(s.url, "/stub/reset", "POST")  # cold caches, empty request records
    system = _text(random.Random(spec.seed), spec.system_words, "You are an agent.")
    turns: list[Turn] = []

    async def go() -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as http:
            await asyncio.gather(*(_session(http, gw_url, spec, k, system, turns) for k in range(spec.sessions)))

    asyncio.run(go())
    result = Result(policy, turns)
    where: dict[str, tuple[str, int | None]] = {}
    for s in stubs:
        for r in _fetch(s.url, "/stub/requests"):
            last = r["body"]["messages"][-1]["content"]
            tag = last[last.rindex("(s"):] if "(s" in last else ""
            where[tag] = (s.name, r.get("cached_tokens"))
        stats = _fetch(s.url, "/stub/stats")
        result.cached_tokens[s.name] = stats["cached_tokens"]
        result.prompt_tokens[s.name] = stats["prompt_tokens"]
    for t in turns:
        t.backend, t.cached = where[f"(s{t.session}t{t.turn})"]
    return result


def measure(spec: Spec) -> dict:
    wd = workdir()
    stubs = start_stubs(wd, spec)
    out: dict = {"spec": spec.__dict__}
    try:
        for policy, on in (("affinity", True), ("least_loaded", False)):
            gw = start_gateway(wd, [s.url for s in stubs], on, spec.slots)
            try:
                out[policy] = run_policy(stubs, gw.url, spec, policy).summary(spec)
            finally:
                gw.stop()
    finally:
        for s in stubs:
            s.stop()
    a, ll = out["affinity"], out["least_loaded"]
    out["ttft_turns2plus_ratio"] = round(ll["mean_ttft_turns2plus_ms"] / a["mean_ttft_turns2plus_ms"], 2)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.affinity", description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--prefill-us-per-token", type=int, default=100)
    ap.add_argument("--session-header", action="store_true", help="send x-claude-code-session-id")
    ap.add_argument("--seed", type=int, default=18)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    spec = Spec(sessions=args.sessions, turns=args.turns, prefill_us_per_token=args.prefill_us_per_token,
                session_header=args.session_header, seed=args.seed)
    out = measure(spec)
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    print(f"{spec.sessions} interleaved {spec.turns}-turn sessions over 2 backends, "
          f"prefill {spec.prefill_us_per_token} us per uncached token")
    keys = ["turns_on_session_backend", "turns_on_previous_turns_backend", "sessions_per_backend",
            "mean_ttft_turn1_ms", "mean_ttft_turns2plus_ms", "cached_prompt_share"]
    for policy in ("affinity", "least_loaded"):
        print(f"  {policy:13} " + "  ".join(f"{k}={out[policy][k]}" for k in keys))
    print(f"  mean TTFT of turns 2+: least-loaded / affinity = {out['ttft_turns2plus_ratio']}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
