"""Usage rows: per hour x key x model (x upstream model, backend, dialect), and their sums for a
query (`by=hour|day`, per key x model). Pure: both stores write what `Rollup` gathers and
answer with `aggregate` over the rows they read.

A row's hour is the UTC hour its requests *finished* in, as a budget counts them.
"""

from __future__ import annotations

from typing import Iterable

from .record import Entry
from .windows import bucket_start, hour_start, iso

# the counted figures, in storage order
INT_METRICS = ("requests", "ok", "cancelled", "failed", "refused", "input_tokens", "cached_tokens",
               "output_tokens", "estimated_input", "estimated_output",
               "characters", "documents", "images")  # the relayed calls' units (usage/record.py)
FLOAT_METRICS = ("slot_seconds", "queue_seconds", "load_seconds", "audio_seconds")
METRICS = INT_METRICS + FLOAT_METRICS
DIMS = ("start", "key", "model", "upstream", "backend", "dialect")

Dims = tuple[int, str, str, str, str, str]


def outcome_class(outcome: str) -> str:
    if outcome == "ok":
        return "ok"
    if outcome.startswith("cancelled_"):
        return "cancelled"
    if outcome.startswith("rejected_"):
        return "refused"
    return "failed"


def figures(e: Entry) -> list[float]:
    cls = outcome_class(e.outcome)
    return [1, cls == "ok", cls == "cancelled", cls == "failed", cls == "refused",
            e.input_tokens, e.cached_tokens, e.output_tokens, not e.input_exact, not e.output_exact,
            e.characters, e.documents, e.images,
            e.slot_seconds, e.queue_seconds, e.load_seconds, e.audio_seconds]


def add_into(rows: dict, key, vals: list[float]) -> None:
    """`vals` added figure by figure to the row `key` of `rows` (a copy of them for a new row):
    the one merge of usage rows, for the pending rows, rows put back and a query's sums."""
    row = rows.get(key)
    if row is None:
        rows[key] = list(vals)
    else:
        for i, v in enumerate(vals):
            row[i] += v


class Rollup:
    """Entries summed per row, between two writes."""

    __slots__ = ("rows",)

    def __init__(self) -> None:
        self.rows: dict[Dims, list[float]] = {}

    def add(self, e: Entry) -> None:
        add_into(self.rows, (hour_start(e.ts), e.key, e.model, e.upstream, e.backend, e.dialect), figures(e))

    def put_back(self, rows: dict[Dims, list[float]]) -> None:
        """Rows taken for a write that failed, summed into what gathered since, for the next one."""
        for dims, vals in rows.items():
            add_into(self.rows, dims, vals)

    def __len__(self) -> int:
        return len(self.rows)

    def take(self) -> dict[Dims, list[float]]:
        rows, self.rows = self.rows, {}
        return rows


def aggregate(rows: Iterable[tuple[Dims, list[float]]], by: str = "hour") -> list[dict]:
    """Stored rows -> the API's rows: per key x model x bucket (UTC hour or day), oldest first."""
    sums: dict[tuple[int, str, str], list[float]] = {}
    for dims, vals in rows:
        add_into(sums, (bucket_start(dims[0], by), dims[1], dims[2]), vals)
    out = []
    for (start, key, model), vals in sorted(sums.items()):
        row: dict = {"key": key, "model": model, "start": iso(start), "start_unix": start}
        for name, v in zip(METRICS, vals):
            row[name] = int(v) if name in INT_METRICS else round(v, 3)
        out.append(row)
    return out


def totals(rows: list[dict], by: tuple[str, ...] = ("key", "model")) -> list[dict]:
    """API rows summed over time, per `by` (the CLI's table, the dashboard's legend)."""
    sums: dict[tuple, dict] = {}
    for r in rows:
        k = tuple(r[f] for f in by)
        acc = sums.setdefault(k, {**{f: r[f] for f in by}, **{m: 0 for m in METRICS}})
        for m in METRICS:
            acc[m] += r[m]
    for acc in sums.values():
        for m in FLOAT_METRICS:
            acc[m] = round(acc[m], 3)
    return [sums[k] for k in sorted(sums)]
