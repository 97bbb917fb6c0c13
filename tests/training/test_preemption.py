"""SIGTERM mid-RL (preemption, drain, suspend) loses no completed step: the gang stops at the next micro-batch
boundary, saves a complete checkpoint of its last completed step, exits STOPPED (75), and a restart resumes from it.

Real processes: `rlt stage rl` alone, and the operator's rendered 2-rank trainer command (`rlt launch` →
accelerate launch → torchrun → 2 DeepSpeed ranks over gloo) with SIGTERM sent to ONE rank only, as when one pod of
a gang is preempted: the other rank must agree, save the same step and stop too."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from suite_helpers import ROOT, free_port, kill_gang, tiny_doc

from rlt.checks.validation import validate_spec
from rlt.contract.exitcodes import ExitCode
from rlt.contract.layout import RunLayout
from rlt_operator import builders
from rlt_sandbox.kubelet_model import expand

pytestmark = pytest.mark.slow

STEPS = 12  # far more than the test lets run: the stop comes mid-stage
SAVE_STEPS = 100  # no periodic checkpoint: the only one is the one the stop writes


def rl_run(tmp_path: Path, name: str, **rl) -> Path:
    doc = tiny_doc()
    doc["metadata"]["name"] = name
    doc["spec"]["stages"]["sft"] = {"enabled": False}
    doc["spec"]["stages"]["distill"] = {"enabled": False}
    doc["spec"]["stages"]["rl"].update(
        steps=STEPS, saveSteps=SAVE_STEPS, batchSize=4, perDeviceBatchSize=2, numGenerations=2, maxCompletionLength=8
    )
    doc["spec"]["stages"]["rl"].update(rl)
    doc["spec"]["dataset"]["size"] = 16
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def env(**more: str) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": f"{ROOT / 'training'}:{ROOT / 'operator'}",
        "PYTHONUNBUFFERED": "1",
        "RLT_METRICS_PORT": "-1",
        "RLT_TRACE": "1",  # the rlt-shard step lines this test reads (a single local process hides them otherwise)
        "OMP_NUM_THREADS": "1",
        "CUDA_VISIBLE_DEVICES": "",
        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",  # the image's rlt, accelerate
        **more,
    }


def rl_steps(layout: RunLayout) -> list[int]:
    if not layout.metrics_file.exists():
        return []
    return [json.loads(line)["step"] for line in layout.metrics_file.read_text().splitlines() if line.strip()]


def wait(predicate, what: str, proc: subprocess.Popen, log: Path, timeout: float = 300):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if proc.poll() is not None:
            raise AssertionError(f"exited {proc.returncode} before {what}:\n{log.read_text()[-4000:]}")
        time.sleep(0.05)
    kill_gang(proc, log)
    raise AssertionError(f"timed out waiting for {what}:\n{log.read_text()[-4000:]}")


def finish(proc: subprocess.Popen, log: Path, timeout: float = 120) -> int:
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_gang(proc, log)
        raise AssertionError(
            f"did not exit {timeout} s after SIGTERM (a rank waiting on another?):\n{log.read_text()[-4000:]}"
        ) from None


def start(cmd: list[str], log: Path, cwd: Path, **more: str) -> subprocess.Popen:
    return subprocess.Popen(
        cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, cwd=cwd, env=env(**more), start_new_session=True
    )


def checkpoint_steps(layout: RunLayout) -> list[int]:
    d = layout.checkpoints_dir("rl")
    return sorted(int(p.name.split("-")[1]) for p in d.glob("checkpoint-*") if (p / "RLT_COMPLETE").exists())


def resume_and_check(cmd: list[str], layout: RunLayout, tmp_path: Path, stopped_at: int, **more: str) -> None:
    """The restart resumes at the stop's checkpoint and trains to the end: the lost completed steps are 0."""
    log = tmp_path / "resume.log"
    proc = start(cmd, log, tmp_path, **more)
    assert finish(proc, log, 900) == 0, log.read_text()[-4000:]  # kills the gang when it hangs
    text = log.read_text()
    first = min(int(s) for s in re.findall(r"rlt-shard stage=rl rank=0 step=(\d+) ", text))
    assert first == stopped_at, f"resumed at step {first}, the stop saved step {stopped_at}"
    steps = rl_steps(layout)
    assert sorted(set(steps)) == list(range(1, STEPS + 1)), steps
    assert layout.stage_done("rl").exists()


