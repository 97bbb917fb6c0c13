"""A real SFT → RL → distill run of the tiny example on CPU (TRL trainers, no mocks), then resume and skip."""

import json
import shutil
import signal
import subprocess
import sys
import urllib.request

import pytest
from suite_helpers import TINY, free_port

from rlt.checks.validation import load_valid_run
from rlt.contract.layout import RunLayout, checkpoints
from rlt.run.plots import read_metrics
from rlt.run.runner import run_local
from rlt.spec.run import RLTRun

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def finished(run_to_end):
    done = run_to_end(load_valid_run(TINY))
    return done.run, done.layout, done.summary


def test_every_stage_leaves_its_output(finished):
    run, layout, summary = finished
    for stage in ("sft", "rl", "distill"):
        assert layout.stage_done(stage).exists()
    for stage in ("sft", "rl"):
        assert (layout.model_dir(stage) / "model.safetensors").exists()
        assert (layout.model_dir(stage) / "tokenizer.json").exists()
    assert [step for step, _ in checkpoints(layout.checkpoints_dir("rl"))] == [3, 2]
    # a finished sft keeps its last checkpoint's weights, not its optimizer states (rl keeps its whole: it continues)
    ((_, sft_last),) = checkpoints(layout.checkpoints_dir("sft"))
    assert (sft_last / "model.safetensors").exists() and not (sft_last / "optimizer.pt").exists()
    assert (layout.checkpoints_dir("rl") / "checkpoint-3" / "optimizer.pt").exists()
    assert {p.name for p in layout.plots_dir.iterdir()} == {"rl_reward.png", "rl_step_time.png", "sft_loss.png"}
    assert summary["rl"]["steps"] == run.spec.stages.rl.steps
    assert json.loads(layout.summary_file.read_text())["stages"].keys() == {"sft", "rl", "distill"}


def test_rl_records_reward_components_and_phases_per_step(finished):
    run, layout, _ = finished
    rl = [r for r in read_metrics(layout.metrics_file) if r["stage"] == "rl"]
    assert [r["step"] for r in rl] == [1, 2, 3]
    for r in rl:
        # R = r_SS − λ·r_KL − penalty holds for the step means too (the reward is linear in its parts)
        assert r["reward"] == pytest.approx(r["r_ss"] - 3.0 * r["r_kl"] - r["format_penalty"], abs=1e-4)
        assert r["r_ss"] == pytest.approx(r["solution_logprob_mean"] + 0.01 * r["solution_logprob_min"], abs=1e-4)
        assert r["seconds_generate"] > 0 and r["seconds_score"] > 0 and r["seconds_update"] >= 0
        assert r["generated_tokens"] > 0 and r["scored_tokens"] > 0
    sft = [r for r in read_metrics(layout.metrics_file) if r["stage"] == "sft"]
    assert [r["step"] for r in sft] == [1, 2] and all(r["loss"] > 0 for r in sft)
    progress = json.loads(layout.progress_file.read_text())
    assert progress["stage"] == "distill" and progress["step"] == progress["totalSteps"] == 4


def test_distillation_dataset_rows(finished):
    run, layout, _ = finished
    rows = [json.loads(line) for line in layout.distill_dataset.read_text().splitlines()]
    assert len(rows) == run.spec.stages.distill.limit
    for r in rows:
        assert {"question", "reasoning_trace", "solution", "reward", "messages"} <= r.keys()
        assert len(r["candidate_rewards"]) == run.spec.stages.distill.samples_per_question
        assert r["reward"] == max(r["candidate_rewards"])  # best candidate kept
        assert r["messages"][2]["content"].startswith("<think>") and r["solution"] in r["messages"][2]["content"]


def killed_before_rls_final_model(finished, tmp_path):
    """A copy of the finished run as if killed before RL wrote its final model: no final model, no later stages.
    Returns the run, the copy's layout and how many metric records it already holds."""
    run, layout, _ = finished
    copy = RunLayout.for_run(tmp_path, run.name)
    shutil.copytree(layout.root, copy.root)
    for p in (copy.stage_done("rl"), copy.stage_done("distill"), copy.distill_dataset):
        p.unlink()
    shutil.rmtree(copy.model_dir("rl"))
    return run, copy, len(read_metrics(copy.metrics_file))


