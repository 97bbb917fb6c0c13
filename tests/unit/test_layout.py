"""A run's paths, file names and timestamp format are written once, in rlt.contract.layout: no other module of the shipped
packages spells them (so adding or renaming a run file is one edit there)."""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path

import rlt
import rlt_operator
from rlt.contract import layout as L

SOURCES = [
    Path(rlt.__file__).parent,
    Path(rlt_operator.__file__).parent,
    Path(rlt_operator.__file__).parents[1] / "rlt_sandbox",
]
LAYOUT = Path(L.__file__).resolve()

# Literals that name a run's files or its timestamp format; each may appear in layout.py only.
OWNED = {
    "checkpoint folder name": re.compile(r"[\"']checkpoint-"),
    "checkpoint marker": re.compile(re.escape(L.CHECKPOINT_COMPLETE)),
    "timestamp format": re.compile(r"%Y-?%m-?%d"),
    "distillation dataset file": re.compile(r"[\"']" + re.escape(L.DISTILL_DATASET_FILE) + r"[\"']"),
    "report files": re.compile(r"[\"'](report\.json|report\.md|per_question\.jsonl|problems\.jsonl)[\"']"),
    # joined onto a path (`replaced` alone is also a row action of the student stage)
    "run folders": re.compile(r"/ ?[\"'](replaced|tracking|mlruns|set-aside|adapter)[\"']"),
    "run records": re.compile(r"[\"'](spec-fingerprint\.json|outputs\.json|metrics\.jsonl|progress\.json)[\"']"),
}


def test_no_module_but_layout_names_a_run_file_or_the_timestamp_format():
    offenders = []
    for base in SOURCES:
        for path in sorted(base.rglob("*.py")):
            if path.resolve() == LAYOUT:
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                offenders += [f"{path.name}:{n} {what}" for what, rx in OWNED.items() if rx.search(line)]
    assert not offenders
    # and layout.py does hold each of them
    text = LAYOUT.read_text()
    assert all(rx.search(text) for rx in OWNED.values())


def test_timestamps_round_trip_in_utc():
    t = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    assert L.format_time(t) == "2026-01-02T01:04:05Z"
    assert L.parse_time(L.format_time(t)) == t
    assert L.parse_time("") is None and L.format_time(t, L.STAMP_FORMAT) == "20260102T010405Z"
