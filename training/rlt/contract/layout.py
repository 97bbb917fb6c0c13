"""Where a run keeps its files. One layout for the local runner, the pods and the operator.

Locally the root is `results/<run>/`; in a cluster it is `/data/<run>/` on the run's PVC.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlt.contract.stage_registry import STAGE_ORDER, Role, producer_of, stage_info


class MissingStageInput(RuntimeError):
    """A stage's input (an earlier stage's model or dataset) is not in the run folder: run that stage first. One
    line, said without a traceback (`rlt run --stage`, `rlt stage`)."""


PVC_MOUNT = "/data"
CONFIG_FILE = "run.yaml"  # the key of the run's ConfigMap (the current spec, for people and tools)

# The Trainer names its saves checkpoint-<global step> (transformers' PREFIX_CHECKPOINT_DIR); rank 0 writes
# CHECKPOINT_COMPLETE into one once every rank has finished saving it: a checkpoint without it is partial.
CHECKPOINT_PREFIX = "checkpoint-"
_CHECKPOINT_NAME = re.compile(re.escape(CHECKPOINT_PREFIX) + r"(\d+)")
CHECKPOINT_COMPLETE = "RLT_COMPLETE"
# partial checkpoints are moved here (never deleted), out of the Trainer's sight
SET_ASIDE = "set-aside"

# Every timestamp a run or the operator writes: RFC 3339 in UTC, seconds (Kubernetes' metav1.Time).
TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"
MICRO_TIME_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"  # the API server's MicroTime (a Lease's renewTime)
# The same instant in a file name (outputs moved aside to <run>/replaced/<stage>-<stamp>).
STAMP_FORMAT = "%Y%m%dT%H%M%SZ"

# The distillation dataset: <stage>/<this> on the volume, <prefix>/<this> when pushed to object storage.
DISTILL_DATASET_FILE = "dataset.jsonl"
# Where a stage's product lies in its folder, by role (rlt.contract.stage_registry.Role; a report is the folder).
PRODUCT_PATHS: dict[str, tuple[str, ...]] = {
    "teacher": ("model",),
    "student": ("model",),
    "dataset": (DISTILL_DATASET_FILE,),
    "report": (),
}

# The files of a report folder (an evaluation's eval/ or eval-taught/, `rlt compare`'s compare/, rcl's eval/)
REPORT_JSON = "report.json"
COMPARE_KEY_FILE = "compare-key.json"  # what a compare arm's report was evaluated for (model, settings)
REPLACED_DIR = "replaced"  # outputs moved aside, never deleted
REPORT_MD = "report.md"
PER_QUESTION_FILE = "per_question.jsonl"  # an evaluation's graded questions
ACCURACY_PLOT = "accuracy.png"
CORRELATION_PLOT = "correlation.png"  # `rlt compare`
# rcl's evaluation of one teacher: eval/<label>/
PROBLEMS_FILE = "problems.jsonl"
TEACHER_METRICS_FILE = "metrics.json"
TEACHER_PLOT = "plot.png"


def format_time(t: dt.datetime | None = None, fmt: str = TIME_FORMAT) -> str:
    """`t` (now when None) in UTC as TIME_FORMAT (or STAMP_FORMAT)."""
    return (t or dt.datetime.now(dt.timezone.utc)).astimezone(dt.timezone.utc).strftime(fmt)


def parse_time(s: str | None) -> dt.datetime | None:
    """A TIME_FORMAT timestamp (None or empty: None), timezone-aware."""
    if not s:
        return None
    return dt.datetime.strptime(s, TIME_FORMAT).replace(tzinfo=dt.timezone.utc)


def checkpoint_path(directory: str | Path, step: int) -> Path:
    return Path(directory) / f"{CHECKPOINT_PREFIX}{step}"


def checkpoints(directory: Path) -> list[tuple[int, Path]]:
    """Every checkpoint-N folder under `directory` (complete or not), newest (highest step) first."""
    if not directory.is_dir():
        return []
    found = ((m, p) for p in directory.iterdir() if p.is_dir() and (m := _CHECKPOINT_NAME.fullmatch(p.name)))
    return sorted(((int(m.group(1)), p) for m, p in found), reverse=True)


def is_complete(checkpoint: Path) -> bool:
    """The one notion of a complete checkpoint: every rank saved it (its marker exists)."""
    return (checkpoint / CHECKPOINT_COMPLETE).exists()


def newest_complete_checkpoint(directory: Path) -> Path | None:
    return next((p for _step, p in checkpoints(directory) if is_complete(p)), None)


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

    def stage_fingerprint(self, stage: str) -> Path:
        """The spec fields a finished stage's output depends on (rlt.spec.fingerprint)."""
        return self.stage_dir(stage) / "spec-fingerprint.json"

    def stage_time_spent(self, stage: str) -> Path:
        """Seconds and runs `rlt run` spent on the stage's present output: a stopped run and the one that resumes it
        add up; starting the stage over moves the file aside with its folder."""
        return self.stage_dir(stage) / "time-spent.json"

    def stage_started_spec(self, stage: str) -> Path:
        """The same fields, written when `rlt run` last started or resumed the stage: what its checkpoints were
        trained under, before it finishes (rlt.spec.fingerprint.plan_stages)."""
        return self.stage_dir(stage) / "spec-started.json"

    def model_dir(self, stage: str) -> Path:
        """Final model written by a training stage (sft, rl, student)."""
        return self.stage_dir(stage) / "model"

    def adapter_dir(self, stage: str) -> Path:
        """A LoRA stage's adapter, saved before it is merged into model_dir."""
        return self.stage_dir(stage) / "adapter"

    def checkpoints_dir(self, stage: str) -> Path:
        return self.stage_dir(stage) / "checkpoints"

    def checkpoint_dir(self, stage: str, step: int) -> Path:
        return checkpoint_path(self.checkpoints_dir(stage), step)

    def has_complete_checkpoint(self, stage: str) -> bool:
        """Whether the stage has a checkpoint to continue from (partial ones do not count)."""
        return newest_complete_checkpoint(self.checkpoints_dir(stage)) is not None

    # the distill stage's own dataset (its product); a stage reading the run's distillation dataset asks input_of
    distill_dataset = _Path(DISTILL_DATASET_FILE, stage="distill")

    def product(self, stage: str) -> Path:
        """What `stage` produces (its row's role): its model folder, its dataset file or its report folder."""
        return self.stage_dir(stage).joinpath(*PRODUCT_PATHS[stage_info(stage).produces])

    def input_of(self, stage: str, role: Role, enabled: list[str] | tuple[str, ...]) -> Path:
        """Where `stage` reads its `role` input: the product of the last enabled stage before it producing it
        (rlt.contract.stage_registry.producer_of); with none enabled, the table's last one before it, so that the
        error of a missing file names the stage to run."""
        source = producer_of(role, enabled, before=stage) or producer_of(role, STAGE_ORDER, before=stage)
        if source is None:
            raise ValueError(f"stage {stage}: no stage before it produces a {role}")
        return self.product(source)

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
    run_file = _Path(CONFIG_FILE)  # the spec the outputs were made with (`rlt run`)
    metrics_file = _Path("metrics.jsonl")
    # what spec.outputs pushed, and where
    outputs_record = _Path("outputs.json")
    # stage folders moved aside by a re-run that starts a stage over (never deleted)
    replaced_dir = _Path(REPLACED_DIR)
    # W&B's and MLflow's local files; one TensorBoard run per stage under tensorboard/
    tracking_dir = _Path("tracking")
    mlflow_dir = _Path("tracking", "mlruns")

    def tensorboard_dir(self, stage: str) -> Path:
        """`tensorboard --logdir <run>/tracking/tensorboard` shows the stages side by side."""
        return self.tracking_dir / "tensorboard" / stage

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
        Path(tmp).replace(path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_json(path: str | Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")
