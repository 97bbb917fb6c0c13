"""generation.overlap oneStepOff and partialRollouts (rlt.stages.overlap): the TRL options, the behaviour policy each
picks per mode, the order of the weight push, and the rollouts two steps ahead."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from suite_helpers import tiny_doc

from rlt.spec.loading import parse_run


@pytest.fixture
def one_step_off(monkeypatch):
    from rlt.stages import overlap

    monkeypatch.setattr(overlap, "steps_off_policy", lambda st: overlap.STEPS_OFF_POLICY[overlap.ONE_STEP_OFF])


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
    """ServedBehaviour: each group (a prompt's repeats) goes to vLLM as a request of its own, one prompt with n
    samples, on a seed of its own from the rollout's seed and the prompt (vLLM seeds sample j of every prompt of a
    request with seed + j: prompts sharing a request would share their draws; the real server's side of it is
    tests/training/test_served_behaviour.py), all of the rollout's requests in one call, and the samples come back in
    TRL's row order. The client process is replaced by a stand-in that names what it was asked (given as
    `generate`)."""
    from rlt.method import generation
    from rlt.spec.stages import RlStage
    from rlt.stages.overlap import ServedBehaviour, group_seed, rollout_seed

    asked: list = []

    def stand_in(base_url, requests, **kw):
        asked.append(requests)
        return [
            generation.Samples([], [[r.prompt_ids[0], j, r.seed] for j in range(r.n)], [[-0.5] * 3] * r.n)
            for r in requests
        ]

    served = ServedBehaviour("http://g:8000", RlStage(), timeout=5, generate=stand_in)
    a, b, c = [1, 1], [2], [3]
    ids, logprobs = served([a, a, b, b, a, c], seed=40)
    assert len(asked) == 1  # one call: the rollout's requests go out together
    (requests,) = asked
    assert [(r.prompt_ids, r.n) for r in requests] == [(a, 3), (b, 2), (c, 1)]
    assert len({r.seed for r in requests}) == 3  # every group a seed of its own
    assert [i[:2] for i in ids] == [[1, 0], [1, 1], [2, 0], [2, 1], [1, 2], [3, 0]]  # every row its own sample
    assert all(lp == [-0.5] * 3 for lp in logprobs)
    # a group's seed is the rollout's and the prompt's alone: b alone, or beside other prompts, draws the same
    served([b, b], seed=40)
    assert asked[-1][0].seed == requests[1].seed == group_seed(40, b) != group_seed(41, b)
    # seeds are valid int64 after vLLM adds the sample index
    seeds = {rollout_seed(0, step, rank) for step in range(50) for rank in range(8)}
    assert len(seeds) == 400 and max(seeds) + 10_000 * 64 < 2**63
    assert rollout_seed(0, 3, 1) == rollout_seed(0, 3, 1) != rollout_seed(1, 3, 1)
    assert max(group_seed(s, [t] * 20) for s in seeds for t in range(3)) + 4096 < 2**63


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


def pushing(order: list, main: bool = True, step: int = 3):
    return SimpleNamespace(
        state=SimpleNamespace(global_step=step),
        vllm_generation=SimpleNamespace(sync_weights=lambda: order.append("push")),
        accelerator=SimpleNamespace(wait_for_everyone=lambda: order.append("barrier"), is_main_process=main),
    )


def test_the_weight_push_waits_for_every_rollout_and_every_rank_waits_for_the_push():
    """rlt.stages.overlap.wait_before_weight_push, with hand-written stand-ins recording the order (a mock: the push
    needs a GPU vLLM): the step's rollout joined, all ranks met, TRL's push, all ranks met again; a rank that sent
    its next rollout before rank 0's push ended would sample on the old weights."""
    from rlt.stages import overlap

    order: list = []
    trainer = pushing(order)
    ahead = SimpleNamespace(join=lambda upto=None: order.append(("join", upto)))
    overlap.wait_before_weight_push(trainer, ahead)
    trainer.vllm_generation.sync_weights()
    assert order == [("join", 3), "barrier", "push", "barrier"]


def test_partial_rollouts_hold_the_later_rows_through_rank_zeros_push():
    """Partial rollouts (a mock hold recording its calls): only step k's rollout is joined, rank 0 pushes inside the
    hold (pause, push, KV reset, resume), the other ranks take part in the push's collectives without touching the
    server."""
    from contextlib import contextmanager

    from rlt.stages import overlap

    for main, inside in ((True, ["pause", "push", "reset+resume"]), (False, ["push"])):
        order: list = []

        @contextmanager
        def hold(order=order):
            order.append("pause")
            yield
            order.append("reset+resume")

        trainer = pushing(order, main=main, step=7)
        ahead = SimpleNamespace(join=lambda upto=None, order=order: order.append(("join", upto)))
        overlap.wait_before_weight_push(trainer, ahead, hold)
        trainer.vllm_generation.sync_weights()
        assert order == [("join", 7), "barrier", *inside, "barrier"]


