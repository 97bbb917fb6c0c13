"""spec.outputs pushes through fsspec (memory:// and file://, real filesystems): what lands where, and a retry
that does not push twice (no training: a stage's files written by hand)."""

from __future__ import annotations

import json

import fsspec
from suite_helpers import tiny_doc

from rlt.contract.layout import RunLayout
from rlt.contract.outputs import push_stage_outputs
from rlt.spec.loading import parse_run
from rlt.stages.context import StageContext


def test_push_after_the_producing_stage_once(tmp_path):
    doc = tiny_doc()
    doc["spec"]["outputs"] = {
        "teacher": "memory://unit-bucket/teacher",
        "distillDataset": (tmp_path / "bucket" / "distill").as_uri(),
    }
    run = parse_run(doc)
    layout = RunLayout.for_run(tmp_path / "results", run.name)
    (layout.model_dir("rl") / "sub").mkdir(parents=True)
    (layout.model_dir("rl") / "config.json").write_text('{"a": 1}')
    (layout.model_dir("rl") / "sub" / "w.bin").write_bytes(b"\x00\x01")
    layout.distill_dataset.parent.mkdir(parents=True)
    layout.distill_dataset.write_text('{"id": "q-1", "question": "1+1"}\n')
    ctx = StageContext(run, layout, show_progress=False)

    assert push_stage_outputs(ctx, "sft") == {}  # sft is not the run's last teacher stage
    assert push_stage_outputs(ctx, "rl") == {"teacher": "memory://unit-bucket/teacher"}
    mem = fsspec.filesystem("memory")
    assert mem.cat("/unit-bucket/teacher/sub/w.bin") == b"\x00\x01"
    assert json.loads(mem.cat("/unit-bucket/teacher/config.json")) == {"a": 1}
    pushed = push_stage_outputs(ctx, "distill")
    assert pushed == {"distillDataset": (tmp_path / "bucket" / "distill").as_uri() + "/dataset.jsonl"}
    assert (tmp_path / "bucket" / "distill" / "dataset.jsonl").read_text() == layout.distill_dataset.read_text()
    assert json.loads((layout.root / "outputs.json").read_text()) == {
        "teacher": "memory://unit-bucket/teacher",
        **pushed,
    }

    mem.rm("/unit-bucket/teacher", recursive=True)
    assert push_stage_outputs(ctx, "rl") == {}  # recorded as pushed: a re-run of a finished stage does not redo it
    assert not mem.exists("/unit-bucket/teacher/config.json")