def test_rerun_skips_done_stages_and_rl_resumes_from_checkpoint(finished, tmp_path):
    run, copy, before = killed_before_rls_final_model(finished, tmp_path)
    shutil.rmtree(copy.checkpoint_dir("rl", 3))  # killed after RL's checkpoint at step 2
    first = finished[2]["stages"]
    summary = run_local(run, tmp_path, metrics_port=None, show_progress=False, device="cpu")
    # sft's seconds are the first run's; rl's add both runs (its folder came with the copy)
    sft = summary["stages"]["sft"]
    assert sft["skipped"] and sft["runs"] == 1
    assert sft["secondsAllRuns"] == pytest.approx(first["sft"]["seconds"], abs=0.3)
    rl = summary["stages"]["rl"]
    assert rl["runs"] == 2 and rl["secondsAllRuns"] == pytest.approx(first["rl"]["seconds"] + rl["seconds"], abs=0.3)
    new_rl = [r for r in read_metrics(copy.metrics_file)[before:] if r["stage"] == "rl"]
    assert [r["step"] for r in new_rl] == [3]  # resumed at step 2, trained only step 3
    assert copy.stage_done("distill").exists()


def test_a_resumed_stage_logs_and_saves_at_the_specs_cadence_not_its_checkpoints(finished, tmp_path):
    """More rl steps continue from the checkpoint; loggingSteps and saveSteps edited with them (no edit of the
    stage's output) apply to the steps trained now. transformers would keep the checkpoint's cadence (every step)."""
    run, copy, before = killed_before_rls_final_model(finished, tmp_path)
    shutil.rmtree(copy.checkpoint_dir("rl", 3))  # resumes at step 2
    doc = run.model_dump(mode="json", by_alias=True, exclude_none=True)
    rl = doc["spec"]["stages"]["rl"]
    assert rl["steps"] == 3 and rl.get("loggingSteps", 1) == 1 and rl["saveSteps"] == 2
    rl.update(steps=6, loggingSteps=2, saveSteps=3, saveTotalLimit=None)
    edited = RLTRun.model_validate(doc)
    run_local(edited, tmp_path, metrics_port=None, show_progress=False, device="cpu")
    new_rl = [r["step"] for r in read_metrics(copy.metrics_file)[before:] if r["stage"] == "rl"]
    assert new_rl == [4, 6], new_rl  # the checkpoint's cadence: 3, 4, 5, 6
    assert [step for step, _ in checkpoints(copy.checkpoints_dir("rl"))] == [6, 3, 2]  # the checkpoint's: 6, 4, 2


def test_rerun_after_the_last_checkpoint_trains_no_extra_step(finished, tmp_path):
    """Killed after RL's checkpoint of its LAST step but before the final model (a stop or crash in the final save):
    the rerun writes the final model from that checkpoint and trains nothing. The Trainer alone would train one
    step past max_steps when the steps do not end on an epoch boundary."""
    from safetensors.torch import load_file

    run, copy, before = killed_before_rls_final_model(finished, tmp_path)
    run_local(run, tmp_path, metrics_port=None, show_progress=False, device="cpu")
    new_rl = [r["step"] for r in read_metrics(copy.metrics_file)[before:] if r["stage"] == "rl"]
    assert new_rl == []
    final = load_file(copy.model_dir("rl") / "model.safetensors")
    saved = load_file(copy.checkpoint_dir("rl", 3) / "model.safetensors")
    assert final.keys() == saved.keys()
    assert all(final[k].equal(saved[k]) for k in final)
    assert copy.stage_done("rl").exists() and copy.stage_done("distill").exists()


