"""The human-readable side of a benchmark result: tables, ratios, and the issue's targets."""

from __future__ import annotations

# (what, cell key, metric path, comparison, limit)
TARGETS = (
    ("non-streaming req/s, gateway/direct, c=16 (OpenAI)", "gateway/openai/plain/c16", ("ratio", "req_per_s"), ">=", 0.8),
    ("non-streaming req/s, gateway/direct, c=16 (Anthropic)", "gateway/anthropic/plain/c16", ("ratio", "req_per_s"), ">=", 0.8),
    ("streamed chunks/s, gateway/direct, c=16 (OpenAI)", "gateway/openai/stream/c16", ("ratio", "chunks_per_s"), ">=", 0.8),
    ("streamed chunks/s, gateway/direct, c=16 (Anthropic)", "gateway/anthropic/stream/c16", ("ratio", "chunks_per_s"), ">=", 0.6),
    ("TTFT added at c=1, p50 ms (OpenAI)", "gateway/openai/stream/c1", ("ttft_p50_added_ms",), "<=", 0.5),
    ("TTFT added at c=1, p50 ms (Anthropic)", "gateway/anthropic/stream/c1", ("ttft_p50_added_ms",), "<=", 0.5),
    ("gateway CPU per streamed chunk, us, c=16 (OpenAI)", "gateway/openai/stream/c16", ("target_cpu_us_per_chunk",), "<=", 15),
    ("gateway CPU per streamed chunk, us, c=16 (Anthropic)", "gateway/anthropic/stream/c16", ("target_cpu_us_per_chunk",), "<=", 25),
)


def _get(doc: dict | None, path: tuple[str, ...]) -> float | None:
    for p in path:
        if not isinstance(doc, dict):
            return None
        doc = doc.get(p)
    if isinstance(doc, dict):
        return doc.get("median")
    return doc


def check_targets(result: dict) -> list[dict]:
    out = []
    summary = result["summary"]
    for what, cell, path, op, limit in TARGETS:
        value = _get(summary.get(cell), path)
        out.append({"what": what, "value": value, "op": op, "limit": limit,
                    "met": None if value is None else (value >= limit if op == ">=" else value <= limit)})
    # issue 16: the Responses surface's CPU per streamed chunk within 1.5x of the Anthropic one's
    resp = _get(summary.get("gateway/responses/stream/c16"), ("target_cpu_us_per_chunk",))
    anth = _get(summary.get("gateway/anthropic/stream/c16"), ("target_cpu_us_per_chunk",))
    ratio = resp / anth if resp is not None and anth else None
    out.append({"what": "gateway CPU per streamed chunk, Responses / Anthropic, c=16", "value": ratio, "op": "<=",
                "limit": 1.5, "met": None if ratio is None else ratio <= 1.5})
    # issue 22: the Gemini surface's likewise
    gem = _get(summary.get("gateway/gemini/stream/c16"), ("target_cpu_us_per_chunk",))
    ratio = gem / anth if gem is not None and anth else None
    out.append({"what": "gateway CPU per streamed chunk, Gemini / Anthropic, c=16", "value": ratio, "op": "<=",
                "limit": 1.5, "met": None if ratio is None else ratio <= 1.5})
    mem = result.get("memory_mb", {})
    idle = mem.get("gateway_idle", mem.get("gateway_start", {})).get("rss_mb")
    peak = mem.get("gateway_end", {}).get("hwm_mb")
    out.append({"what": "gateway RSS idle, MB", "value": idle, "op": "<=", "limit": 60,
                "met": None if idle is None else idle <= 60})
    if 64 not in result.get("settings", {}).get("concurrency", [64]):
        peak = None  # no run with 64 streams: the peak says nothing about them
    out.append({"what": "gateway peak RSS (VmHWM) over the run incl. 64 streams, MB", "value": peak, "op": "<=",
                "limit": 120, "met": None if peak is None else peak <= 120})
    return out


def _fmt(v: float | None, digits: int = 1) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def spread(e: dict | None, digits: int = 2) -> str:
    """A summary entry: its median, and (min-max) over more than one repetition."""
    if not e:
        return "-"
    if e["n"] == 1:
        return f"{e['median']:.{digits}f}"
    return f"{e['median']:.{digits}f} ({e['min']:.{digits}f}-{e['max']:.{digits}f})"


