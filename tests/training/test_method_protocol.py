"""A method is a protocol (issue 55): a comparable method registered as one row, with its own reward (a plain
class of the reward protocol, rlt.method.reward.GrpoReward, not a subclass of rlt's), its own rl function and rlt's
other stage functions reused under their own names, runs locally and through `rlt compare` with no other file
changed."""

from __future__ import annotations

import json
from typing import Any

import pytest
from suite_helpers import tiny_doc

from rlt.contract.method_registry import METHODS, MethodInfo
from rlt.contract.stage_registry import stage_function

CALLS: list[int] = []  # batch sizes the sparse reward was called with


class SparseReward:
    """Correctness only: 1 when the explanation states the reference solution, else 0."""

    __name__ = "sparse"

    def __call__(
        self, prompts: list[Any], completions: list[Any], question: list[str], solution: list[str], **extra: Any
    ) -> list[float]:
        CALLS.append(len(completions))
        texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
        return [float(s.strip() in t) for t, s in zip(texts, solution, strict=True)]


def run_sparse_rl(ctx) -> str:
    """The rl stage of method sparse: rlt's rows, rollout and GRPO loop with the sparse reward."""
    from rlt.data.dataset import load_data
    from rlt.data.models import load_tokenizer
    from rlt.stages.rl import make_rollout, rl_rows, teacher_start, train_grpo

    spec, st = ctx.spec, ctx.spec.stages.rl
    device = ctx.compute_device
    start = teacher_start(ctx)
    tokenizer = load_tokenizer(start, padding_side="left")
    data = load_data(spec.dataset, ctx.formatter.fmt)
    rows = rl_rows(data.train, ctx.formatter, tokenizer, st.max_prompt_length, spec.dataset.bad_rows, data.where)
    return train_grpo(
        ctx,
        device,
        start,
        tokenizer,
        rows,
        SparseReward(),
        lambda timer, counters: make_rollout(tokenizer, timer, st, counters),
        dict,
    )


SPARSE = MethodInfo(
    "sparse",
    # rlt's stage functions, reused by name; only rl is the method's own
    stage_functions="rlt.stages.{stage}:run_{stage}",
    functions={"rl": f"{__name__}:run_sparse_rl"},
    format_check="rlt.method.prompts:check_spec_format",
    format_field="spec.format",
    row_prompts=True,
    comparable=True,
)


@pytest.fixture
def sparse(monkeypatch):
    CALLS.clear()
    monkeypatch.setitem(METHODS, "sparse", SPARSE)
    return SPARSE


def sparse_doc() -> dict:
    doc = tiny_doc()
    doc["metadata"]["name"] = "tiny-sparse"
    doc["spec"]["method"] = "sparse"
    st = doc["spec"]["stages"]
    st["sft"]["maxSteps"] = 1
    st["rl"]["steps"] = 1
    st["distill"]["limit"] = 4
    st["student"] = {
        "enabled": True,
        "maxSteps": 1,
        "batchSize": 2,
        "perDeviceBatchSize": 2,
        "learningRate": 1.0e-3,
        "maxLength": 400,
        "gradientCheckpointing": False,
    }
    st["evaluate"] = {"enabled": True, "samples": 1, "maxNewTokens": 8, "limit": 4, "batchSize": 4}
    return doc


def test_a_method_reuses_rlts_stage_functions_under_their_names(sparse):
    from rlt.stages.distill import run_distill
    from rlt.stages.sft import run_sft

    assert stage_function("sft", "sparse") is run_sft
    assert stage_function("distill", "sparse") is run_distill
    assert stage_function("rl", "sparse") is run_sparse_rl


@pytest.mark.slow
def test_a_comparable_method_with_its_own_reward_runs_locally_and_through_compare(sparse, tmp_path):
    from rlt.run.compare import ARMS, run_compare
    from rlt.run.plots import read_metrics
    from rlt.run.runner import run_local
    from rlt.spec.loading import parse_run

    doc = sparse_doc()
    doc["spec"]["stages"]["student"]["enabled"] = False
    doc["spec"]["stages"]["evaluate"]["enabled"] = False
    run = parse_run(doc)
    summary = run_local(run, tmp_path / "local", metrics_port=None, only=["sft", "rl"], device="cpu")
    assert list(summary["stages"]) == ["sft", "rl"]
    # TRL called the method's reward (8 completions a step: batchSize), and the step was recorded
    assert CALLS and all(n > 0 for n in CALLS)
    rl = [r for r in read_metrics(tmp_path / "local" / "tiny-sparse" / "metrics.jsonl") if r["stage"] == "rl"]
    assert [r["step"] for r in rl] == [1] and rl[0]["seconds_score"] >= 0

    CALLS.clear()
    report = run_compare(parse_run(sparse_doc()), tmp_path / "cmp", device="cpu", show_progress=False)
    assert CALLS, "rlt compare trained the RL teacher with rlt's reward, not the method's"
    assert set(report["arms"]) == set(ARMS)
    assert all(a["distillRows"] == 4 for a in report["arms"].values()), json.dumps(report["arms"])
