"""sft's rows dealt across ranks by tokens (issue 51): rlt.stages.sft asks for transformers' token-balancing
sampler, rlt.stages.sft_balance widens its deal to a window of steps (StepDeal) and measures each step's imbalance.

On rows the sft stage builds with a real tokenizer (the tiny Qwen2's, built locally), the deal for 4 ranks holds
each micro-step's slowest rank within 10 % of the mean, where the layout it made before (a random order, batch k to
rank k mod 4, as accelerate shards it) waits for the long rows; and the stage's own trainer uses that sampler,
seeded by the run's seed, and records the imbalance in metrics.jsonl."""

from __future__ import annotations

import json
import random

import pytest
from suite_helpers import tiny_doc

from rlt.stages.balance import imbalance

WORLD = 4


@pytest.fixture(scope="module")
def ctx(tmp_path_factory):
    from rlt.contract.layout import RunLayout
    from rlt.spec.loading import parse_run
    from rlt.stages.context import StageContext

    doc = tiny_doc()
    doc["spec"]["seed"] = 7
    run = parse_run(doc)
    return StageContext(run, RunLayout.for_run(tmp_path_factory.mktemp("sft"), run.name), show_progress=False)


def stage_lengths(ctx, rows: int, seed: int = 0) -> list[int]:
    """Token lengths of sft rows (rlt.stages.sft.sft_rows) whose worked reasoning is short for most rows and long
    for about one in seven: the shape of a set of explanations."""
    from rlt.data.models import load_tokenizer
    from rlt.stages.sft import sft_rows

    rnd = random.Random(seed)
    data = []
    for i in range(rows):
        words = rnd.randint(150, 400) if rnd.random() < 0.15 else rnd.randint(5, 40)
        trace = " ".join(f"{rnd.randint(0, 99)} plus {rnd.randint(0, 99)}" for _ in range(words))
        data.append({"row": i, "question": f"What is {i} + {2 * i}?", "solution": str(3 * i), "reasoning_trace": trace})
    tok = load_tokenizer(ctx.spec.teacher, padding_side="right")
    return [len(r["input_ids"]) for r in sft_rows(data, ctx.formatter, tok, "reject")]


def padded_tokens(lengths: list[int], batches: list[list[list[int]]]) -> list[list[float]]:
    """[micro-step][rank] tokens the model computes: rows × the micro-batch's longest row (the collator pads to
    it), from each rank's micro-batches `batches[rank][micro-step]`."""
    steps = len(batches[0])
    return [[float(len(b[s]) * max(lengths[i] for i in b[s])) for b in batches] for s in range(steps)]


def rebalanced(lengths: list[int], micro: int, per_device: int, seed: int, window: bool) -> list[list[list[int]]]:
    """Each rank's micro-batches for one epoch, as the Trainer deals them for WORLD ranks: rlt's StepDeal
    (`window`), else transformers' BatchRebalanceSampler alone (one step's rows at a time)."""
    from transformers.trainer_pt_utils import BatchRebalanceSampler

    from rlt.stages.sft_balance import step_deal_class

    def sampler(rank: int):
        if window:
            return step_deal_class()(lengths, per_device, WORLD, micro, rank, seed)
        return BatchRebalanceSampler(lengths, per_device * micro * WORLD, WORLD, micro, seed=seed, rank=rank)

    return [list(sampler(rank)) for rank in range(WORLD)]


def random_layout(lengths: list[int], per_device: int, seed: int) -> list[list[list[int]]]:
    """The default: a random order cut into micro-batches, batch k to rank k mod WORLD (accelerate's shard)."""
    order = random.Random(seed).sample(range(len(lengths)), len(lengths))
    batches = [order[i : i + per_device] for i in range(0, len(order), per_device)]
    return [batches[rank::WORLD] for rank in range(WORLD)]


@pytest.mark.parametrize(("micro", "per_device"), [(4, 1), (16, 1), (4, 2)])
def test_the_sft_deal_holds_four_ranks_within_ten_percent(ctx, micro, per_device):
    """(4, 1) is paper-7b's sft: 16 rows a step on 4 ranks, one row per micro-batch. transformers' sampler deals
    one step's rows, so a lone long row still waits alone there; the window of steps evens it out."""
    for seed in range(2):
        lengths = stage_lengths(ctx, 640, seed)
        dealt = rebalanced(lengths, micro, per_device, seed, window=True)
        assert sorted(i for rank in dealt for b in rank for i in b) == list(range(len(lengths)))  # each row once
        assert all(len(b) == per_device for rank in dealt for b in rank)  # the micro-batch the plan sizes
        before = imbalance(padded_tokens(lengths, random_layout(lengths, per_device, seed)))
        step_only = imbalance(padded_tokens(lengths, rebalanced(lengths, micro, per_device, seed, window=False)))
        after = imbalance(padded_tokens(lengths, dealt))
        assert before > 1.3, before  # the rows are skewed: the random layout waits for the long ones
        assert after <= 1.1, (seed, after)
        if (micro, per_device) == (4, 1):
            assert step_only > 1.15, step_only


def test_the_sft_stage_deals_its_rows_and_records_the_imbalance(ctx, monkeypatch):
    """run_sft on the tiny run: its trainer's sampler is transformers' token-balancing one, shuffled with the
    run's seed, and each step's record carries rlt_rank_imbalance_ratio's keys (1.0: one process)."""
    from rlt.run.plots import read_metrics
    from rlt.stages import trainer as trainer_module
    from rlt.stages.sft import run_sft

    seen = {}
    train = trainer_module.TrainerRun.train

    def spying(self, trainer):
        seen["sampler"] = trainer._get_train_sampler()
        return train(self, trainer)

    monkeypatch.setattr(trainer_module.TrainerRun, "train", spying)
    run_sft(ctx)
    sampler = seen["sampler"]
    assert type(sampler).__name__ == "StepDeal"
    assert sampler.seed == 7
    rows = [r for r in read_metrics(ctx.layout.metrics_file) if r["stage"] == "sft"]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["rank_imbalance_tokens"] == 1.0 and r["rank_imbalance_seconds"] == 1.0 for r in rows), json.dumps(rows)
