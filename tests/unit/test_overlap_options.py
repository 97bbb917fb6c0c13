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
