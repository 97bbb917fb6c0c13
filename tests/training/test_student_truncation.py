"""overLong: truncate records each row as TRL's SFTTrainer then treats it. Keeping the start (TRL's default) a row whose
prompt fills maxLength keeps no completion token and TRL drops it, so it is recorded dropped; keeping the end
(trainerArgs.truncation_mode: keep_end) every row keeps its completion and trains, so none is. Checked against the
dataset the real SFTTrainer trains on."""

from __future__ import annotations

import json

import pytest
from suite_helpers import tiny_doc

SYSTEM = "You are a careful problem solver."
SHORT = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What is 2 + 2?"}]
LONG = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Count the apples. " * 40}]
ANSWER = {"role": "assistant", "content": "<think>add them</think>\n<answer>4</answer>"}


@pytest.mark.parametrize(("mode", "long_action", "trained"), [(None, "dropped", 1), ("keep_end", "truncated", 2)])
def test_truncated_rows_are_recorded_as_the_trainer_keeps_them(mode, long_action, trained, tmp_path, monkeypatch, tiny):
    from trl import SFTTrainer

    from rlt.contract.layout import RunLayout
    from rlt.spec.loading import parse_run
    from rlt.stages.context import StageContext
    from rlt.stages.student import run_student

    doc = tiny_doc()
    st = doc["spec"]["stages"]
    st.update(sft={"enabled": False}, rl={"enabled": False})
    st["student"] = {
        "enabled": True,
        "maxSteps": 1,
        "batchSize": 2,
        "perDeviceBatchSize": 2,
        "maxLength": 128,
        "overLong": "truncate",
        "gradientCheckpointing": False,
        "trainerArgs": {"truncation_mode": mode} if mode else {},
    }
    run = parse_run(doc)
    layout = RunLayout.for_run(tmp_path, run.name)
    source = layout.input_of("student", "dataset", run.spec.stages.enabled())
    source.parent.mkdir(parents=True, exist_ok=True)
    rows = [{"messages": [*SHORT, ANSWER], "source_row": 0}, {"messages": [*LONG, ANSWER], "source_row": 1}]
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))

    seen = []
    train = SFTTrainer.train

    def counted(self, *a, **kw):  # the rows the trainer really trains on, after TRL's truncation and filtering
        seen.append(len(self.train_dataset))
        return train(self, *a, **kw)

    monkeypatch.setattr(SFTTrainer, "train", counted)
    run_student(StageContext(run, layout, show_progress=False))
    report = json.loads(layout.student_dataset_report.read_text())
    assert [r["action"] for r in report["rows"]] == ["kept", long_action]
    assert seen == [trained] == [sum(r["action"] in ("kept", "truncated") for r in report["rows"])]
