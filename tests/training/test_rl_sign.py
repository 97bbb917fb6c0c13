"""RL moves the reward the right way: a few dozen GRPO steps of the real rl stage on the tiny model raise the mean RLT
reward clearly above its run-to-run noise, and the same run with the reward negated lowers it. The cheapest proof that
reward, advantages and loss are wired with the right signs."""

from __future__ import annotations

import statistics

import pytest
from suite_helpers import TINY

from rlt.checks.validation import load_valid_run
from rlt.contract.layout import RunLayout
from rlt.stages.context import StageContext

pytestmark = pytest.mark.slow
STEPS, WINDOW = 20, 8


def rl_run(tmp_path, sign: float, learning_rate: float) -> list[float]:
    """Mean RLT reward per step of the rl stage, with the reward GRPO sees multiplied by `sign`."""

    from rlt.stages import rl

    run = load_valid_run(TINY)
    spec = run.spec.model_dump(by_alias=True)
    spec["dataset"]["size"] = 8  # a fixed prompt set: 8 questions, seen again and again
    spec["stages"]["sft"]["enabled"] = False
    spec["stages"]["rl"].update(
        steps=STEPS,
        batchSize=8,
        numGenerations=4,
        perDeviceBatchSize=8,
        learningRate=learning_rate,
        beta=0.0,
        maxCompletionLength=8,
        saveSteps=10_000,
    )
    run = run.model_validate({**run.model_dump(by_alias=True), "spec": spec})
    per_step: list[float] = []
    build = rl.reward_from_spec

    def signed_reward(*a, **kw):
        reward = build(*a, **kw)

        class Signed(type(reward)):
            def __call__(self, *args, **kwargs):
                values = super().__call__(*args, **kwargs)
                per_step.append(statistics.fmean(values))
                return [sign * v for v in values]

        reward.__class__ = Signed
        return reward

    rl.reward_from_spec = signed_reward
    try:
        rl.run_rl(
            StageContext(run, RunLayout(tmp_path / f"run{sign}{learning_rate}"), device="cpu", show_progress=False)
        )
    finally:
        rl.reward_from_spec = build
    assert len(per_step) == STEPS
    return per_step


def test_grpo_raises_the_rlt_reward_and_the_negated_reward_lowers_it(tmp_path):
    control = rl_run(tmp_path, 1.0, 1e-12)  # no learning: the reward's own noise from step to step
    up = rl_run(tmp_path, 1.0, 3e-3)
    down = rl_run(tmp_path, -1.0, 3e-3)
    noise = statistics.stdev(control) / WINDOW**0.5  # standard error of a WINDOW-step mean
    late = {
        name: statistics.fmean(curve[-WINDOW:]) for name, curve in (("control", control), ("up", up), ("down", down))
    }
    print(
        {
            "control": [round(x, 3) for x in control],
            "up": [round(x, 3) for x in up],
            "down": [round(x, 3) for x in down],
            "late": late,
            "noise": noise,
        }
    )
    assert late["up"] - late["control"] > 4 * noise, (late, noise)
    assert late["down"] - late["control"] < -4 * noise, (late, noise)
