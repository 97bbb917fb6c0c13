"""What a stage keeps of itself: the step record (metrics.jsonl, progress.json, Prometheus, experiment tracking),
the Trainer callback that feeds it with a progress bar, and the lines a pod's log shows (which world, which rows)."""

from __future__ import annotations

import math
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeGuard, cast

from rlt.contract import metrics as catalogue
from rlt.contract.env import GROUP_RANK, LOCAL_RANK, NODE_RANK, RANK, STAGE, TRACE
from rlt.contract.layout import (
    atomic_write_json,
    atomic_write_text,
    checkpoint_path,
    format_time,
)
from rlt.contract.metrics import METRIC_DEFS, RUN_LABELS, STEP_KEYS, tracking_name
from rlt.data.jsonl import append_jsonl
from rlt.spec.run import stage_settings
from rlt.stages.checkpoints import mark_checkpoint_complete, rotate
from rlt.stages.context import StageContext, world_size
from rlt.stages.tracking import Tracker

if TYPE_CHECKING:
    from logging import LogRecord

    import torch
    from transformers import Trainer, TrainerCallback, TrainerControl, TrainerState, TrainingArguments


PROGRESS_EVERY_S = 5.0  # progress.json between two logs (Recorder.step_ended)


class Recorder:
    """Appends step records to metrics.jsonl, updates progress.json and the Prometheus gauges (rank 0 only)."""

    def __init__(self, ctx: StageContext, stage: str, total_steps: int):
        self.ctx, self.stage, self.total = ctx, stage, total_steps
        self.started = time.time()
        if ctx.metrics:
            ctx.metrics.stage = stage
            ctx.metrics.set(catalogue.TOTAL_STEPS, total_steps)
            ctx.metrics.set(catalogue.STAGE_COMPLETED, 0)
        self.last_checkpoint: str | None = None
        self.marked_elsewhere = False  # set by rlt.stages.staged_saves: on_save leaves the marker to it
        self.progress: dict[str, Any] = {}
        self.totals: dict[str, float] = {}  # counters, as running totals for experiment tracking
        self.eval_model: str | None = None  # label of rlt_eval_accuracy (set by evaluate stages)
        self.tracker = Tracker(ctx, stage) if ctx.spec.tracking.report_to() and ctx.is_main else None
        self.reward_key = "rewardMean"  # progress.json's name for values["reward"] (distill: candidateRewardMean)
        # progress.json between two logs at most this often: a write is an fsync (~6 ms on a busy disk, more on a
        # network volume), on the step's path; the step gauge, which the operator and the alerts read, moves every step
        self.progress_every_s = PROGRESS_EVERY_S
        self.progress_written = -math.inf  # time.monotonic() of the last write

    def set_total(self, total: int) -> None:
        self.total = total
        if self.ctx.metrics:
            self.ctx.metrics.set(catalogue.TOTAL_STEPS, total)

    def step_ended(self, step: int, values: dict[str, float]) -> None:
        """Every optimizer step, logged or not: the step gauge (status.progress.step, the clock of the RLTRunStalled
        alert) and the step-time histograms (the Step rate panel, the alert's mean step time) move with each step;
        with loggingSteps N they moved only every Nth, so a run alerted as stalled between two logs and its step rate
        read 1/N. progress.json's step follows every progress_every_s. The rest of the record waits for the log
        (record, observed_each_step)."""
        if not self.ctx.is_main:
            return
        m = self.ctx.metrics
        if m:
            m.set(catalogue.STEP, step)
            for key, value in values.items():
                metric, label = STEP_KEYS.get(key, ("", None))
                if metric and METRIC_DEFS[metric].kind == "histogram" and _finite(value):
                    self._export(metric, value, label)
        if time.monotonic() - self.progress_written >= self.progress_every_s:
            self.write_progress(step, {})

    def _export(self, metric: str, value: float, label: str | None) -> None:
        """One value to Prometheus by its kind; a metric with a label beyond the run's takes `label` as its value."""
        m = self.ctx.metrics
        if not m:
            return
        d = METRIC_DEFS[metric]
        extra = d.labels[len(RUN_LABELS) :]
        labels = cast("dict[str, str]", {extra[0]: label} if extra else {})
        if d.kind == "gauge":
            m.set(metric, value, **labels)
        elif d.kind == "histogram":
            m.observe(metric, value, **labels)
        elif value:
            m.inc(metric, value)

    def record(self, step: int, values: dict[str, float], observed_each_step: bool = False) -> None:
        """One step record. observed_each_step: step_ended already observed its histograms (the Trainer callback)."""
        if not self.ctx.is_main:
            return
        row = {"stage": self.stage, "step": step, "time": round(time.time(), 3), **values}
        append_jsonl(self.ctx.layout.metrics_file, row)
        m = self.ctx.metrics
        if m:
            m.set(catalogue.STEP, step)
        tracked: dict[str, float] = {}
        for key, (metric, step_label) in STEP_KEYS.items():
            value = values.get(key)
            if not _finite(value):
                continue
            kind = METRIC_DEFS[metric].kind
            if kind == "counter":
                self.totals[metric] = self.totals.get(metric, 0.0) + value
            label = step_label  # a metric with a label has a label value in STEP_KEYS
            if key == "accuracy":  # labelled by the evaluated model: the evaluate stage exports it itself
                label = self.eval_model
            elif not (kind == "histogram" and observed_each_step):
                self._export(metric, value, label)
            tracked[tracking_name(metric, label)] = self.totals.get(metric, value)
        if self.tracker is not None and tracked:
            self.tracker.log(step, tracked)
        self.write_progress(step, values)

    def checkpoint(self, step: int, path: str) -> None:
        self.last_checkpoint = path
        if self.ctx.metrics:
            self.ctx.metrics.set(catalogue.CHECKPOINT_STEP, step)
            self.ctx.metrics.set(catalogue.CHECKPOINT_TIME, time.time())
        self.write_progress(step, {})

    def write_progress(self, step: int, values: dict[str, float]) -> None:
        if not self.ctx.is_main:
            return
        self.progress.update(
            {
                "stage": self.stage,
                "step": step,
                "totalSteps": self.total,
                "updatedAt": format_time(),
            }
        )
        if "reward" in values:
            self.progress[self.reward_key] = values["reward"]
        if "kept_reward" in values:
            self.progress["keptRewardMean"] = values["kept_reward"]
        if "tokens_per_second" in values:
            self.progress["tokensPerSecond"] = values["tokens_per_second"]
        if self.last_checkpoint:
            self.progress["lastCheckpoint"] = self.last_checkpoint
        atomic_write_json(self.ctx.layout.progress_file, self.progress)
        self.progress_written = time.monotonic()

    def done(self) -> None:
        if self.tracker is not None:
            self.tracker.close()
        if self.ctx.metrics:
            self.ctx.metrics.set(catalogue.STAGE_COMPLETED, 1)
        if self.ctx.is_main:
            from rlt.spec import fingerprint  # the spec this stage finished under, read by re-runs

            fingerprint.record(self.ctx.layout, self.ctx.spec, self.stage)
            atomic_write_text(self.ctx.layout.stage_done(self.stage), format_time() + "\n")