def print_report(result: dict) -> None:
    s = result["summary"]
    m = result["machine"]
    print()
    print(f"homelab-frontend benchmark, {result['started']}, {m['cpu'] or 'unknown cpu'}, {m['cores']} cores, "
          f"load average at start {', '.join(f'{x:.2f}' for x in m['loadavg_at_start'] or [])}")
    print(f"{result['settings']['reps']} repetition(s); medians, with (min-max) over repetitions; "
          f"ratios are gateway/direct per repetition")
    targets = sorted({k.split("/")[0] for k in s} - {"direct"} - {"queue-16slots", "queue-1024slots"})
    for target in targets:
        for mode in ("plain", "stream"):
            metric = "req_per_s" if mode == "plain" else "chunks_per_s"
            unit = "req/s" if mode == "plain" else "chunks/s"
            print()
            print(f"{target} vs direct, {'non-streaming' if mode == 'plain' else 'streaming'} ({unit})")
            head = f"  {'surface':<10}{'c':>4}{'direct':>11}{target:>11}  {'ratio':<20}"
            if mode == "stream":
                head += f"{'TTFT p50 direct/gw/added ms':>30}{'TTFT p99 gw':>13}{'cpu us/chunk':>14}"
            else:
                head += f"{'latency p50 direct/gw ms':>26}{'cpu us/req':>12}"
            print(head)
            for key, e in s.items():
                t, surface, md, c = key.split("/")
                if t != target or md != mode:
                    continue
                d = s.get(f"direct/{surface}/{mode}/{c}", {})
                line = (f"  {surface:<10}{c[1:]:>4}{_fmt(_get(d, (metric,)), 0):>11}{_fmt(_get(e, (metric,)), 0):>11}"
                        f"  {spread(e.get('ratio', {}).get(metric)):<20}")
                if mode == "stream":
                    ttft = (f"{_fmt(_get(d, ('ttft_p50_ms',)), 2)}/{_fmt(_get(e, ('ttft_p50_ms',)), 2)}/"
                            f"{_fmt(_get(e, ('ttft_p50_added_ms',)), 2)}")
                    line += f"{ttft:>30}{_fmt(_get(e, ('ttft_p99_ms',)), 2):>13}"
                    line += f"{_fmt(_get(e, ('target_cpu_us_per_chunk',)), 1):>14}"
                else:
                    lat = f"{_fmt(_get(d, ('latency_p50_ms',)), 2)}/{_fmt(_get(e, ('latency_p50_ms',)), 2)}"
                    line += f"{lat:>26}{_fmt(_get(e, ('target_cpu_us_per_req',)), 0):>12}"
                if e.get("errors"):
                    line += f"  ERRORS: {e['errors']}"
                print(line)
    mem = result.get("memory_mb", {})
    print()
    print("memory (MB): " + ", ".join(f"{k} rss {v['rss_mb']:.1f} / peak {v['hwm_mb']:.1f}" for k, v in mem.items()))
    q_tight = s.get("queue-16slots/openai/stream/c16")
    q_wide = s.get("queue-1024slots/openai/stream/c16")
    if q_tight and q_wide:
        print()
        print("queueing with free slots (OpenAI stream, c=16): TTFT p50 with 1024 slots "
              f"{spread(q_wide.get('ttft_p50_ms'))} ms, with exactly 16 slots {spread(q_tight.get('ttft_p50_ms'))} ms; "
              f"Server-Timing queue p99 {spread(q_tight.get('server_timing_queue_p99_ms'), 3)} ms (16 slots), "
              f"{spread(q_wide.get('server_timing_queue_p99_ms'), 3)} ms (1024 slots)")
    for note in result.get("notes", []):
        print(f"note: {note}")
    print()
    print("targets (issue 9):")
    for t in result.get("targets") or check_targets(result):
        mark = "n/a " if t["met"] is None else ("met " if t["met"] else "MISS")
        print(f"  [{mark}] {t['what']}: {_fmt(t['value'], 2)} (target {t['op']} {t['limit']})")
