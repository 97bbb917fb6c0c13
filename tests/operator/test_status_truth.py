"""Status that tells the truth (issue 45): a run none of whose pods has run is Pending with what it waits for; the
standard Ready condition; a Failed run names its stage; a finished run carries no advice that no longer applies; an
edit of a finished stage is the run's reason; STEP and REWARD survive a gang restart; hints name the namespace."""

from __future__ import annotations

import datetime as dt

from test_status import (
    IMAGE_PULL,
    NOW,
    REF,
    conds,
    crashed_trainer,
    job,
    observed,
    observed_pod,
    running,
    spec,
    sts,
)

from rlt_operator import builders as b
from rlt_operator.apply.writes import conflict
from rlt_operator.status import decide as S
from rlt_operator.status import patch as W
from rlt_operator.status.conditions import with_write_problems
from rlt_operator.status.observed import last_error_line, summarize


def ready(status):
    c = {c["type"]: c for c in status["conditions"]}["Ready"]
    return c["status"], c["reason"]


def test_a_run_whose_pods_never_ran_is_pending_with_what_it_waits_for_until_one_runs():
    sp = spec(sft=False, distill=False)
    fresh = S.decide(REF, 1, sp, None, observed(sp), NOW)
    assert fresh.status["phase"] == "Pending"
    # The Job exists, its pod cannot pull its image: still Pending (Job.status.active counts the Pending pod).
    pulling = summarize(
        "pods", {**IMAGE_PULL, "metadata": {"name": "t-rl-0-x", "labels": b.labels("t", b.ROLE_TRAINER, "rl", 0)}}
    )
    d = S.decide(REF, 1, sp, fresh.status, observed(sp, [job("rl", active=1)], pods=[pulling]), NOW)
    assert d.status["phase"] == "Pending" and d.status["reason"] == "ImagePullBackOff"
    assert ready(d.status) == ("False", "ImagePullBackOff")
    assert not [e for e in d.events if e[1] == "Running"], "no 'the run is running' while nothing runs"
    assert ("Warning", "ImagePullBackOff") in [e[:2] for e in d.events]
    # Its pod runs: Running (once), Ready.
    run = [observed_pod("t-rl-0-x", b.ROLE_TRAINER, "rl")]
    r = S.decide(REF, 1, sp, d.status, observed(sp, [job("rl", active=1)], pods=run), NOW)
    assert r.status["phase"] == "Running" and ready(r.status) == ("True", "Training")
    assert [e[1] for e in r.events] == ["Running"]
    # Running sticks while the next gang's pods start (the TRAINER column says what it waits for).
    again = S.decide(REF, 1, sp, r.status, observed(sp, [job("rl", active=1)]), NOW)
    assert again.status["phase"] == "Running"


def test_a_pending_run_says_once_what_it_waits_for():
    sp = spec(server=True, sft=False, distill=False)
    d = S.decide(REF, 1, sp, None, observed(sp, [], [sts("rl", ready=0)]), NOW)
    pending = [e for e in d.events if e[1] == "Pending"]
    assert pending == [
        ("Normal", "Pending", "no pod of the run runs yet: stage rl: waiting for generators (WaitingForGenerators)")
    ]
    same = S.decide(REF, 1, sp, d.status, observed(sp, [], [sts("rl", ready=0)]), NOW)
    assert not [e for e in same.events if e[1] == "Pending"], "said once"
    # The generators are ready (vLLM answered /health: they ran): Running.
    up = S.decide(REF, 1, sp, same.status, observed(sp, [], [sts("rl", ready=1)]), NOW)
    assert up.status["phase"] == "Running"