def _finite(value: object) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and math.isfinite(value)


class PhaseTimer:
    """Seconds per phase of the current optimizer step. Thread-safe: rollouts ahead of the update (two with partial
    rollouts) time their phases into one timer from their own threads. A phase counts wall time: while one or more
    of its blocks are open (two rollouts generating at once count once), and a block still open when the step's
    figures are taken gives that step its seconds so far and the next step the rest, so no phase exceeds its step."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.open: dict[str, tuple[int, float]] = {}  # phase -> (blocks open, since when this step counts them)
        self.lock = threading.Lock()

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        with self.lock:
            blocks, since = self.open.get(name, (0, 0.0))
            self.open[name] = (blocks + 1, since if blocks else time.perf_counter())
        try:
            yield
        finally:
            with self.lock:
                blocks, since = self.open.pop(name)
                if blocks > 1:
                    self.open[name] = (blocks - 1, since)
                else:
                    self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - since

    def take(self) -> dict[str, float]:
        with self.lock:
            out, self.seconds, now = self.seconds, {}, time.perf_counter()
            for name, (blocks, since) in self.open.items():
                out[name] = out.get(name, 0.0) + now - since
                self.open[name] = (blocks, now)
        return out


# The figures of TRL's step logs each step record keeps (metrics.jsonl; rlt.contract.metrics.STEP_KEYS says which become
# Prometheus series). frac_reward_zero_std: the share of groups whose G rewards were equal (advantage 0: no update).
TRL_LOG_KEYS = ("loss", "reward", "reward_std", "frac_reward_zero_std", "kl", "grad_norm", "learning_rate", "entropy")
# The step figures that feed a Prometheus counter (generated_tokens, scored_tokens): summed over unlogged steps.
COUNTED_KEYS = tuple(k for k, (metric, _) in STEP_KEYS.items() if METRIC_DEFS[metric].kind == "counter")


def make_callback(
    recorder: Recorder,
    extra_values: Callable[[float], dict[str, float]] | None = None,
    show_progress: bool = True,
) -> TrainerCallback:
    """A transformers TrainerCallback: progress bar (step/total, ETA, reward or loss) and the stage record."""
    from tqdm.auto import tqdm  # type: ignore[import-untyped]  # tqdm ships no type information
    from transformers import TrainerCallback

    class RecordCallback(TrainerCallback):
        def __init__(self) -> None:
            self.bar: tqdm | None = None
            self.step_started = time.perf_counter()
            self.pending: dict[str, float] = {}
            self.lines = ProgressLines(recorder.stage)

        def on_train_begin(
            self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
        ) -> None:
            announce_world(recorder.stage)
            recorder.set_total(state.max_steps)
            self.lines.begin(state.global_step, state.max_steps)
            if recorder.ctx.is_main and show_progress:
                self.bar = tqdm(
                    total=state.max_steps,
                    initial=state.global_step,
                    desc=recorder.stage,
                    unit="step",
                    dynamic_ncols=True,
                )

        def on_step_begin(
            self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
        ) -> None:
            self.step_started = time.perf_counter()

        def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any) -> None:
            values = {"step_seconds": time.perf_counter() - self.step_started}
            if extra_values is not None:
                values.update(extra_values(values["step_seconds"]))
            # A counter's figures of the steps not logged (loggingSteps > 1) add up; the rest are the last step's.
            for key in COUNTED_KEYS:
                if key in self.pending:
                    values[key] = values.get(key, 0.0) + self.pending[key]
            self.pending = values
            recorder.step_ended(state.global_step, values)

        def on_log(
            self,
            args: TrainingArguments,
            state: TrainerState,
            control: TrainerControl,
            logs: dict[str, Any] | None = None,
            **kw: Any,
        ) -> None:
            logs = logs or {}
            values = dict(self.pending)
            for key in TRL_LOG_KEYS:
                if key in logs and isinstance(logs[key], (int, float)):
                    values.setdefault(key, float(logs[key]))
            if "train_loss" in logs:
                return
            recorder.record(state.global_step, values, observed_each_step=True)
            self.pending = {k: v for k, v in self.pending.items() if k not in COUNTED_KEYS}  # counted once
            if recorder.ctx.is_main:
                self.lines.logged(state.global_step, state.max_steps, values.get("step_seconds"))
            if self.bar is not None:
                self.bar.n = state.global_step
                shown = {k: f"{values[k]:.3f}" for k in ("reward", "loss") if k in values}
                self.bar.set_postfix(shown, refresh=True)

        def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any) -> None:
            if recorder.marked_elsewhere:  # rlt.stages.staged_saves marks it once durable
                return
            path = checkpoint_path(cast(str, args.output_dir), state.global_step)  # TrainingArguments sets a default
            mark_checkpoint_complete(path, recorder.ctx.is_main)
            recorder.checkpoint(state.global_step, str(path))
            if recorder.ctx.is_main:  # saveTotalLimit, now that the new one is complete (transformers' rotation is off)
                rotate(path.parent, stage_settings(recorder.ctx.spec, recorder.stage).save_total_limit)

        def on_train_end(
            self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
        ) -> None:
            if self.bar is not None:
                self.bar.n = state.global_step
                self.bar.close()

    return RecordCallback()


class ProgressLines:
    """The plain lines of a stage's progress, for a log or a pipe where the bar's ETA is gone: after the first step
    the time the rest should take (a newcomer wants to know whether to wait or come back later), then a line at a
    quarter, half and three quarters of the steps with the time left at this piece's pace (a pod's log otherwise
    shows nothing more until the stage ends, and a slow stage looks like a stuck one)."""

    def __init__(self, stage: str) -> None:
        self.stage = stage
        self.estimated = False  # the first-step estimate said
        self.began, self.began_step = time.perf_counter(), 0  # this piece's start (a resumed one starts late)
        self.marks: list[int] = []  # the quarter steps not yet passed

    def begin(self, step: int, total: int) -> None:
        self.began, self.began_step, self.marks = time.perf_counter(), step, quarter_steps(total)

    def logged(self, step: int, total: int, step_seconds: float | None) -> None:
        """After a logged step: the estimate once, or the line of a quarter passed since the last log."""
        passed = [m for m in self.marks if m <= step]
        self.marks = [m for m in self.marks if m > step]
        left = max(total - step, 0)
        if not self.estimated:
            if step_seconds is not None:
                self.estimated = True
                say_line(
                    f"[{self.stage}] step {step}/{total} took {step_seconds:.0f} s: "
                    f"about {_duration(step_seconds * left)} for the {left} steps left"
                )
            return
        if not passed or step >= total or step <= self.began_step:  # the stage's own line says it is done
            return
        elapsed = time.perf_counter() - self.began
        say_line(
            f"[{self.stage}] step {step}/{total} ({100 * step // total} %) after {_duration(elapsed)}: "
            f"about {_duration(elapsed / (step - self.began_step) * left)} left"
        )


def quarter_steps(total: int) -> list[int]:
    """The steps at which a stage of `total` steps is a quarter, half and three quarters done (none twice, nor the
    last step: the stage's own line says that)."""
    return sorted({math.ceil(total * k / 4) for k in (1, 2, 3)} - {0, total})


def _duration(seconds: float) -> str:
    return (
        f"{seconds:.0f} s"
        if seconds < 90
        else f"{seconds / 60:.0f} min"
        if seconds < 5400
        else f"{seconds / 3600:.1f} h"
    )


def quiet_trainer(trainer: Trainer) -> None:
    """Our callback prints progress; drop the Trainer's own log printer, and its false alarm on resuming a model
    with tied embeddings (TiedKeysFilter)."""
    import logging

    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    trainer_log = logging.getLogger("transformers.trainer")
    for old in [f for f in trainer_log.filters if isinstance(f, TiedKeysFilter)]:
        trainer_log.removeFilter(old)  # one per process: the filter of the model trained now
    trainer_log.addFilter(TiedKeysFilter(cast("torch.nn.Module", trainer.model)))  # a Trainer made with its model


class TiedKeysFilter:
    """Drops the Trainer's "missing keys in the checkpoint" warning when every missing key is a tied weight.

    A checkpoint stores a tied tensor once (lm_head.weight shares the input embeddings' storage; safetensors keeps
    one name), so resuming loads it with lm_head.weight "missing", and transformers warns unless the model lists it
    in `_keys_to_ignore_on_save` (Qwen2 and most do not). The weight is there through the tie, so the warning is
    noise; a key that is truly missing (not an alias of another parameter) still warns."""

    PREFIX = "There were missing keys in the checkpoint model loaded: "

    def __init__(self, model: torch.nn.Module) -> None:
        names: dict[int, list[str]] = {}
        for name, param in model.named_parameters(remove_duplicate=False):
            names.setdefault(id(param), []).append(name)
        # every name of a parameter that has more than one (one of them is the one the checkpoint kept)
        self.tied = {n for group in names.values() if len(group) > 1 for n in group}

    def filter(self, record: LogRecord) -> bool:
        import ast

        message = record.getMessage()
        if not message.startswith(self.PREFIX):
            return True
        try:
            keys = ast.literal_eval(message[len(self.PREFIX) :].rstrip("."))
        except (ValueError, SyntaxError):
            return True
        return not (keys and set(keys) <= self.tied)


def announce_world(stage: str) -> None:
    """One line per process saying which process group it is in (read by people and by the multi-process tests)."""
    import torch.distributed as dist

    backend: str
    if dist.is_available() and dist.is_initialized():
        rank, world, backend = dist.get_rank(), dist.get_world_size(), dist.get_backend()
    else:  # a stage whose ranks share no process group (distill): the launcher's numbers
        rank, world, backend = int(os.environ.get(RANK.name, "0")), world_size(), "none"
    trace_line(
        f"rlt-world stage={stage} rank={rank} world_size={world} backend={backend} "
        f"node_rank={os.environ.get(NODE_RANK.name, os.environ.get(GROUP_RANK.name, '0'))} "
        f"local_rank={os.environ.get(LOCAL_RANK.name, '0')} pid={os.getpid()}"
    )


def trace_line(text: str) -> None:
    """A line for the logs of a pod or a multi-process run (which world, which rows), read by people debugging and by
    the multi-process tests; a single local `rlt run` keeps its terminal for the progress bars (RLT_TRACE=1 shows
    them there too)."""
    if os.environ.get(STAGE.name) or world_size() > 1 or os.environ.get(TRACE.name) == "1":
        say_line(text)


def say_line(text: str) -> None:
    """One line to stdout in ONE write: the ranks of a pod share its log, and with unbuffered stdout `print` writes
    the text and its newline apart, so two ranks' lines could run together."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()
