"""generation.overlap oneStepOff (rlt.stages.overlap): the TRL options and the behaviour policy it picks per mode."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from suite_helpers import tiny_doc

from rlt.spec.loading import parse_run


@pytest.fixture
def one_step_off(monkeypatch):
    from rlt.stages import overlap

    monkeypatch.setattr(overlap, "steps_off_policy", lambda st: overlap.MAX_STEPS_OFF_POLICY)


def _ctx(tmp_path, **gen):
    from rlt.contract.layout import RunLayout
    from rlt.stages.context import StageContext

    doc = tiny_doc()
    doc["spec"]["stages"]["rl"]["generation"] = gen
    run = parse_run(doc)
    return StageContext(run, RunLayout.for_run(tmp_path, "tiny"))


def test_served_one_step_off_needs_trls_importance_sampling(tmp_path, one_step_off):
    from rlt.stages.rl import grpo_options

    ctx = _ctx(tmp_path, mode="server", serverUrl="http://gen:8000", importanceSampling="off")
    with pytest.raises(ValueError, match="stages.rl.generation.importanceSampling: overlap oneStepOff needs"):
        grpo_options(ctx, "cpu")
    opts = grpo_options(
        _ctx(tmp_path, mode="server", serverUrl="http://g:8000", importanceSampling="tokenTruncate"), "cpu"
    )
    assert opts["use_vllm"] and opts["vllm_mode"] == "server" and opts["vllm_importance_sampling_correction"]
    assert opts["vllm_importance_sampling_mode"] == "token_truncate"


def test_the_behaviour_policy_per_mode(tmp_path, one_step_off):
    from rlt.stages import overlap
    from rlt.stages.record import PhaseTimer
    from rlt.stages.rl import rollout_ahead

    def built(ctx, use_vllm):
        args = SimpleNamespace(use_vllm=use_vllm)
        return rollout_ahead(ctx, args, None, lambda p, t: {}, lambda p, t: {}, PhaseTimer())  # type: ignore[arg-type]

    served = built(_ctx(tmp_path, mode="server", serverUrl="http://g:8000", importanceSampling="tokenMask"), True)
    assert isinstance(served.behaviour, overlap.ServedBehaviour) and served.behaviour.base_url == "http://g:8000"
    local = built(_ctx(tmp_path, mode="inprocess"), False)
    assert isinstance(local.behaviour, overlap.LocalBehaviour)


def test_off_by_default(tmp_path):
    from rlt.stages.overlap import steps_off_policy
    from rlt.stages.rl import rollout_ahead

    ctx = _ctx(tmp_path, mode="inprocess")
    assert steps_off_policy(ctx.spec.stages.rl) == 0
    assert rollout_ahead(ctx, SimpleNamespace(use_vllm=False), None, None, None, None) is None  # type: ignore[arg-type]


def test_served_rollouts_are_seeded_per_group():
    """ServedBehaviour: a group's repeats go to vLLM as one prompt with n samples under the rollout's seed (vLLM seeds
    sample j with seed + j; the same prompt twice under one seed would be one sequence twice), and the samples come
    back in TRL's row order. server_generate is replaced by a stand-in that names what it was asked (given as
    `generate`, in place of the client process)."""
    from rlt.method import generation
    from rlt.spec.stages import RlStage
    from rlt.stages.overlap import ServedBehaviour, rollout_seed

    asked: list = []

    def stand_in(base_url, prompt_ids, *, n, seed, **kw):
        asked.append((prompt_ids, n, seed))
        ids = [[p[0], j, seed] for p in prompt_ids for j in range(n)]
        return generation.Samples([], ids, [[-0.5] * 3 for _ in ids])

    served = ServedBehaviour("http://g:8000", RlStage(), timeout=5, generate=stand_in)
    a, b, c = [1, 1], [2], [3]
    ids, logprobs = served([a, a, b, b, a, c], seed=40)
    sizes = {n: (prompts, seed) for prompts, n, seed in asked}
    assert sizes[3][0] == [a] and sizes[2][0] == [b] and sizes[1][0] == [c]
    assert len({seed for _, seed in sizes.values()}) == 3  # requests of each size on a seed of their own
    assert [i[:2] for i in ids] == [[1, 0], [1, 1], [2, 0], [2, 1], [1, 2], [3, 0]]  # every row its own sample
    assert all(lp == [-0.5] * 3 for lp in logprobs)
    # a rollout's seed: one per (spec.seed, step, rank), a valid int64 after server_generate adds the sample index
    seeds = {rollout_seed(0, step, rank) for step in range(50) for rank in range(8)}
    assert len(seeds) == 400 and max(seeds) + 10_000 * 64 < 2**63
    assert rollout_seed(0, 3, 1) == rollout_seed(0, 3, 1) != rollout_seed(1, 3, 1)


@pytest.mark.parametrize(
    ("rl", "method", "refusal"),
    [
        ({"topP": 0.9}, "rlt", r"stages\.rl\.topP: 0\.9 with overlap oneStepOff in mode inprocess"),
        (
            {"trainerArgs": {"cast_lm_head_to_fp32": True}},
            "rlt",
            r"stages\.rl\.trainerArgs\.cast_lm_head_to_fp32 with overlap oneStepOff in mode inprocess",
        ),
        ({}, "rcl", r"stages\.rl\.generation\.overlap: oneStepOff with method rcl"),
    ],
)
def test_one_step_off_refuses_what_would_bias_its_ratio_or_sample_with_live_weights(rl, method, refusal):
    """In-process one step off with topP < 1 (the behaviour log-probs are the nucleus', the policy's are not), with
    TRL's fp32 head (a closure over the live head, which the behaviour copy would call) or under RCL (its probe draws
    from torch's shared generator beside the reward): each refused by the spec, naming the field; each accepted
    without one step off."""
    doc = tiny_doc()
    doc["spec"]["method"] = method
    doc["spec"]["stages"]["distill"]["enabled"] = method == "rlt"  # rcl has no distill stage
    doc["spec"]["stages"]["rl"].update(rl)
    parse_run(doc)  # without one step off: accepted
    generation = doc["spec"]["stages"]["rl"].setdefault("generation", {})
    generation["overlap"] = "oneStepOff"
    with pytest.raises(ValueError, match=refusal):
        parse_run(doc)


def test_the_weight_push_waits_for_every_rollout_and_every_rank_waits_for_the_push():
    """rlt.stages.overlap.wait_before_weight_push, with hand-written stand-ins recording the order (a mock: the push
    needs a GPU vLLM): the rollout in flight joined, all ranks met, TRL's push, all ranks met again; a rank that sent
    its next rollout before rank 0's push ended would sample on the old weights."""
    from rlt.stages import overlap

    order = []
    trainer = SimpleNamespace(
        vllm_generation=SimpleNamespace(sync_weights=lambda: order.append("push")),
        accelerator=SimpleNamespace(wait_for_everyone=lambda: order.append("barrier")),
    )
    ahead = SimpleNamespace(join=lambda: order.append("join"))
    overlap.wait_before_weight_push(trainer, ahead)
    trainer.vllm_generation.sync_weights()
    assert order == ["join", "barrier", "push", "barrier"]