def test_a_refused_pod_or_a_name_conflict_keeps_the_run_pending_and_not_ready():
    sp = spec(sft=False, distill=False)
    d = S.decide(REF, 1, sp, None, observed(sp, [job("rl", active=0)]), NOW)
    quota = {"reason": "FailedCreate", "message": 'Job t-rl: pods "t-rl-0-x" is forbidden: exceeded quota: gpu'}
    st = with_write_problems(d.status, [], NOW, [quota], d.status["conditions"])
    assert st["phase"] == "Pending" and st["reason"] == "FailedCreate"
    assert ready(st) == ("False", "FailedCreate")
    clash = with_write_problems(d.status, [conflict("configmaps", "t-config", None)], NOW, [], d.status["conditions"])
    assert clash["phase"] == "Pending" and ready(clash)[0] == "False" and ready(clash)[1] == clash["reason"]


def test_ready_follows_the_run_through_suspend_restart_success_and_failure():
    sp = spec(sft=False, distill=False)
    run = [observed_pod("t-rl-0-x", b.ROLE_TRAINER, "rl")]
    training = S.decide(REF, 1, sp, running("rl"), observed(sp, [job("rl", active=1)], pods=run), NOW)
    assert ready(training.status) == ("True", "Training")
    susp = S.decide(REF, 2, spec(sft=False, distill=False, suspend=True), training.status, observed(sp), NOW)
    assert ready(susp.status) == ("False", "Suspended")
    crashed = observed(sp, [job("rl", active=1)], pods=[crashed_trainer(0)])
    restart = S.decide(REF, 1, sp, training.status, crashed, NOW)
    assert restart.status["restarts"] == 1 and ready(restart.status) == ("False", "GangRestart")
    done = S.decide(REF, 1, sp, training.status, observed(sp, [job("rl", complete=True)]), NOW)
    assert ready(done.status) == ("True", "Succeeded")
    limit = spec(sft=False, distill=False, backoffLimit=0)
    failed = S.decide(
        REF, 1, limit, training.status, observed(limit, [job("rl", active=1)], pods=[crashed_trainer(0)]), NOW
    )
    assert failed.status["phase"] == "Failed" and ready(failed.status) == ("False", "BackoffLimitExceeded")


def test_a_failed_run_names_the_stage_that_failed():
    limit = spec(sft=False, backoffLimit=0)
    failed = S.decide(
        REF, 1, limit, running("rl"), observed(limit, [job("rl", active=1)], pods=[crashed_trainer(0)]), NOW
    )
    assert (failed.status["phase"], failed.status["stage"]) == ("Failed", "rl")
    later = S.decide(REF, 1, limit, failed.status, observed(limit), NOW)
    assert later.status["stage"] == "rl", "kept on every later reconcile"
    late = NOW + dt.timedelta(hours=2)
    deadline = spec(sft=False, activeDeadlineSeconds=60)
    timed_out = S.decide(REF, 1, deadline, running("rl"), observed(deadline, [job("rl", active=1)]), late)
    assert (timed_out.status["phase"], timed_out.status["stage"]) == ("Failed", "rl")
    assert timed_out.status["reason"] == "DeadlineExceeded"


def test_a_finished_run_keeps_no_advice_for_a_gang_that_no_longer_runs():
    sp = spec(sft=False, distill=False)
    pending_edit = {
        "type": "SpecApplied",
        "status": "False",
        "reason": "PendingGangRestart",
        "message": "stage rl: ... apply from the next gang restart or stage (suspend and resume to apply now)",
    }
    prev = running("rl", conditions=[pending_edit])
    done = S.decide(REF, 1, sp, prev, observed(sp, [job("rl", complete=True)]), NOW)
    assert done.status["phase"] == "Succeeded" and "SpecApplied" not in conds(done)
    assert "suspend and resume" not in str(done.status)


