"""A restart changes nothing: the operator's rendered 2-rank trainer command (rlt launch → accelerate → torchrun →
2 DeepSpeed ZeRO-3 ranks over gloo) trains rl with refSync every step and beta > 0; SIGTERM reaches rank 1 at one
phase of step 2 (tests/training/stop_hook: mid-rollout, mid-scoring, mid-accumulation, right after a sync), the
gang stops (exit 75) and a restart trains to the end. The final policy and reference equal an uninterrupted run's,
and no completed step is trained twice.

No random stream differs: a step abandoned mid-way is saved with the random state it started from
(rlt.stages.preemption.save_abandoned), so its redo samples the same completions.

Each phase is two gang runs (about a minute each here); `rollout` and `sync` run in the suite, `scoring` and
`accumulation` when RLT_STOP_MATRIX=1 (their boundaries are also covered in process by test_reference_resume)."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest
import torch
import yaml
from suite_helpers import ROOT
from test_preemption import finish, gang_command, rl_run, rl_steps, start

from rlt.contract.exitcodes import ExitCode
from rlt.contract.layout import RunLayout

pytestmark = pytest.mark.slow

STEPS, STOP_STEP = 3, 2
HOOK = Path(__file__).parent / "stop_hook"
MATRIX = os.environ.get("RLT_STOP_MATRIX") == "1"
PHASES = {  # phase -> the step the stop saves
    "rollout": STOP_STEP - 1,
    "sync": STOP_STEP,
    "scoring": STOP_STEP - 1,
    "accumulation": STOP_STEP - 1,
}
OPT_IN = pytest.mark.skipif(not MATRIX, reason="opt-in (2 gang runs): RLT_STOP_MATRIX=1")


def gang(tmp_path: Path, name: str) -> tuple[list[str], dict[str, str], RunLayout]:
    run = rl_run(
        tmp_path,
        name,
        steps=STEPS,
        batchSize=8,  # 2 ranks × 2 per micro-batch: 2 micro-batches per step
        perDeviceBatchSize=2,
        numGenerations=2,
        maxCompletionLength=6,
        beta=0.04,
        refSync={"enabled": True, "alpha": 0.9, "steps": 1},
    )
    doc = yaml.safe_load(run.read_text())
    doc["spec"]["dataset"]["size"] = 32  # 3 steps of 4 prompts stay in the first epoch
    run.write_text(yaml.safe_dump(doc))
    cmd, extra = gang_command(run, tmp_path, name)
    extra["PYTHONPATH"] = f"{HOOK}:{ROOT / 'training'}:{ROOT / 'operator'}"
    return cmd, extra, RunLayout.for_run(tmp_path / "pvc", name)


def final_state(layout: RunLayout) -> dict[str, dict[str, torch.Tensor]]:
    """The final policy, then the reference the last checkpoint holds (rlt.stages.reference.REFERENCE_FILE)."""
    from safetensors.torch import load_file

    out = {"policy": load_file(str(layout.model_dir("rl") / "model.safetensors"))}
    reference = layout.checkpoint_dir("rl", STEPS) / "rlt-reference.safetensors"
    out["reference"] = load_file(str(reference)) if reference.exists() else {}
    return out


def trained_steps(text: str) -> list[int]:
    """The steps rank 0 began (its rollout's rlt-shard line names the completed steps before it)."""
    return [int(s) + 1 for s in re.findall(r"rlt-shard stage=rl rank=0 step=(\d+) ", text)]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("whole")
    cmd, extra, layout = gang(tmp, "whole")
    log = tmp / "gang.log"
    assert finish(start(cmd, log, tmp, **extra), log, 900) == 0, log.read_text()[-4000:]
    assert trained_steps(log.read_text()) == [1, 2, 3]
    return final_state(layout)


@pytest.mark.parametrize(
    "phase",
    [
        "rollout",
        "sync",
        pytest.param("scoring", marks=OPT_IN),
        pytest.param("accumulation", marks=OPT_IN),
    ],
)
def test_a_gang_stopped_at_any_phase_resumes_to_the_uninterrupted_result(phase, uninterrupted, tmp_path):
    saved = PHASES[phase]
    cmd, extra, layout = gang(tmp_path, f"stop-{phase}")
    log = tmp_path / "stopped.log"
    proc = start(cmd, log, tmp_path, RLT_TEST_SIGTERM_AT=f"{phase}:{STOP_STEP}", **extra)
    code = finish(proc, log, 900)
    text = log.read_text()
    assert f"rlt-test SIGTERM to rank 1 at {phase} of step {STOP_STEP}" in text, text[-4000:]
    assert code == ExitCode.STOPPED, text[-4000:]
    assert "SIGTERM: step abandoned" in text or phase == "sync", text[-4000:]
    assert f"stage rl stopped on SIGTERM after step {saved}; checkpoint" in text, text[-4000:]
    assert rl_steps(layout) == list(range(1, saved + 1))  # an abandoned step leaves no record
    before = trained_steps(text)

    log = tmp_path / "resumed.log"
    assert finish(start(cmd, log, tmp_path, **extra), log, 900) == 0, log.read_text()[-4000:]
    again = trained_steps(log.read_text())
    assert again == list(range(saved + 1, STEPS + 1)), (before, again)  # no completed step trained twice
    assert rl_steps(layout) == list(range(1, STEPS + 1))
    got = final_state(layout)
    for part in ("policy", "reference"):  # the policy first: it differs too when the reference was not resumed
        assert uninterrupted[part], f"the uninterrupted run left no {part}"
        assert set(got[part]) == set(uninterrupted[part])
        for name, want in uninterrupted[part].items():
            torch.testing.assert_close(got[part][name], want, rtol=0, atol=1e-6, msg=f"{part} {name} ({phase})")
    print(
        f"\n{phase}: stopped (exit 75) after step {saved}, steps {before} then {again}; final policy and reference equal"
    )


def test_the_hook_is_inert_without_its_variable():
    """The rank-side hook patches nothing in a process that does not ask for it (every other test's ranks)."""
    import subprocess

    probe = "import rlt.stages.rl as rl, sys; sys.exit(rl.sample_policy.__module__ != 'rlt.stages.rl')"
    env = {**os.environ, "PYTHONPATH": f"{HOOK}:{ROOT / 'training'}", "RANK": "1"}
    env.pop("RLT_TEST_SIGTERM_AT", None)
    assert subprocess.run([sys.executable, "-c", probe], env=env, check=False).returncode == 0
