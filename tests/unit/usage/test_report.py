"""usage/report.py: what `homelab-frontend usage` prints (a table per key x model, or JSON), and
where it says it read the ledger, without a gateway running."""

from __future__ import annotations

import json
import re

from homelab_frontend import config as cfgmod
from homelab_frontend.usage import report

BASE = {"backends": {"b": {"url": "http://127.0.0.1:9/v1"}}, "models": {"m": {"backend": "b"}}}
ROWS = [
    {"key": "alice", "model": "qwen", "requests": 3, "input_tokens": 120, "cached_tokens": 0, "output_tokens": 45},
    {"key": None, "model": "reasoning", "requests": 12, "input_tokens": 9000, "cached_tokens": 512, "output_tokens": 1500},
]


def cells(line: str) -> list[str]:
    return re.split(r"\s{2,}", line.strip())


def test_the_table_has_a_row_per_key_and_model_and_a_total():
    lines = report.table(ROWS, None).splitlines()
    assert cells(lines[0]) == list(report.COLUMNS)
    assert cells(lines[1]) == ["alice", "qwen", "3", "120", "0", "45"]
    assert cells(lines[2]) == ["(no key)", "reasoning", "12", "9000", "512", "1500"]
    assert cells(lines[3]) == ["total", "15", "9120", "512", "1545"]
    # numbers right-aligned under their headings
    assert lines[1].rstrip().endswith("45") and len(lines[1]) == len(lines[0]) == len(lines[3])


def test_by_hour_adds_the_start_and_no_rows_is_just_the_heading():
    rows = [{**ROWS[0], "start": "2026-12-02T17:00:00Z"}]
    assert cells(report.table(rows, "hour").splitlines()[1])[0] == "2026-12-02T17:00:00Z"
    assert report.table([], None).splitlines() == ["  ".join(report.COLUMNS)]


def test_json_is_the_rows():
    assert json.loads(report.dumps(ROWS)) == {"rows": ROWS}


def test_where_names_the_file_or_the_redis_host_never_its_password(tmp_path):
    cfg = cfgmod.parse({**BASE, "usage": {"path": str(tmp_path / "u.sqlite3")}})
    assert report.where(cfg) == f"the ledger file {tmp_path / 'u.sqlite3'}"
    cfg = cfgmod.parse({**BASE, "cluster": {"redis_url": "redis://:s3cret@redis.lan:6380/0"}})
    assert report.where(cfg) == "the ledger in Redis at redis.lan:6380" and "s3cret" not in report.where(cfg)


def test_no_ledger_file_yet_is_no_rows(tmp_path):
    cfg = cfgmod.parse({**BASE, "usage": {"path": str(tmp_path / "never-written.sqlite3")}})
    assert report.rows(cfg) == [] and report.rows(cfg, by="day") == []
    assert not (tmp_path / "never-written.sqlite3").exists()  # reading never creates it


def test_the_relayed_calls_units_get_columns_only_when_some_row_has_them():
    zero = {"documents": 0, "characters": 0, "images": 0, "audio_seconds": 0.0}
    rows = [{**ROWS[0], **zero}, {**ROWS[1], **zero, "key": "bob", "model": "whisper-1", "audio_seconds": 12.5},
            {**ROWS[1], **zero, "key": "bob", "model": "rr", "documents": 1500000}]
    lines = report.table(rows, None).splitlines()
    assert cells(lines[0]) == [*report.COLUMNS, "documents", "audio_s"]
    assert cells(lines[2])[-2:] == ["0", "12.5"]
    assert cells(lines[4])[-2:] == ["1500000", "12.5"]  # the total, whole numbers as they are
    assert cells(report.table([{**ROWS[0], **zero}], None).splitlines()[0]) == list(report.COLUMNS)
