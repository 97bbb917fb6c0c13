"""Ranks balanced by tokens (rlt.stages.balance): the deal of a step's rows over ranks and micro-steps, its imbalance
on a skewed length mix against TRL's layout (each rank's own rows, shuffled), the cases it refuses, and the
per-step imbalance exported by the stage record (Prometheus and metrics.jsonl)."""

from __future__ import annotations

import json
import random

import pytest
from prometheus_client import generate_latest
from suite_helpers import tiny_doc

from rlt.contract.layout import RunLayout
from rlt.contract.metrics import STEP_KEYS, TrainerMetrics
from rlt.spec.loading import parse_run
from rlt.stages.balance import deal, deal_refusal, imbalance, micro_step_tokens
from rlt.stages.context import StageContext
from rlt.stages.record import Recorder


def skewed(rows: int, seed: int = 0) -> list[int]:
    """Most completions short, one in seven long (the shape of a batch of explanations), plus a prompt."""
    rnd = random.Random(seed)
    return [40 + (rnd.randint(400, 1000) if rnd.random() < 0.15 else rnd.randint(16, 160)) for _ in range(rows)]


def trl_layout(rows: int, world: int, seed: int = 0) -> list[list[int]]:
    """TRL 1.16: rank r holds the r-th slice of the step's rows (`process_slice`), shuffled on the rank."""
    rnd, local = random.Random(seed), rows // world
    return [rnd.sample(range(r * local, (r + 1) * local), local) for r in range(world)]


@pytest.mark.parametrize(("world", "steps", "per_step"), [(4, 32, 1), (4, 16, 2), (8, 16, 1), (3, 5, 3)])
def test_every_row_is_dealt_once_and_each_micro_step_has_its_rows(world, steps, per_step):
    lengths = skewed(world * steps * per_step)
    plan = deal(lengths, world, steps, per_step)
    assert sorted(i for rows in plan for i in rows) == list(range(len(lengths)))
    assert all(len(rows) == steps * per_step for rows in plan)
    assert plan == deal(lengths, world, steps, per_step)  # every rank computes the same plan


@pytest.mark.parametrize(("steps", "per_step"), [(32, 1), (16, 2)])
def test_the_deal_holds_a_skewed_mix_to_the_target_at_four_ranks(steps, per_step):
    for seed in range(5):
        lengths = skewed(4 * steps * per_step, seed)
        before = imbalance(micro_step_tokens(lengths, trl_layout(len(lengths), 4, seed), per_step))
        after = imbalance(micro_step_tokens(lengths, deal(lengths, 4, steps, per_step), per_step))
        assert before > 1.5, before  # the mix is skewed: TRL's layout waits for the long rows
        assert after <= 1.1, (seed, after)


def test_one_row_per_micro_batch_reaches_the_lower_bound():
    """With one row per micro-batch a micro-step lasts as long as its longest row, so the step lasts at least the
    sum of every world-th length in sorted order (the longest, the (w+1)-th, ...); the deal reaches it."""
    lengths, world = skewed(64, seed=3), 4
    per_step = micro_step_tokens(lengths, deal(lengths, world, 16, 1), 1)
    assert sum(max(ranks) for ranks in per_step) == sum(sorted(lengths, reverse=True)[::world])


def test_imbalance_is_slowest_over_mean_summed_over_micro_steps():
    assert imbalance([[2, 2], [1, 1]]) == 1.0
    assert imbalance([[4, 0], [1, 1]]) == pytest.approx((4 + 1) / (2 + 1))
    assert imbalance([]) == 1.0


def test_a_wrong_row_count_is_refused_by_name():
    with pytest.raises(ValueError, match="7 rows cannot be dealt as 2 micro-steps × 1 rows × 4 ranks"):
        deal([1] * 7, 4, 2, 1)


def test_losses_that_weigh_a_row_by_its_neighbours_keep_trls_layout():
    from trl import GRPOConfig

    def args(**kw):
        base = dict(output_dir="/tmp/unused", gradient_accumulation_steps=4, steps_per_generation=4, use_cpu=True)
        return GRPOConfig(**{**base, **kw})

    assert deal_refusal(args(loss_type="grpo"), 4) is None
    assert deal_refusal(args(loss_type="dapo"), 4) is None
    assert "bnpo" in deal_refusal(args(loss_type="bnpo"), 4)
    assert "optimizer step" in deal_refusal(args(loss_type="grpo", steps_per_generation=8), 4)
    assert "entropy" in deal_refusal(args(loss_type="grpo", top_entropy_quantile=0.2), 4)
    assert deal_refusal(args(loss_type="grpo"), 1) == "one process"


def test_the_step_imbalance_is_exported_and_recorded(tmp_path):
    assert STEP_KEYS["rank_imbalance_tokens"] == ("rlt_rank_imbalance_ratio", "tokens")
    run = parse_run(tiny_doc())
    ctx = StageContext(run, RunLayout.for_run(tmp_path, run.name), TrainerMetrics(run.name), show_progress=False)
    Recorder(ctx, "rl", 2).record(1, {"rank_imbalance_tokens": 1.42, "rank_imbalance_seconds": 1.03})
    text = generate_latest(ctx.metrics.registry).decode()
    labels = 'method="rlt",namespace="local",run="tiny",stage="rl"'
    assert f'rlt_rank_imbalance_ratio{{measure="tokens",{labels}}} 1.42' in text
    assert f'rlt_rank_imbalance_ratio{{measure="seconds",{labels}}} 1.03' in text
    (row,) = [json.loads(line) for line in ctx.layout.metrics_file.read_text().splitlines()]
    assert row["rank_imbalance_tokens"] == 1.42 and row["rank_imbalance_seconds"] == 1.03
