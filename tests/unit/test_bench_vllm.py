"""bench/vllm.py's arithmetic: ratios are paired within a repetition (the three targets measured
back to back), then reduced to their median, so a slow moment of a shared machine skews one pair,
not the figure."""

from __future__ import annotations

from bench.vllm import report, summarize


def run(rep, target, c, ttft, rate, errors=0):
    return {"rep": rep, "target": target, "concurrency": c, "ttft_p50_ms": ttft, "chunks_per_s": rate,
            "chunks_per_req": 24.0, "errors": errors}


def test_ratios_pair_each_repetition_and_take_the_median():
    runs = [run(0, "direct", 1, 100.0, 10.0), run(0, "gateway", 1, 110.0, 9.0),
            # the whole machine twice as slow in repetition 1: the ratio holds
            run(1, "direct", 1, 200.0, 5.0), run(1, "gateway", 1, 220.0, 4.5),
            run(2, "direct", 1, 100.0, 10.0), run(2, "gateway", 1, 300.0, 10.0)]
    s = summarize(runs)
    g = s["gateway/c1"]
    assert g["ratio_tokens_per_s"]["median"] == 0.9 and g["ratio_tokens_per_s"]["n"] == 3
    assert g["ratio_ttft"]["median"] == 1.1
    assert g["ttft_added_ms"]["median"] == 20.0
    assert s["direct/c1"]["tokens_per_s"]["median"] == 10.0 and "ratio_ttft" not in s["direct/c1"]
    assert "floor/c1" not in s and "gateway/c2" not in s


def test_a_failed_measurement_is_left_out_and_errors_are_counted():
    runs = [run(0, "direct", 2, 100.0, 10.0), run(0, "gateway", 2, 100.0, 10.0, errors=1),
            {"rep": 1, "target": "direct", "concurrency": 2, "fatal": "ConnectionRefusedError"},
            run(1, "gateway", 2, 120.0, 9.0)]
    g = summarize(runs)["gateway/c2"]
    assert g["ratio_tokens_per_s"]["n"] == 1 and g["errors"] == 1


def test_the_report_shows_every_cell():
    runs = [run(0, t, c, 100.0, 10.0) for t in ("direct", "floor", "gateway") for c in (1, 2)]
    result = {"summary": summarize(runs), "started": "now", "machine": {"cores": 2, "loadavg_at_start": [1.0]},
              "settings": {"model": "m", "tokens": 24, "reps": 1}}
    lines = report(result).splitlines()
    assert sum(line.lstrip().startswith(("direct", "floor", "gateway")) for line in lines) == 6