def test_the_hold_and_the_push_are_the_steps_weight_sync_and_the_rollouts_wait_is_not(monkeypatch):
    """The pause, the push and the KV reset with the resume are timed as weight_sync; the wait for step k's rollout
    is not (a fake clock that the stand-ins advance: the join 100 s, the pause 1, the push 2, the reset 4)."""
    from contextlib import contextmanager

    from rlt.stages import overlap, record

    now = [0.0]
    monkeypatch.setattr(record, "time", SimpleNamespace(perf_counter=lambda: now[0]))

    def advance(seconds):
        now[0] += seconds

    @contextmanager
    def hold():
        advance(1)
        yield
        advance(4)

    trainer = pushing([])
    trainer.vllm_generation.sync_weights = lambda: advance(2)
    timer = record.PhaseTimer()
    overlap.wait_before_weight_push(trainer, SimpleNamespace(join=lambda upto=None: advance(100)), hold, timer)
    trainer.vllm_generation.sync_weights()
    assert timer.take() == {"weight_sync": 7.0}


def test_a_phase_counts_wall_time_once_however_many_blocks_overlap_and_never_more_than_its_step(monkeypatch):
    """Two rollouts generating at once (partial rollouts) count their overlap once; a rollout still running when the
    step's figures are taken gives that step its seconds so far and the next the rest (a fake clock)."""
    from rlt.stages import record

    now = [0.0]
    monkeypatch.setattr(record, "time", SimpleNamespace(perf_counter=lambda: now[0]))
    timer = record.PhaseTimer()
    first, second = timer.phase("generate"), timer.phase("generate")
    first.__enter__()  # t 0: step k+1's rollout
    now[0] = 1.0
    second.__enter__()  # t 1: step k+2's, beside it
    now[0] = 3.0
    first.__exit__(None, None, None)
    now[0] = 4.0
    assert timer.take() == {"generate": 4.0}  # not 3 + 3: the step lasted 4 s
    now[0] = 6.5
    second.__exit__(None, None, None)
    with timer.phase("reward"):
        now[0] = 7.0
    assert timer.take() == {"generate": 2.5, "reward": 0.5}  # the rest of step k+2's rollout
    assert timer.take() == {}


def partial_doc(**gen):
    doc = tiny_doc()
    doc["spec"]["stages"]["rl"]["generation"] = {"mode": "server", "importanceSampling": "tokenTruncate", **gen}
    doc["spec"].setdefault("resources", {}).setdefault("generator", {})["gpus"] = 1
    doc["spec"]["stages"]["rl"]["generation"]["overlap"] = "partialRollouts"
    return doc


def test_partial_rollouts_need_a_server_and_the_importance_ratio():
    parse_run(partial_doc())  # served, with TRL's importance sampling: accepted
    with pytest.raises(ValueError, match="stages.rl.generation.importanceSampling: off with overlap partialRollouts"):
        parse_run(partial_doc(importanceSampling="off"))
    with pytest.raises(ValueError, match="stages.rl.generation.overlap: partialRollouts with mode inprocess"):
        parse_run(partial_doc(mode="inprocess"))


