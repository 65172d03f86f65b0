"""A week of a homelab's usage, for the README and the dashboard's screenshot:
`python -m bench.usage_week FILE [--days 7]` writes synthetic finished requests into a ledger
file through the ledger's own store (usage/sqlite_store.py), as if a gateway had served them.

Synthetic on purpose (a real week takes a week): three people and two agents on three models,
busier by day, agents with long cached prompts. Seeded, so the same file comes out every time
for the same end hour. Then `homelab-frontend usage --config X --by day` (with `usage.path: FILE`)
prints it, and a gateway started on it draws it.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import time

from homelab_frontend import config as cfgmod
from homelab_frontend.usage.record import Entry
from homelab_frontend.usage.sqlite_store import SqliteStore

# key: (dialect, {model: share}, requests per busy hour, prompt tokens, cached share, output tokens)
WHO = {
    "alice": ("openai", {"qwen2.5-coder-32b": .7, "llama3.1-8b": .3}, 14, 1800, .35, 420),
    "bob": ("openai", {"llama3.1-8b": 1.0}, 6, 900, .2, 300),
    "claude-code": ("anthropic", {"qwen2.5-coder-32b": .8, "deepseek-r1-32b": .2}, 40, 24000, .9, 650),
    "codex": ("responses", {"qwen2.5-coder-32b": 1.0}, 18, 16000, .85, 500),
    "guest": ("openai", {"llama3.1-8b": 1.0}, 2, 700, 0.0, 250),
}
BACKEND = {"qwen2.5-coder-32b": "gpu0", "deepseek-r1-32b": "gpu0", "llama3.1-8b": "gpu1"}


def entries(end: float, days: int, seed: int = 25):
    rnd = random.Random(seed)
    start = int(end // 3600) * 3600 - days * 86400
    for hour in range(start, int(end // 3600) * 3600, 3600):
        local = (hour // 3600 + 1) % 24  # the homelab is one hour east of UTC
        busy = 0.08 + max(0.0, math.sin((local - 7) / 16 * math.pi)) if 7 <= local <= 23 else 0.04
        weekend = time.gmtime(hour).tm_wday >= 5
        for key, (dialect, models, rate, prompt, cached, out) in WHO.items():
            scale = busy * (0.4 if weekend and key != "alice" else 1.0)
            for _ in range(int(rnd.expovariate(1.0) * rate * scale)):
                model = rnd.choices(list(models), list(models.values()))[0]
                tin = int(prompt * rnd.uniform(0.3, 1.7))
                tout = int(out * rnd.uniform(0.2, 2.0))
                outcome = rnd.choices(["ok", "cancelled_streaming", "error_timeout"], [0.95, 0.04, 0.01])[0]
                gen_s = tout / (35 if "32b" in model else 90)
                yield Entry(ts=hour + rnd.uniform(0, 3599), key=key, model=model, upstream=model,
                            backend=BACKEND[model], dialect=dialect, outcome=outcome, input_tokens=tin,
                            cached_tokens=int(tin * cached * rnd.uniform(0.8, 1.0)), output_tokens=tout,
                            input_exact=outcome == "ok", output_exact=outcome == "ok",
                            slot_seconds=round(gen_s + tin / 4000, 3), queue_seconds=round(rnd.expovariate(4), 3),
                            load_seconds=0.0)


async def main_async(path: str, days: int) -> int:
    store = SqliteStore(cfgmod.Usage(path=path))
    n = 0
    for e in entries(time.time(), days):
        store.put(e)
        n += 1
    await store.close()
    return n


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("file")
    p.add_argument("--days", type=int, default=7)
    args = p.parse_args()
    n = asyncio.run(main_async(args.file, args.days))
    print(f"{n} requests over {args.days} days written to {args.file}")


if __name__ == "__main__":
    main()