def test_sigterm_mid_rl_saves_the_step_exits_75_and_resumes_with_nothing_lost(tmp_path):
    run = rl_run(tmp_path, "stop1")
    layout = RunLayout.for_run(tmp_path / "pvc", "stop1")
    cmd = [sys.executable, "-m", "rlt.cli", "stage", "rl", "--config", str(run), "--root", str(tmp_path / "pvc")]
    log = tmp_path / "stage.log"
    proc = start(cmd, log, tmp_path)
    wait(lambda: len(rl_steps(layout)) >= 2, "two rl steps", proc, log)
    done_before = max(rl_steps(layout))
    os.kill(proc.pid, signal.SIGTERM)
    code = finish(proc, log)
    text = log.read_text()
    assert code == ExitCode.STOPPED, text[-4000:]
    saved = checkpoint_steps(layout)
    stopped_at = max(rl_steps(layout))
    assert saved == [stopped_at], (saved, stopped_at)
    assert stopped_at >= done_before  # no completed step dropped (the one in progress is abandoned)
    assert stopped_at < STEPS
    assert re.search(rf"rlt stage: stage rl stopped on SIGTERM after step {stopped_at}; checkpoint \S+ saved", text)
    assert "Traceback" not in text
    progress = json.loads(layout.progress_file.read_text())
    assert progress["lastCheckpoint"].endswith(f"checkpoint-{stopped_at}")
    print(f"\nSIGTERM after {done_before} completed steps: saved checkpoint-{stopped_at}; completed steps lost: 0")
    resume_and_check(cmd, layout, tmp_path, stopped_at)


