"""Where a run keeps its files. One layout for the local runner, the pods and the operator.

Locally the root is `results/<run>/`; in a cluster it is `/data/<run>/` on the run's PVC.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlt.spec.stage_registry import stage_info

PVC_MOUNT = "/data"
CONFIG_FILE = "run.yaml"  # the key of the run's ConfigMap (the current spec, for people and tools)
# The trainer pods' run.yaml, as the value of this variable of the Job's pod template: every pod of a gang reads the
# spec the gang was created with, whenever it starts (`rlt stage --config env:RLT_RUN_YAML`).
CONFIG_ENV = "RLT_RUN_YAML"


class _Path:
    """A fixed path of a run's layout, named in one line: under the run's root, or under a stage's folder."""

    def __init__(self, *parts: str, stage: str | None = None):
        self.parts, self.stage = parts, stage

    def __get__(self, layout: RunLayout, owner: type | None = None) -> Path:
        base = layout.root if self.stage is None else layout.stage_dir(self.stage)
        return base.joinpath(*self.parts)


@dataclass(frozen=True)
class RunLayout:
    root: Path

    @classmethod
    def for_run(cls, base: str | Path, run_name: str) -> RunLayout:
        return cls(Path(base) / run_name)

    # stage outputs
    def stage_dir(self, stage: str) -> Path:
        return self.root / stage_info(stage).folder

    def stage_done(self, stage: str) -> Path:
        """Marker written last by a stage: its presence means the stage finished."""
        return self.stage_dir(stage) / "DONE"

    def model_dir(self, stage: str) -> Path:
        """Final model written by a training stage (sft, rl, student)."""
        return self.stage_dir(stage) / "model"

    def checkpoints_dir(self, stage: str) -> Path:
        return self.stage_dir(stage) / "checkpoints"

    distill_dataset = _Path("dataset.jsonl", stage="distill")
    # what the student stage did with each distillation row (kept, truncated, replaced, dropped)
    student_dataset_report = _Path("rows.json", stage="student")
    # evaluation report: report.json, report.md, per_question.jsonl, accuracy.png
    eval_dir = _Path(stage="evaluate")
    # `rlt compare`: one sub-run per arm and the comparison report
    compare_dir = _Path("compare")

    def compare_arm(self, arm: str) -> RunLayout:
        """`rlt compare`: the sub-run of one arm (its stages, eval/ and eval-taught/)."""
        return RunLayout(self.compare_dir / arm)

    # `rlt compare`: an arm's evaluation on the questions its teacher explained (files as in eval_dir)
    taught_eval_dir = _Path("eval-taught")

    # run-wide records
    metrics_file = _Path("metrics.jsonl")
    # JSON written atomically by the trainer: stage, step, totalSteps, rewardMean, ... (read by the operator)
    progress_file = _Path("progress.json")
    summary_file = _Path("summary.json")
    plots_dir = _Path("plots")
    cache_dir = _Path("cache")


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write via a temp file in the same folder and rename, so readers never see half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_json(path: str | Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")