def test_partial_rollouts_run_two_steps_ahead_with_a_client_each(tmp_path):
    from rlt.stages import overlap
    from rlt.stages.record import PhaseTimer
    from rlt.stages.rl import rollout_ahead

    run = parse_run(partial_doc(serverUrl="http://g:8000"))
    ctx = SimpleNamespace(spec=run.spec, world_size=lambda: 2)
    ahead = rollout_ahead(ctx, SimpleNamespace(use_vllm=True), None, None, None, PhaseTimer())  # type: ignore[arg-type]
    assert ahead is not None and ahead.depth == 2 == overlap.steps_off_policy(run.spec.stages.rl)
    assert isinstance(ahead.behaviour, overlap.ServedBehaviour) and ahead.behaviour.clients.qsize() == 2
    g = run.spec.stages.rl.num_generations  # 256 sequences of one engine for 2 ranks × 2 rollouts each
    assert ahead.behaviour.in_flight == max(1, 64 // g)


@pytest.mark.parametrize(
    ("engines", "ranks", "overlap_mode", "g", "groups"),
    [
        (1, 1, "oneStepOff", 64, 4),  # vLLM's 256 sequences an engine, in groups of 64
        (1, 1, "partialRollouts", 64, 2),  # two rollouts in flight share them
        (4, 8, "oneStepOff", 16, 8),  # 1024 sequences for 8 ranks: 128 each
        (1, 8, "oneStepOff", 64, 1),  # never none: a group that waits in vLLM's queue beats no rollout
    ],
)
def test_a_rank_keeps_what_the_generators_decode_at_once_in_flight(engines, ranks, overlap_mode, g, groups):
    """A served rollout's groups go to the generators as slots free up, not all at once: a request that waits in
    vLLM's queue gets no byte, and a long enough wait reads as a cut stream (serverTimeoutSeconds)."""
    from rlt.stages.overlap import groups_in_flight

    doc = partial_doc()
    doc["spec"]["stages"]["rl"]["generation"]["overlap"] = overlap_mode
    doc["spec"]["stages"]["rl"].update(numGenerations=g, batchSize=g)
    doc["spec"]["resources"]["generator"].update(gpus=engines, dataParallelSize=engines)  # one server, data-parallel
    spec = parse_run(doc).spec
    assert groups_in_flight(spec.stages.rl, spec.resources.generator, ranks) == groups


class Behind:
    """A stand-in behaviour (no weights): records each refresh's step."""

    def __init__(self):
        self.refreshed: list[int] = []

    def refresh(self, trainer):
        self.refreshed.append(trainer.state.global_step)

    def __call__(self, prompt_ids, seed):
        raise AssertionError("the stand-in rollouts never sample")


def test_two_rollouts_stay_in_flight_and_each_step_trains_its_own(monkeypatch):
    """RolloutAhead at depth 2 over 6 steps of a stand-in trainer (a hand-written mock: no TRL loop), the rollouts
    real threads that block until released: after each step two rollouts are in flight (the next two steps', while
    steps remain), a step takes the rows started for it, sampled two steps before (one for step 1), never joining a
    later step's rollout, and rows for other prompts are dropped."""
    import threading

    from rlt.stages import overlap
    from rlt.stages.record import PhaseTimer

    gates: dict[int, threading.Event] = {}
    started: list[tuple[int, int]] = []  # (the step that trains on it, the step it started in)
    trainer = SimpleNamespace(
        state=SimpleNamespace(global_step=0, max_steps=6),
        args=SimpleNamespace(seed=0),
        accelerator=SimpleNamespace(process_index=0),
    )

    def rollout(prompts, t):
        return {"prompts": prompts, "sampled_at": t.state.global_step}

    def ahead_rollout(prompts, t):
        step = int(prompts[0][1:])
        gates.setdefault(step, threading.Event()).wait(timeout=60)
        return {"prompts": prompts}

    real_started = overlap.RolloutAhead.started

    def recorded(self, prompts, t, step):
        started.append((step, t.state.global_step))
        return real_started(self, prompts, t, step)

    monkeypatch.setattr(overlap.RolloutAhead, "started", recorded)
    behaviour = Behind()
    ahead = overlap.RolloutAhead(rollout, ahead_rollout, behaviour, PhaseTimer(), depth=2)  # type: ignore[arg-type]
    prompts = {k: [f"p{k}"] for k in range(6)}
    for step in range(6):
        trainer.state.global_step = step
        ahead.next_prompts = [prompts[k] for k in (step + 1, step + 2) if k < 6]
        gates.setdefault(step, threading.Event()).set()  # this step's rollout may end; later ones still decode
        rows = ahead(prompts[step] if step != 4 else ["other"], trainer)
        assert rows["prompts"] == (prompts[step] if step != 4 else ["other"])
        assert sorted(ahead.in_flight) == [k for k in (step + 1, step + 2) if k < 6]
        assert not any(f.rows.done() for f in ahead.in_flight.values())  # still decoding: their gates are shut
    for gate in gates.values():
        gate.set()
    assert started == [(1, 0), (2, 0), (3, 1), (4, 2), (5, 3)]
    # step 0 on-policy; 1-3 and 5 from their rollouts; step 4's rollout was for p4, the step's prompts "other"
    assert ahead.counts == {"ahead": 4, "on_policy": 2, "dropped": 1}
    assert behaviour.refreshed == [0, 1, 2, 3, 4]  # the behaviour follows the policy once per step that starts one


def test_served_rows_are_corrected_once_by_the_folded_ratio():
    """Served with overlap, TRL's importance ratio (folded: rlt.stages.folded_ratio) is the correction: the
    behaviour log-probs must not also become old_per_token_logps (GRPO's clip around π_θ/μ, then the ratio again).
    In-process they are the correction. And a batch that carries both is refused by the folded loss."""
    import torch

    from rlt.stages import overlap
    from rlt.stages.folded_ratio import folded_ratio

    def scored(*a, **kw):
        return {"sampling_per_token_logps": torch.zeros(1, 2)}

    served = SimpleNamespace(use_vllm=True, _generate_and_score_completions=scored)
    overlap.behaviour_is_old_policy(served)
    assert "old_per_token_logps" not in served._generate_and_score_completions()
    local = SimpleNamespace(use_vllm=False, _generate_and_score_completions=scored)
    overlap.behaviour_is_old_policy(local)
    out = local._generate_and_score_completions()
    assert out["old_per_token_logps"] is out["sampling_per_token_logps"]

    class Base:  # a hand-written stand-in for GRPOTrainer's attributes and loss
        def __init__(self):
            self.args = SimpleNamespace(gradient_accumulation_steps=2, steps_per_generation=2)
            self.use_vllm = self.vllm_importance_sampling_correction = True
            self.num_iterations = 1

        def _compute_loss(self, model, inputs):
            return 0.0

    trainer = folded_ratio(Base)()
    assert trainer.fold_ratio and trainer._compute_loss(None, {"completion_mask": torch.ones(1, 2)}) == 0.0
    with pytest.raises(RuntimeError, match="both correct the same lag"):
        trainer._compute_loss(None, {"old_per_token_logps": torch.zeros(1, 2)})
