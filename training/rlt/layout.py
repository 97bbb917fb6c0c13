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

PVC_MOUNT = "/data"
CONFIG_MOUNT = "/etc/rlt"
CONFIG_FILE = "run.yaml"
STAGE_DIRS = {"evaluate": "eval"}  # folder names that differ from the stage name


@dataclass(frozen=True)
class RunLayout:
    root: Path

    @classmethod
    def for_run(cls, base: str | Path, run_name: str) -> RunLayout:
        return cls(Path(base) / run_name)

    # stage outputs
    def stage_dir(self, stage: str) -> Path:
        return self.root / STAGE_DIRS.get(stage, stage)

    def stage_done(self, stage: str) -> Path:
        """Marker written last by a stage: its presence means the stage finished."""
        return self.stage_dir(stage) / "DONE"

    def model_dir(self, stage: str) -> Path:
        """Final model written by a training stage (sft, rl)."""
        return self.stage_dir(stage) / "model"

    def checkpoints_dir(self, stage: str) -> Path:
        return self.stage_dir(stage) / "checkpoints"

    @property
    def distill_dataset(self) -> Path:
        return self.stage_dir("distill") / "dataset.jsonl"

    @property
    def student_dataset_report(self) -> Path:
        """What the student stage did with each distillation row (kept, truncated, replaced, dropped)."""
        return self.stage_dir("student") / "rows.json"

    @property
    def eval_dir(self) -> Path:
        """Evaluation report: report.json, report.md, per_question.jsonl, accuracy.png."""
        return self.stage_dir("evaluate")

    @property
    def compare_dir(self) -> Path:
        """`rlt compare`: one sub-run per arm and the comparison report."""
        return self.root / "compare"

    def compare_arm(self, arm: str) -> RunLayout:
        """`rlt compare`: the sub-run of one arm (its stages, eval/ and eval-taught/)."""
        return RunLayout(self.compare_dir / arm)

    @property
    def taught_eval_dir(self) -> Path:
        """`rlt compare`: an arm's evaluation on the questions its teacher explained (files as in eval_dir)."""
        return self.root / "eval-taught"

    # run-wide records
    @property
    def metrics_file(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def progress_file(self) -> Path:
        """JSON written atomically by the trainer: stage, step, totalSteps, rewardMean, ... (read by the operator)."""
        return self.root / "progress.json"

    @property
    def summary_file(self) -> Path:
        return self.root / "summary.json"

    @property
    def plots_dir(self) -> Path:
        return self.root / "plots"

    @property
    def cache_dir(self) -> Path:
        return self.root / "cache"


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