def test_an_edit_of_a_finished_stage_is_the_runs_reason_while_running_and_after_success():
    sp = spec(sft=True, distill=False)
    edited = spec(sft=True, distill=False)
    edited["stages"]["sft"]["maxSteps"] = sp["stages"]["sft"]["maxSteps"] + 1
    run = [observed_pod("t-rl-0-x", b.ROLE_TRAINER, "rl")]
    jobs = [job("sft", complete=True), job("rl", active=1)]
    first = S.decide(REF, 1, sp, running("rl", completedStages=["sft"]), observed(sp, jobs, pods=run), NOW)
    assert "reason" not in first.status
    e = S.decide(REF, 2, edited, first.status, observed(edited, jobs, pods=run), NOW)
    assert e.status["reason"] == "FinishedStageEdited" and "stages.sft.maxSteps" in e.status["message"]
    assert ready(e.status) == ("True", "Training"), "a note, not a problem: the run goes on"
    back = S.decide(REF, 3, sp, e.status, observed(sp, jobs, pods=run), NOW)
    assert "reason" not in back.status, "undone: the note goes"


def test_an_edit_of_a_finished_stage_is_the_reason_of_a_succeeded_run_until_undone():
    sp = spec(sft=False, distill=False)
    edited = spec(sft=False, distill=False)
    edited["stages"]["rl"]["steps"] = sp["stages"]["rl"]["steps"] + 1
    done_jobs = [job("rl", complete=True)]
    done = S.decide(REF, 1, sp, running("rl"), observed(sp, done_jobs), NOW)
    assert (done.status["phase"], done.status["reason"]) == ("Succeeded", "Succeeded")
    e = S.decide(REF, 2, edited, done.status, observed(edited, done_jobs), NOW)
    assert (e.status["phase"], e.status["reason"]) == ("Succeeded", "FinishedStageEdited")
    assert "stages.rl.steps" in e.status["message"] and ready(e.status) == ("True", "Succeeded")
    undone = S.decide(REF, 3, sp, e.status, observed(sp, done_jobs), NOW)
    assert (undone.status["phase"], undone.status["reason"]) == ("Succeeded", "Succeeded")
    assert undone.status["message"].startswith("all stages finished")


def test_step_and_reward_keep_their_last_values_until_the_new_trainer_reports():
    sp = spec(sft=False, distill=False)
    run = [observed_pod("t-rl-0-x", b.ROLE_TRAINER, "rl")]
    read = {"stage": "rl", "step": 7, "totalSteps": 20, "rewardMean": -0.5, "lastCheckpoint": "/data/t/rl/ckpt-5"}
    d = S.decide(REF, 1, sp, running("rl"), observed(sp, [job("rl", active=1)], pods=run), NOW, read)
    assert d.status["progress"]["stepOfTotal"] == "7/20"
    # The new gang's trainer answers before it has resumed: nothing but the time.
    blank = {"stage": "rl", "updateTime": "2026-01-01T12:01:00Z"}
    after = S.decide(REF, 1, sp, d.status, observed(sp, [job("rl", active=1)], pods=run), NOW, blank)
    p = after.status["progress"]
    assert (p["stepOfTotal"], p["rewardMean"], p["lastCheckpoint"]) == ("7/20", -0.5, "/data/t/rl/ckpt-5")


def test_a_gang_restart_and_a_resume_name_the_checkpoint_they_resume_from():
    """The operator knows the trainer's last report, not the volume: a pod stopped by SIGTERM saves once more after
    the last scrape (checkpoint-9 on the volume, checkpoint-8 reported), so the Event names the report as a report."""
    sp = spec(sft=False, distill=False)
    prev = running("rl", progress={"step": 7, "lastCheckpoint": "/data/t/rl/checkpoint-5"})
    restart = S.decide(REF, 1, sp, prev, observed(sp, [job("rl", active=1)], pods=[crashed_trainer(0)]), NOW)
    message = next(e[2] for e in restart.events if e[1] == "GangRestart")
    assert (
        "restart from the newest complete checkpoint on the run's volume (the trainer last reported "
        "/data/t/rl/checkpoint-5)" in message
    )
    susp = S.decide(REF, 2, spec(sft=False, distill=False, suspend=True), prev, observed(sp), NOW)
    resumed = S.decide(REF, 3, sp, susp.status, observed(sp), NOW)
    [(kind, reason, said)] = [e for e in resumed.events if e[1] == "Resumed"]
    assert said == (
        "resuming from the newest complete checkpoint on the run's volume (the trainer last reported "
        "/data/t/rl/checkpoint-5)"
    )


