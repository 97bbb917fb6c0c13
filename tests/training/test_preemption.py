"""SIGTERM mid-RL (preemption, drain, suspend) loses no completed step: the gang finishes its step, saves a
complete checkpoint of it, exits STOPPED (75), and a restart resumes from that checkpoint.

Real processes: `rlt stage rl` alone, and the operator's rendered 2-rank trainer command (`rlt launch` →
accelerate launch → torchrun → 2 DeepSpeed ranks over gloo) with SIGTERM sent to ONE rank only, as when one pod of
a gang is preempted: the other rank must agree, save the same step and stop too."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from suite_helpers import ROOT, kill_gang, tiny_doc

from rlt.checks.validation import validate_spec
from rlt.contract.exitcodes import ExitCode
from rlt.contract.layout import RunLayout
from rlt_operator import builders
from rlt_sandbox.kubelet_emulator import expand

pytestmark = pytest.mark.slow

STEPS = 12  # far more than the test lets run: the stop comes mid-stage
SAVE_STEPS = 100  # no periodic checkpoint: the only one is the one the stop writes


def rl_run(tmp_path: Path, name: str) -> Path:
    doc = tiny_doc()
    doc["metadata"]["name"] = name
    doc["spec"]["stages"]["sft"] = {"enabled": False}
    doc["spec"]["stages"]["distill"] = {"enabled": False}
    doc["spec"]["stages"]["rl"].update(
        steps=STEPS, saveSteps=SAVE_STEPS, batchSize=4, perDeviceBatchSize=2, numGenerations=2, maxCompletionLength=8
    )
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
    assert stopped_at >= done_before  # the step in progress was finished, not dropped
    assert stopped_at < STEPS
    assert re.search(rf"rlt stage: stage rl stopped on SIGTERM after step {stopped_at}; checkpoint \S+ saved", text)
    assert "Traceback" not in text
    progress = json.loads(layout.progress_file.read_text())
    assert progress["lastCheckpoint"].endswith(f"checkpoint-{stopped_at}")
    print(f"\nSIGTERM after {done_before} completed steps: saved checkpoint-{stopped_at}; completed steps lost: 0")
    resume_and_check(cmd, layout, tmp_path, stopped_at)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
