"""`rlt run`'s summary counts what a stage cost over every run that worked on its output: a run stopped by SIGTERM
in the middle of sft and the run that resumes it add up, and a later run that skips the finished stage still says
what it took. Before, the resumed run's summary said only its own seconds and a skipped stage said none at all."""

from __future__ import annotations

import json
import os
import signal

import pytest
from suite_helpers import tiny_doc


@pytest.mark.slow
def test_a_stopped_stage_and_its_resume_add_up_and_a_skip_keeps_the_sum(
    tmp_path, monkeypatch, capsys, tiny, sigterm_restored
):
    from rlt.contract.layout import RunLayout
    from rlt.run.runner import print_summary, run_local
    from rlt.spec.loading import parse_run
    from rlt.stages.preemption import Stopped
    from rlt.stages.record import Recorder

    doc = tiny_doc()
    doc["spec"]["stages"]["sft"].update(epochs=1)
    run = parse_run(doc)
    layout = RunLayout.for_run(tmp_path, run.name)
    step_ended = Recorder.step_ended
    sent: list[int] = []

    def signalled(self, step, values):  # SIGTERM as sft's first step ends: it saves that step and stops
        step_ended(self, step, values)
        if self.stage == "sft" and not sent:
            sent.append(step)
            os.kill(os.getpid(), signal.SIGTERM)

    with monkeypatch.context() as m:
        m.setattr(Recorder, "step_ended", signalled)
        with pytest.raises(Stopped):
            run_local(run, tmp_path, metrics_port=None, show_progress=False, device="cpu", only=["sft"])
    assert sent and not layout.stage_done("sft").exists()
    first = json.loads(layout.stage_time_spent("sft").read_text())
    assert first["runs"] == 1 and first["secondsAllRuns"] > 0

    resumed = run_local(run, tmp_path, metrics_port=None, show_progress=False, device="cpu", only=["sft"])
    sft = resumed["stages"]["sft"]
    assert layout.stage_done("sft").exists() and sft["runs"] == 2
    assert sft["secondsAllRuns"] == pytest.approx(first["secondsAllRuns"] + sft["seconds"], abs=0.3)

    again = run_local(run, tmp_path, metrics_port=None, show_progress=False, device="cpu", only=["sft"])
    assert again["stages"]["sft"] == {"skipped": True, "secondsAllRuns": sft["secondsAllRuns"], "runs": 2}
    capsys.readouterr()
    print_summary(layout, again)
    assert f"  sft      skipped (done before, in {sft['secondsAllRuns']} s)" in capsys.readouterr().out


def test_the_summary_line_of_a_stage():
    from rlt.run.runner import stage_time_line

    assert stage_time_line({"seconds": 12.3}) == "12.3 s"  # a folder from before rlt recorded the sum
    assert stage_time_line({"seconds": 12.3, "secondsAllRuns": 12.4, "runs": 1}) == "12.3 s"
    assert stage_time_line({"seconds": 12.3, "secondsAllRuns": 40.1, "runs": 3}) == "12.3 s (40.1 s over 3 runs)"
    assert stage_time_line({"skipped": True, "secondsAllRuns": 40.1, "runs": 3}) == "skipped (done before, in 40.1 s)"
    assert stage_time_line({"skipped": True}) == "skipped (done before)"
