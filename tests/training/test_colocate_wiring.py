"""generation.mode colocate, wired end to end: the real rl stage (grpo_options' colocate settings, TRL's GRPOTrainer and
its own VLLMGeneration in colocate mode, rlt's rollout and weight-sync timing) against a stand-in for vLLM's `LLM`.
vLLM's CPU build cannot run colocated (it refuses sleep mode: "Sleep mode is not supported on current platform.",
benchmarks/overlap.py prints it), so this is where the colocated path runs before a GPU: the engine is built with
rlt's share of the GPU and sleep mode, sleeps while the trainer updates, and before each rollout is woken, handed the
policy's weights of that very step and its KV cache, in that order. The memory the plan charges for it is checked in
tests/unit/test_goodput_plan.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from suite_helpers import TINY

from rlt.checks.validation import load_valid_run
from rlt.contract.layout import RunLayout
from rlt.stages.context import StageContext

pytestmark = pytest.mark.slow
STEPS = 3


class FakeLLM:
    """Hand-written stand-in for vllm.LLM (not installed in the trainer's venv, and its CPU build refuses sleep mode):
    records what TRL's colocate mode asks of it, with the trainer's step at each call, and the weights it is handed;
    answers every prompt with one short completion and its log-probs."""

    built: list[FakeLLM] = []
    trainer: object = None
    answer: list[int] = []

    def __init__(self, **kwargs):
        self.kwargs, self.events, self.loaded = kwargs, [], {}
        model = SimpleNamespace(load_weights=self.load_weights)
        self.llm_engine = SimpleNamespace(
            model_executor=SimpleNamespace(driver_worker=SimpleNamespace(model_runner=SimpleNamespace(model=model)))
        )
        FakeLLM.built.append(self)

    def step(self) -> int:
        return -1 if FakeLLM.trainer is None else FakeLLM.trainer.state.global_step

    def sleep(self, level):
        self.events.append(("sleep", level, self.step()))

    def wake_up(self, tags=None):
        self.events.append(("wake", tuple(tags or ()), self.step()))

    def load_weights(self, weights):
        for name, tensor in weights:
            self.loaded.setdefault(self.step(), {})[name] = tensor.detach().clone()
        if not self.events or self.events[-1][0] != "load":
            self.events.append(("load", self.step()))

    def reset_prefix_cache(self):
        self.events.append(("reset", self.step()))

    def generate(self, prompts, sampling_params, use_tqdm):
        self.events.append(("generate", len(prompts), self.step()))
        lp = SimpleNamespace(logprob=-0.5, rank=1)
        out = []
        for i, p in enumerate(prompts):  # answers of different lengths: a group's rewards differ, so GRPO learns
            ids = self.answer[i % 4 :]
            done = SimpleNamespace(token_ids=list(ids), logprobs=[{t: lp} for t in ids])
            out.append(SimpleNamespace(prompt_token_ids=p["prompt_token_ids"], outputs=[done]))
        return out


class FakeSamplingParams:
    """Stand-in for vllm.SamplingParams: keeps what TRL asked for."""

    def __init__(self, **kwargs):
        self.kwargs = kwargs


def test_colocated_rl_sleeps_the_engine_and_wakes_it_with_each_steps_weights(tmp_path, monkeypatch, tiny):
    from transformers import TrainerCallback
    from trl.generation import vllm_generation

    from rlt.stages import rl
    from rlt.stages import trainer as trainer_mod

    run = load_valid_run(TINY)
    spec = run.spec.model_dump(by_alias=True)
    spec["stages"]["sft"]["enabled"] = False
    spec["stages"]["rl"].update(
        steps=STEPS, batchSize=8, numGenerations=4, perDeviceBatchSize=8, learningRate=1e-2, warmupRatio=0.0
    )
    spec["stages"]["rl"]["generation"] = {"mode": "colocate", "maxModelLen": 512}
    run = run.model_validate({**run.model_dump(by_alias=True), "spec": spec})
    _, tok = tiny
    FakeLLM.built, FakeLLM.trainer = [], None
    FakeLLM.answer = tok("The sum is 14.", add_special_tokens=False).input_ids + [tok.eos_token_id]
    monkeypatch.setattr(vllm_generation, "is_vllm_available", lambda: True)
    monkeypatch.setattr(vllm_generation, "LLM", FakeLLM, raising=False)
    monkeypatch.setattr(vllm_generation, "SamplingParams", FakeSamplingParams, raising=False)
    monkeypatch.setattr(rl, "is_cuda", lambda device: True)  # past grpo_options' refusal of colocate on CPU
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.setenv(name, "unset below")  # TRL's colocate mode sets them: as they were after the test
        monkeypatch.delenv(name)
    policy_at: dict[int, dict[str, torch.Tensor]] = {}

    class Weights(TrainerCallback):
        def on_step_begin(self, args, state, control, model=None, **kw):
            policy_at[state.global_step] = {k: v.detach().clone() for k, v in model.named_parameters()}

    build = trainer_mod.TrainerRun.trainer

    def watched(self, *a, **kw):
        t = build(self, *a, **kw)
        FakeLLM.trainer = t
        t.add_callback(Weights())
        return t

    monkeypatch.setattr(trainer_mod.TrainerRun, "trainer", watched)
    rl.run_rl(StageContext(run, RunLayout(tmp_path / "run"), device="cpu", show_progress=False))

    (llm,) = FakeLLM.built  # one engine, in the trainer's process
    assert llm.kwargs["enable_sleep_mode"] is True
    assert llm.kwargs["gpu_memory_utilization"] == 0.3  # rlt's share beside training, not a generator pod's 0.9
    assert llm.kwargs["max_model_len"] == 512 and llm.kwargs["logprobs_mode"] == "processed_logprobs"
    # built asleep; each step: weights woken and loaded with the policy, cache reset, KV cache woken, one rollout of
    # the step's 8 rows, asleep again before the scoring and the update
    cycle = [
        lambda s: ("wake", ("weights",), s),
        lambda s: ("load", s),
        lambda s: ("reset", s),
        lambda s: ("wake", ("kv_cache",), s),
        lambda s: ("generate", 8, s),
        lambda s: ("sleep", 2, s),
    ]
    assert llm.events == [("sleep", 2, -1)] + [e(s) for s in range(STEPS) for e in cycle]
    for step in range(STEPS):  # the weights handed over are the policy's at that step, every parameter
        loaded, policy = llm.loaded[step], policy_at[step]
        assert set(loaded) == set(policy)
        assert all(torch.equal(loaded[k], policy[k]) for k in policy), f"step {step}: not the step's policy"
    assert any(not torch.equal(policy_at[0][k], policy_at[STEPS - 1][k]) for k in policy_at[0])  # it did train