def gang_command(run: Path, tmp_path: Path, name: str, stage: str = "rl") -> tuple[list[str], dict[str, str]]:
    """The operator's rendered command of a 2-GPU trainer pod of `stage` for `run` (its env the gang needs), on
    this machine."""
    doc = yaml.safe_load(run.read_text())
    doc["spec"]["resources"] = {"trainer": {"gpus": 2, "terminationGracePeriodSeconds": 120}}
    run.write_text(yaml.safe_dump(doc))
    spec = validate_spec(doc["spec"], name=name)
    job = builders.trainer_job(builders.RunRef(name, "default", "uid"), spec, stage, 0)
    container = job["spec"]["template"]["spec"]["containers"][0]
    pod_env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    vars_ = {"NODE_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    cmd = [expand(a, vars_) for a in container["command"]]
    cmd = [a.replace(builders.PVC_MOUNT, str(tmp_path / "pvc")) for a in cmd]
    cmd[0] = str(Path(sys.executable).parent / "rlt")
    return cmd, {k: pod_env[k] for k in ("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "RLT_RUN_YAML")}


def shard_prompts(text: str, step: int) -> dict[str, str]:
    """rank -> the prompts (short hashes) it drew for the step after `step` (the rollout's rlt-shard line)."""
    return dict(re.findall(rf"rlt-shard stage=rl rank=(\d+) step={step} prompts=(\S+)", text))


def test_sigterm_mid_accumulation_abandons_the_step_and_the_restart_redoes_it(tmp_path):
    """A long gradient accumulation (16 micro-batches per rank per step), SIGTERM to rank 1 in the middle of one:
    the gang stops at the next micro-batch, far sooner than the step would end, keeps the last completed step and
    the restart redoes the abandoned step with the same prompts; no completed step is lost."""
    steps = 3
    run = rl_run(tmp_path, "stop3", steps=steps, batchSize=32, perDeviceBatchSize=1, numGenerations=2)
    doc = yaml.safe_load(run.read_text())
    doc["spec"]["dataset"]["size"] = 64  # the steps stay in the first epoch: a resume skips exactly the done batches
    run.write_text(yaml.safe_dump(doc))
    cmd, extra = gang_command(run, tmp_path, "stop3")
    layout = RunLayout.for_run(tmp_path / "pvc", "stop3")
    log = tmp_path / "gang.log"
    proc = start(cmd, log, tmp_path, **extra)

    def mid_step() -> dict[str, str] | None:
        text = log.read_text()
        done = rl_steps(layout)
        if not done or len(re.findall(rf"rlt-micro rank=1 step={max(done) + 1}\b", text)) < 4:
            return None
        return dict(re.findall(r"rlt-world stage=rl rank=(\d+) .* pid=(\d+)", text))

    pids = wait(mid_step, "4 micro-batches into step 2 of the 2-rank gang", proc, log, 600)
    done = max(rl_steps(layout))
    record = json.loads(layout.metrics_file.read_text().splitlines()[-1])
    micro_at_signal = len(re.findall(rf"rlt-micro rank=1 step={done + 1}\b", log.read_text()))
    sent = time.monotonic()
    os.kill(int(pids["1"]), signal.SIGTERM)
    wait(lambda: "SIGTERM: step abandoned" in log.read_text(), "the gang to abandon the step", proc, log, 120)
    to_abandon = time.monotonic() - sent
    code = finish(proc, log)
    to_exit = time.monotonic() - sent
    text = log.read_text()
    assert code == ExitCode.STOPPED, text[-4000:]
    assert rl_steps(layout) == list(range(1, done + 1))  # the abandoned step left no record
    assert checkpoint_steps(layout) == [done], (checkpoint_steps(layout), done, text[-3000:])
    assert f"SIGTERM: step abandoned inside step {done + 1}; saving step {done}" in text
    assert re.search(rf"stage rl stopped on SIGTERM after step {done}; checkpoint \S+checkpoint-{done} saved", text)
    micro_after = len(re.findall(rf"rlt-micro rank=1 step={done + 1}\b", text))
    # stopped at the next micro-batch boundary (one more may have been under way), not after the step's 16
    assert micro_after <= micro_at_signal + 2, (micro_at_signal, micro_after)
    assert to_abandon < record["step_seconds"] / 2, (to_abandon, record["step_seconds"])
    abandoned = shard_prompts(text, done)
    assert set(abandoned) == {"0", "1"}, text[-3000:]
    print(
        f"\nSIGTERM to rank 1 after {micro_at_signal} of 16 micro-batches of step {done + 1} (a step took "
        f"{record['step_seconds']:.1f} s): step abandoned after {to_abandon:.1f} s ({micro_after} micro-batches), "
        f"exit 75 after {to_exit:.1f} s with checkpoint-{done}; completed steps lost: 0"
    )
    log = tmp_path / "resume.log"
    proc = start(cmd, log, tmp_path, **extra)
    assert finish(proc, log, 900) == 0, log.read_text()[-4000:]
    redone = log.read_text()
    first = min(int(s) for s in re.findall(r"rlt-shard stage=rl rank=0 step=(\d+) ", redone))
    assert first == done, f"resumed at step {first + 1}, not the abandoned step {done + 1}"
    assert shard_prompts(redone, done) == abandoned  # the abandoned step redone with the same data
    assert sorted(set(rl_steps(layout))) == list(range(1, steps + 1))
    assert layout.stage_done("rl").exists()


def test_sigterm_to_one_rank_stops_the_whole_gang_at_one_saved_step(tmp_path):
    """The operator's command for a 2-GPU trainer pod, as rendered; one rank signalled (a preempted peer pod)."""
    run = rl_run(tmp_path, "stop2")
    doc = yaml.safe_load(run.read_text())
    doc["spec"]["resources"] = {"trainer": {"gpus": 2, "terminationGracePeriodSeconds": 120}}
    run.write_text(yaml.safe_dump(doc))
    spec = validate_spec(doc["spec"], name="stop2")
    job = builders.trainer_job(builders.RunRef("stop2", "default", "uid"), spec, "rl", 0)
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert job["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 120
    pod_env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    assert pod_env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] == "120"
    assert container["command"][:3] == ["rlt", "launch", "--"]
    vars_ = {"NODE_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    cmd = [expand(a, vars_) for a in container["command"]]
    cmd = [a.replace(builders.PVC_MOUNT, str(tmp_path / "pvc")) for a in cmd]
    cmd[0] = str(Path(sys.executable).parent / "rlt")
    layout = RunLayout.for_run(tmp_path / "pvc", "stop2")
    log = tmp_path / "gang.log"
    extra = {k: pod_env[k] for k in ("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "RLT_RUN_YAML")}  # the gang's spec snapshot
    proc = start(cmd, log, tmp_path, **extra)
    pids = wait(
        lambda: (
            dict(re.findall(r"rlt-world stage=rl rank=(\d+) .* pid=(\d+)", log.read_text()))
            if len(rl_steps(layout)) >= 2
            else None
        ),
        "two rl steps of the 2-rank gang",
        proc,
        log,
        600,
    )
    done_before = max(rl_steps(layout))
    os.kill(int(pids["1"]), signal.SIGTERM)  # rank 1 only: rank 0 hears of it through the gang's all-reduce
    code = finish(proc, log)
    text = log.read_text()
    assert code == ExitCode.STOPPED, text[-4000:]
    stopped_at = max(rl_steps(layout))
    assert checkpoint_steps(layout) == [stopped_at], (checkpoint_steps(layout), stopped_at, text[-3000:])
    assert stopped_at >= done_before
    assert "rlt launch: the ranks stopped after saving" in text
    print(f"\n2-rank gang, SIGTERM to rank 1 after {done_before} steps: checkpoint-{stopped_at}; steps lost: 0")
    resume_and_check(cmd, layout, tmp_path, stopped_at, **extra)
    # A stop after the LAST step's checkpoint, before the final model: the restart trains nothing (every rank
    # leaves train() before its first step) and writes the final model from that checkpoint.
    assert STEPS in checkpoint_steps(layout), checkpoint_steps(layout)
    shutil.rmtree(layout.model_dir("rl"))
    layout.stage_done("rl").unlink()
    before = len(rl_steps(layout))
    log = tmp_path / "again.log"
    proc = start(cmd, log, tmp_path, **extra)
    assert finish(proc, log, 600) == 0, log.read_text()[-4000:]
    assert rl_steps(layout)[before:] == [], log.read_text()[-4000:]
    assert layout.stage_done("rl").exists() and any(layout.model_dir("rl").iterdir())
    assert f"checkpoint-{STEPS} already reached step {STEPS}" in log.read_text()
