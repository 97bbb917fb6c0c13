"""A SIGTERM that reaches `rlt run` after a stage's last stop point (the training loop has ended, the handler is still
installed) lets that stage finish, then stops the run before its next stage; the same command then starts there.
Before, the stage's handler swallowed the signal and the run went on through every later stage."""

from __future__ import annotations

import os
import signal

import pytest
from suite_helpers import tiny_doc


@pytest.mark.slow
def test_a_sigterm_after_the_last_stop_point_stops_the_run_before_the_next_stage(tmp_path, monkeypatch, tiny):
    from rlt.contract.layout import RunLayout
    from rlt.run.runner import run_local
    from rlt.spec.loading import parse_run
    from rlt.stages.preemption import Stopped
    from rlt.stages.staged_saves import StagedSaves

    doc = tiny_doc()
    doc["spec"]["stages"]["sft"].update(epochs=1)
    run = parse_run(doc)
    wait = StagedSaves.wait
    sent = []

    def signalled_wait(self):  # right after trainer.train() returned: no stop point is left in the stage
        if not sent:
            sent.append(os.getpid())
            os.kill(os.getpid(), signal.SIGTERM)
        wait(self)

    monkeypatch.setattr(StagedSaves, "wait", signalled_wait)
    with pytest.raises(Stopped, match=r"SIGTERM during stage sft after its last stop point: sft finished, the run "):
        run_local(run, tmp_path, metrics_port=None, show_progress=False, device="cpu", only=["sft", "rl"])
    layout = RunLayout.for_run(tmp_path, run.name)
    assert layout.stage_done("sft").exists() and not layout.stage_dir("rl").exists()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the stage's handler is gone

    monkeypatch.setattr(StagedSaves, "wait", wait)
    summary = run_local(run, tmp_path, metrics_port=None, show_progress=False, device="cpu", only=["sft", "rl"])
    assert summary["stages"]["sft"]["skipped"] and layout.stage_done("rl").exists()
    # the stopped run's sft seconds are kept: the summary says what the stage cost, not "no time"
    assert summary["stages"]["sft"]["runs"] == 1 and summary["stages"]["sft"]["secondsAllRuns"] > 0
