"""generation.mode colocate: TRL's colocate mode (vLLM inside each trainer process); no generator pods."""

from __future__ import annotations

import pytest
from suite_helpers import tiny_doc

from rlt.spec.loading import SpecError, parse_run


def _run(mode: str, **gen):
    doc = tiny_doc()
    doc["spec"]["stages"]["rl"]["generation"] = {"mode": mode, **gen}
    return parse_run(doc)


def test_colocate_configures_trl_and_needs_no_generator_pods(tmp_path):
    from rlt.contract.layout import RunLayout
    from rlt.spec.run import needs_generators  # what the operator asks before it renders generators
    from rlt.stages.context import StageContext
    from rlt.stages.rl import grpo_config

    run = _run("colocate")
    ctx = StageContext(run, RunLayout.for_run(tmp_path, "tiny"))
    with pytest.raises(ValueError, match="colocate runs vLLM inside the trainer .* on CPU use inprocess"):
        grpo_config(ctx, "cpu")
    assert not needs_generators(run.spec, "rl")
    # On a GPU the same spec becomes TRL's colocate mode with a training-friendly vLLM memory share.
    import trl

    seen = {}
    real = trl.GRPOConfig

    def capture(**kw):
        seen.update(kw)
        raise RuntimeError("stop")  # the config itself would look for a GPU

    trl.GRPOConfig = capture
    try:
        with pytest.raises(RuntimeError, match="stop"):
            grpo_config(ctx, "cuda")
    finally:
        trl.GRPOConfig = real
    assert seen["use_vllm"] is True and seen["vllm_mode"] == "colocate"
    assert seen["vllm_gpu_memory_utilization"] == 0.3
    # the engine sleeps while the trainer updates (TRL wakes it and pushes the weights before each rollout)
    assert seen["vllm_enable_sleep_mode"] is True


@pytest.mark.parametrize(
    ("generation", "message"),
    [
        ({"mode": "colocate"}, r"stages.evaluate.generation.mode: Input should be 'inprocess' or 'server'"),
        # rl-only settings have no meaning for evaluate, so its model does not carry them
        ({"importanceSampling": "tokenMask"}, "stages.evaluate.generation.importanceSampling: unknown field"),
        ({"gpuMemoryUtilization": 0.5}, "stages.evaluate.generation.gpuMemoryUtilization: unknown field"),
    ],
)
def test_evaluate_generation_has_no_rl_only_settings(generation, message):
    doc = tiny_doc()
    doc["spec"]["stages"]["evaluate"] = {"enabled": True, "generation": generation}
    with pytest.raises(SpecError, match=message):
        parse_run(doc)
