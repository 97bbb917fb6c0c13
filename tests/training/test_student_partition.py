"""The frozen reward student under ZeRO-3 (rlt.stages.rl.partition_frozen, TRL's prepare_deepspeed): in a real gloo
world of 2 CPU ranks each rank holds half of its parameter bytes after preparation, where a world of 1 holds them all,
and a batch scored through the gather gives exactly the scores of the unpartitioned model, with ranks running
different numbers of micro-batches (rank r scores 2r + 1 requests, one per micro-batch). benchmarks/student_partition.py runs the worlds."""

from __future__ import annotations

import runpy

import pytest
from suite_helpers import ROOT

pytestmark = pytest.mark.slow

BENCH = ROOT / "benchmarks" / "student_partition.py"


def test_student_is_partitioned_per_rank_and_scores_unchanged(tmp_path):
    mod = runpy.run_path(str(BENCH), run_name="not_main")
    res = mod["compare"]("builtin:tiny-qwen2", 2, tmp_path)
    (one,), two = res["one"], res["many"]
    assert len(two) == 2 and all(r["partitioned"] for r in (one, *two))
    whole = one["param_bytes_loaded"]
    assert one["param_bytes_prepared"] == whole  # a world of 1 keeps every byte
    for r in two:
        assert r["param_bytes_loaded"] == whole  # loaded whole, as stage rl loads it
        # half, up to the small parameters ZeRO-3 keeps whole on every rank (stage3_param_persistence_threshold)
        assert r["param_bytes_prepared"] == pytest.approx(whole / 2, rel=0.03)
        assert r["held_after_score"] == r["param_bytes_prepared"]  # partitioned again after the gathered score call
    assert res["ratio"] <= 0.53
    assert res["max_score_diff"] == 0.0