def test_the_status_is_written_when_something_visible_changed_and_progress_time_on_a_slower_cadence():
    """A progress read that moves only the read time or the token rate is no status write (no `kubectl get rlt -w`
    line) until the written progress is PROGRESS_WRITE_SECONDS old; a step, a reward or a condition is at once."""
    written = running("rl", progress={"step": 3, "rewardMean": 0.1, "tokensPerSecond": 10.0, "updateTime": T(0)})

    def read(seconds, **changed):
        progress = {**written["progress"], "updateTime": T(seconds), "tokensPerSecond": 11.0, **changed}
        return {**written, "progress": progress}

    assert W.status_patch(written, read(30), NOW + dt.timedelta(seconds=30)) == {}
    assert W.status_patch(written, read(30, step=4), NOW + dt.timedelta(seconds=30))["progress"]["step"] == 4
    assert W.status_patch(written, read(30, rewardMean=0.2), NOW + dt.timedelta(seconds=30))
    late = W.status_patch(written, read(130), NOW + dt.timedelta(seconds=130))
    assert late["progress"]["updateTime"] == T(130), "the read time is still written, every 2 minutes"
    assert W.status_patch(written, {**read(30), "reason": "Unschedulable"}, NOW + dt.timedelta(seconds=30))


def T(seconds):
    return (NOW + dt.timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


def test_the_failure_line_is_the_diagnosis_not_a_trace_line():
    """A gang restart's message names the pod's exit code and the line that says why (issue 45: it was a trace line)."""
    assert last_error_line(
        "loading\nRuntimeError: CUDA error: out of memory\nrlt-world stage=rl rank=0 world_size=2"
    ) == ("RuntimeError: CUDA error: out of memory")
    tail = (
        "Traceback (most recent call last):\n  ...\ntorch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n"
        + "=" * 60
        + "\nrank      : 0 (local_rank: 0)\n"
        + "=" * 60
    )
    assert last_error_line(tail) == "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:"
    assert last_error_line("rlt-world stage=rl rank=1 world_size=2 backend=nccl") is None, "no diagnosis: none"
    assert last_error_line("step 3\nrlt stage: the dataset has no rows\nKeyboardInterrupt") == (
        "rlt stage: the dataset has no rows"
    )
    assert last_error_line("starting\nSegmentation fault (core dumped)") == "Segmentation fault (core dumped)"
    end = {"terminated": {"reason": "Error", "exitCode": 137, "message": "rlt-world stage=rl rank=0 world_size=1"}}
    killed = observed_pod("t-rl-0-x", b.ROLE_TRAINER, "rl", phase="Failed", containers=[{"name": "t", "state": end}])
    assert killed["lastError"] is None and killed["exitCode"] == 137


def test_a_failed_ranks_exception_is_the_line_not_torchruns_report_after_it(tmp_path):
    """A real torchrun whose rank raises after joining its process group: torch.distributed's excepthook starts each
    line of the rank's traceback with "[rank0]: ", and torchrun's own ChildFailedError traceback follows. The rank's
    exception says why; the launcher's only that a rank failed."""
    import os
    import subprocess
    import sys

    from suite_helpers import free_port

    script = tmp_path / "rank.py"
    script.write_text(
        "import torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "raise RuntimeError('CUDA error: out of memory')\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1", "--master-port", str(free_port())]
        + [str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    # the whole log: how much of it the 2 KiB termination message keeps depends on the paths in torchrun's report
    # (rlt launch says the rank's line last: tests/unit/test_launch_stop.py)
    log = done.stdout + done.stderr
    assert done.returncode == 1 and log.rindex("ChildFailedError") > log.rindex("[rank0]: RuntimeError"), log
    assert last_error_line(log) == "[rank0]: RuntimeError: CUDA error: out of memory", log[-3000:]
