"""Experiment tracking: where a run's figures go besides Prometheus (spec.tracking).

The TRL trainers log their own figures (loss, learning rate, grad norm, ...) through transformers' `report_to`
integrations. The rlt_* figures of every stage (reward parts, phase times, distill and eval numbers) are logged by
`Tracker`, through the same libraries, under their Prometheus metric names (`rlt.contract.metrics.STEP_KEYS`): in a Trainer
stage they land in the run the integration opened, elsewhere the Tracker opens one per stage.

Only non-secret settings are set here (project, mode, file-store paths); API keys and tokens reach the pods as
environment from Secret references (spec.secret_env()).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch.utils.tensorboard import SummaryWriter
    from transformers import Trainer

    from rlt.contract.layout import RunLayout
    from rlt.spec.run import RLTRun
    from rlt.stages.context import StageContext

log = logging.getLogger(__name__)


def tracking_env(run: RLTRun, layout: RunLayout) -> dict[str, str]:
    """Environment the W&B and MLflow integrations read (transformers' callbacks and our Tracker alike)."""
    t, env = run.spec.tracking, {}
    if t.wandb is not None:
        env.update(
            {
                "WANDB_PROJECT": t.wandb.project,
                "WANDB_MODE": t.wandb.mode,
                "WANDB_DIR": str(layout.tracking_dir),
                "WANDB_RUN_GROUP": run.name,
            }
        )
        if t.wandb.entity:
            env["WANDB_ENTITY"] = t.wandb.entity
    if t.mlflow is not None:
        uri = t.mlflow.tracking_uri or layout.mlflow_dir.resolve().as_uri()
        env.update({"MLFLOW_TRACKING_URI": uri, "MLFLOW_EXPERIMENT_NAME": t.mlflow.experiment or run.name})
        if "://" not in uri or uri.startswith("file:"):
            # MLflow 3 keeps the file store for offline use behind an explicit opt-in
            env["MLFLOW_ALLOW_FILE_STORE"] = "true"
    return env


# The tracking libraries that TRL (its profiling module) and DeepSpeed (its autotuner) import whenever they are
# installed, used or not: about 4 s and 40 MiB of every training process (its imports took 16.9 s, 13.0 s without).
TRACKING_LIBRARIES = ("wandb", "mlflow")


def hide_unused_tracking_libraries(run: RLTRun) -> list[str]:
    """Make the tracking libraries `run` does not report to unimportable in this process, before TRL or DeepSpeed
    load: their availability checks then say no, as where they are not installed. For a process that runs this one
    spec (`rlt stage`, `rlt run`, `rlt compare`); a library already imported is left as it is. Returns the hidden
    names."""
    return hide_tracking_libraries(keep=run.spec.tracking.report_to())


def hide_tracking_libraries(keep: Iterable[str] = ()) -> list[str]:
    """hide_unused_tracking_libraries for a process whose runs report to the libraries in `keep` only (a benchmark's
    unit process: none)."""
    kept = set(keep)  # once: `keep` may be an iterator
    hidden = [name for name in TRACKING_LIBRARIES if name not in kept and name not in sys.modules]
    for name in hidden:
        sys.modules[name] = None  # type: ignore[assignment]  # `import` raises ImportError, find_spec says None
    return hidden


def apply_tracking_env(run: RLTRun, layout: RunLayout) -> None:
    os.environ.update(tracking_env(run, layout))
    layout.tracking_dir.mkdir(parents=True, exist_ok=True)


def report_to_args(ctx: StageContext) -> dict[str, Any]:
    """TrainingArguments for spec.tracking: report_to and the run name the integrations show."""
    backends = ctx.spec.tracking.report_to()
    if backends:
        apply_tracking_env(ctx.run, ctx.layout)
    return {"report_to": backends or "none", "run_name": ctx.run.name}


def point_tensorboard(trainer: Trainer, ctx: StageContext, stage: str) -> None:
    """Send the Trainer's TensorBoard callback to the stage's folder (it would default to output_dir/runs)."""
    from transformers.integrations import TensorBoardCallback

    for cb in trainer.callback_handler.callbacks:
        if isinstance(cb, TensorBoardCallback):
            cb.logging_dir = str(ctx.layout.tensorboard_dir(stage))


class Tracker:
    """The rlt_* figures of one stage into the backends spec.tracking enables (rank 0 only; opened lazily)."""

    def __init__(self, ctx: StageContext, stage: str):
        self.ctx, self.stage = ctx, stage
        self.backends = ctx.spec.tracking.report_to()
        self._tb: SummaryWriter | None = None
        self._own_mlflow = False
        apply_tracking_env(ctx.run, ctx.layout)

    def log(self, step: int, figures: dict[str, float]) -> None:
        if "tensorboard" in self.backends:
            if self._tb is None:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(log_dir=str(self.ctx.layout.tensorboard_dir(self.stage)))
            for name, value in figures.items():
                self._tb.add_scalar(name, value, step)
            self._tb.flush()
        if "mlflow" in self.backends:
            import mlflow

            if mlflow.active_run() is None:  # a Trainer stage's MLflowCallback has one open; other stages get theirs
                mlflow.set_tracking_uri(os.environ["MLFLOW_TRACKING_URI"])
                mlflow.set_experiment(os.environ["MLFLOW_EXPERIMENT_NAME"])
                mlflow.start_run(run_name=f"{self.ctx.run.name}-{self.stage}")
                self._own_mlflow = True
            mlflow.log_metrics(figures, step=step)
        if "wandb" in self.backends:
            import wandb

            if wandb.run is None:
                wandb.init(name=f"{self.ctx.run.name}-{self.stage}", job_type=self.stage)
            # our own x-axis: W&B's implicit step also counts the Trainer's own log calls
            wandb.define_metric("rlt_*", step_metric="rlt_stage_step")
            wandb.log({**figures, "rlt_stage_step": step})

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._own_mlflow:
            import mlflow

            mlflow.end_run()
            self._own_mlflow = False
        if "wandb" in self.backends:
            import wandb

            if wandb.run is not None:  # one W&B run per stage, the Trainer's included
                wandb.finish()