def test_cli_run_serves_prometheus_metrics_while_lingering(tmp_path):
    """`rlt run` as a user runs it: metrics on a port, then --linger keeps them up; Ctrl-C ends the wait with the
    run's own exit code, 0 (the run is done), not the 130 of an interrupted run."""

    port = free_port()
    # Ctrl-C as a terminal sends it: a suite started in the background (`make test &`) ignores SIGINT and a child
    # inherits an ignored signal, so the wait would run its 30 s out. A handler is not inherited: the child gets
    # the default, as from a shell.
    ignored = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "rlt.cli",
                "run",
                str(TINY),
                "--output-dir",
                str(tmp_path),
                "--metrics-port",
                str(port),
                "--linger",
                "30",
                "--stage",
                "sft",
                "--no-progress",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
    finally:
        signal.signal(signal.SIGINT, ignored)
    try:
        for line in proc.stdout:
            if "serving metrics" in line:
                break
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        proc.send_signal(signal.SIGINT)
        rest = proc.stdout.read()
        code = proc.wait(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    assert code == 0 and "stopped serving metrics" in rest, rest[-2000:]
    assert 'rlt_stage_completed{method="rlt",namespace="local",run="tiny",stage="sft"} 1.0' in body
    assert 'rlt_step{method="rlt",namespace="local",run="tiny",stage="sft"} 2.0' in body
    assert "rlt_loss{" in body


def test_stage_command_as_a_pod_runs_it_once(tmp_path):
    """`rlt stage` is what the operator's pods execute: one stage, into <root>/<run>/, idempotent on re-run."""
    import os

    port = free_port()
    env = {**os.environ, "RLT_METRICS_PORT": str(port), "RLT_NAMESPACE": "research"}
    cmd = [sys.executable, "-m", "rlt.cli", "stage", "sft", "--config", str(TINY), "--root", str(tmp_path)]
    first = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr[-2000:]
    layout = RunLayout.for_run(tmp_path, "tiny")
    assert layout.stage_done("sft").exists() and (layout.model_dir("sft") / "config.json").exists()
    assert json.loads(layout.progress_file.read_text())["stage"] == "sft"
    again = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and "already done" in again.stdout
    missing = subprocess.run(
        [sys.executable, "-m", "rlt.cli", "stage", "rl", "--config", str(tmp_path / "nope.yaml")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    from rlt.contract.exitcodes import ExitCode

    assert missing.returncode == ExitCode.CONFIG_ERROR and "file not found" in missing.stderr  # fail fast, no restart


def test_distill_reward_of_kept_rows_and_of_all_candidates_are_named_apart(finished):
    run, layout, summary = finished
    rows = [json.loads(line) for line in layout.distill_dataset.read_text().splitlines()]
    kept = sum(r["reward"] for r in rows) / len(rows)
    every = [c for r in rows for c in r["candidate_rewards"]]
    assert summary["distill"]["keptRewardMean"] == pytest.approx(kept)
    assert summary["distill"]["candidateRewardMean"] == pytest.approx(sum(every) / len(every))
    assert kept >= summary["distill"]["candidateRewardMean"]  # the best of 2 is at least the average candidate
    progress = json.loads(layout.progress_file.read_text())
    assert "rewardMean" not in progress  # the old ambiguous name
    assert progress["keptRewardMean"] == pytest.approx(kept)
    assert progress["candidateRewardMean"] == pytest.approx(sum(every) / len(every))  # one batch: the same rows
    # the data were checked once, before the stages, and counted in the summary
    assert summary["data"] == {
        "source": "builtin:arithmetic",
        "rowsRead": 32,
        "rowsUsed": 32,
        "skippedRows": 0,
        "skipped": [],
        "numbersUsedAsText": 0,
    }


def test_a_random_models_summary_says_it_means_nothing(finished):
    """builtin:tiny-qwen2 is random: summary.json and the printed summary carry a caveat, so its plots and texts are
    not read as results."""
    _run, layout, summary = finished
    assert "random model" in summary["note"]
    assert json.loads(layout.summary_file.read_text())["note"] == summary["note"]
