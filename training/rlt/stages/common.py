"""What every stage shares: its context, the record it keeps (metrics.jsonl, progress.json, Prometheus) and a
Trainer callback that feeds that record with a progress bar."""

from __future__ import annotations

import json
import math
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlt.layout import RunLayout, atomic_write_json, atomic_write_text
from rlt.metrics import METRIC_DEFS, RUN_LABELS, STEP_KEYS, TrainerMetrics, tracking_name
from rlt.spec import RLTRun
from rlt.tracking import Tracker


@dataclass
class StageContext:
    run: RLTRun
    layout: RunLayout
    metrics: TrainerMetrics | None = None
    device: str | None = None
    show_progress: bool = True

    @property
    def spec(self):
        return self.run.spec

    @property
    def is_main(self) -> bool:
        return int(os.environ.get("RANK", "0")) == 0

    def world_size(self) -> int:
        return int(os.environ.get("WORLD_SIZE", "1"))


class Recorder:
    """Appends step records to metrics.jsonl, updates progress.json and the Prometheus gauges (rank 0 only)."""

    def __init__(self, ctx: StageContext, stage: str, total_steps: int):
        self.ctx, self.stage, self.total = ctx, stage, total_steps
        self.started = time.time()
        if ctx.metrics:
            ctx.metrics.stage = stage
            ctx.metrics.set("rlt_total_steps", total_steps)
            ctx.metrics.set("rlt_stage_completed", 0)
        self.last_checkpoint: str | None = None
        self.progress: dict[str, Any] = {}
        self.totals: dict[str, float] = {}  # counters, as running totals for experiment tracking
        self.eval_model: str | None = None  # label of rlt_eval_accuracy (set by evaluate stages)
        self.tracker = Tracker(ctx, stage) if ctx.spec.tracking.report_to() and ctx.is_main else None
        self.reward_key = "rewardMean"  # progress.json's name for values["reward"] (distill: candidateRewardMean)

    def set_total(self, total: int) -> None:
        self.total = total
        if self.ctx.metrics:
            self.ctx.metrics.set("rlt_total_steps", total)

    def record(self, step: int, values: dict[str, float]) -> None:
        if not self.ctx.is_main:
            return
        row = {"stage": self.stage, "step": step, "time": round(time.time(), 3), **values}
        path = self.ctx.layout.metrics_file
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        m = self.ctx.metrics
        if m:
            m.set("rlt_step", step)
        tracked: dict[str, float] = {}
        for key, (metric, label) in STEP_KEYS.items():
            value = values.get(key)
            if not isinstance(value, (int, float)) or not math.isfinite(value):
                continue
            d = METRIC_DEFS[metric]
            extra = d.labels[len(RUN_LABELS):]
            if d.kind == "counter":
                self.totals[metric] = self.totals.get(metric, 0.0) + value
            if key == "accuracy":  # labelled by the evaluated model: the evaluate stage exports it itself
                label = self.eval_model
            elif m and d.kind == "gauge":
                m.set(metric, value, **({extra[0]: label} if extra else {}))
            elif m and d.kind == "histogram":
                m.observe(metric, value, **({extra[0]: label} if extra else {}))
            elif m and value:
                m.inc(metric, value)
            tracked[tracking_name(metric, label)] = self.totals.get(metric, value)
        if self.tracker is not None and tracked:
            self.tracker.log(step, tracked)
        self.write_progress(step, values)

    def checkpoint(self, step: int, path: str) -> None:
        self.last_checkpoint = path
        if self.ctx.metrics:
            self.ctx.metrics.set("rlt_checkpoint_step", step)
            self.ctx.metrics.set("rlt_checkpoint_timestamp_seconds", time.time())
        self.write_progress(step, {})

    def write_progress(self, step: int, values: dict[str, float]) -> None:
        if not self.ctx.is_main:
            return
        self.progress.update({
            "stage": self.stage, "step": step, "totalSteps": self.total,
            "updatedAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        })
        if "reward" in values:
            self.progress[self.reward_key] = values["reward"]
        if "kept_reward" in values:
            self.progress["keptRewardMean"] = values["kept_reward"]
        if "tokens_per_second" in values:
            self.progress["tokensPerSecond"] = values["tokens_per_second"]
        if self.last_checkpoint:
            self.progress["lastCheckpoint"] = self.last_checkpoint
        atomic_write_json(self.ctx.layout.progress_file, self.progress)

    def done(self) -> None:
        if self.tracker is not None:
            self.tracker.close()
        if self.ctx.metrics:
            self.ctx.metrics.set("rlt_stage_completed", 1)
        if self.ctx.is_main:
            from rlt import fingerprint  # the spec this stage finished under, read by re-runs

            fingerprint.record(self.ctx.layout, self.ctx.spec, self.stage)
            atomic_write_text(self.ctx.layout.stage_done(self.stage), time.strftime("%Y-%m-%dT%H:%M:%SZ\n", time.gmtime()))


class PhaseTimer:
    """Seconds per phase of the current optimizer step."""

    def __init__(self):
        self.seconds: dict[str, float] = {}

    @contextmanager
    def phase(self, name: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0

    def take(self) -> dict[str, float]:
        out, self.seconds = self.seconds, {}
        return out


def make_callback(recorder: Recorder, extra_values=None, show_progress: bool = True):
    """A transformers TrainerCallback: progress bar (step/total, ETA, reward or loss) and the stage record."""
    from tqdm.auto import tqdm
    from transformers import TrainerCallback

    class RecordCallback(TrainerCallback):
        def __init__(self):
            self.bar = None
            self.step_started = time.perf_counter()
            self.pending: dict[str, float] = {}

        def on_train_begin(self, args, state, control, **kw):
            recorder.set_total(state.max_steps)
            if recorder.ctx.is_main and show_progress:
                self.bar = tqdm(total=state.max_steps, initial=state.global_step, desc=recorder.stage, unit="step",
                                dynamic_ncols=True)

        def on_step_begin(self, args, state, control, **kw):
            self.step_started = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            values = {"step_seconds": time.perf_counter() - self.step_started}
            if extra_values is not None:
                values.update(extra_values(values["step_seconds"]))
            self.pending = values

        def on_log(self, args, state, control, logs=None, **kw):
            logs = logs or {}
            values = dict(self.pending)
            for key in ("loss", "reward", "reward_std", "kl", "grad_norm", "learning_rate", "entropy"):
                if key in logs and isinstance(logs[key], (int, float)):
                    values.setdefault(key, float(logs[key]))
            if "train_loss" in logs:
                return
            recorder.record(state.global_step, values)
            if self.bar is not None:
                self.bar.n = state.global_step
                shown = {k: f"{values[k]:.3f}" for k in ("reward", "loss") if k in values}
                self.bar.set_postfix(shown, refresh=True)

        def on_save(self, args, state, control, **kw):
            path = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            recorder.checkpoint(state.global_step, str(path))

        def on_train_end(self, args, state, control, **kw):
            if self.bar is not None:
                self.bar.n = state.global_step
                self.bar.close()

    return RecordCallback()


def quiet_trainer(trainer) -> None:
    """Our callback prints progress; drop the Trainer's own log printer."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)


def trainer_precision(device: str, precision: str = "auto") -> dict[str, Any]:
    """TrainingArguments for the device: auto = fp32 on CPU (TRL defaults to bf16, which the CPU path rejects),
    bf16 on a GPU."""
    if precision == "auto":
        precision = "fp32" if device == "cpu" else "bf16"
    out: dict[str, Any] = {"bf16": precision == "bf16", "fp16": precision == "fp16"}
    if device == "cpu":
        out["use_cpu"] = True
    return out


def trainer_options(ctx: StageContext, st, device: str) -> dict[str, Any]:
    """TrainingArguments every TRL-trained stage shares (spec TrainerOptions): the typed options, tracking, then
    the stage's trainerArgs (which the spec keeps off the options set here)."""
    from rlt.tracking import report_to_args

    return {"max_grad_norm": st.max_grad_norm, "logging_steps": st.logging_steps,
            "save_total_limit": st.save_total_limit, **trainer_precision(device, st.precision),
            **report_to_args(ctx), **st.trainer_args}


def peft_config(ref):
    """PEFT LoraConfig for a model with `lora` set (handed to TRL's trainers as peft_config), else None."""
    if ref.lora is None:
        return None
    from peft import LoraConfig

    lo = ref.lora
    targets = "all-linear" if lo.target_modules == ["all-linear"] else lo.target_modules
    return LoraConfig(r=lo.r, lora_alpha=lo.alpha, lora_dropout=lo.dropout, target_modules=targets,
                      task_type="CAUSAL_LM")


def save_final_model(trainer, ctx: StageContext, stage: str, start, tokenizer, device: str) -> str:
    """The stage's final model in model_dir(stage). With LoRA the adapter is saved beside it (stage/adapter) and
    the model is the base with the adapter merged in: what distill, the vLLM generators and the next stage load
    as a plain model. Merging from the saved adapter works the same under ZeRO-3, where the live weights are
    sharded."""
    out = ctx.layout.model_dir(stage)
    if start.lora is None:
        trainer.save_model(str(out))
    else:
        adapter = ctx.layout.stage_dir(stage) / "adapter"
        trainer.save_model(str(adapter))
        if ctx.is_main:
            from peft import PeftModel

            from rlt.models import load_model

            merged = PeftModel.from_pretrained(load_model(start, device), str(adapter)).merge_and_unload()
            merged.save_pretrained(str(out))
    if ctx.is_main:
        tokenizer.save_pretrained(str(out))
    return str(out)


def deepspeed_config(stage: int) -> dict[str, Any] | None:
    """ZeRO config for distributed runs (WORLD_SIZE > 1); None for a single process."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or stage == 0:
        return None
    return {
        "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto", "train_batch_size": "auto",
        "gradient_clipping": "auto", "bf16": {"enabled": "auto"},
        "zero_optimization": {"stage": stage, "overlap_comm": True,
                              **({"stage3_gather_16bit_weights_on_model_save": True} if stage == 3 else {})},
    }


def newest_teacher(ctx: StageContext, stages: tuple[str, ...], needed_by: str | None = None):
    """The teacher the run has produced most recently among `stages` (newest first), as (ModelRef, stage).

    With `needed_by`, an enabled stage that has not finished is an error (that stage must run first);
    without, it is passed over. Falls back to spec.teacher, labelled "initial"."""
    spec = ctx.spec
    for stage in stages:
        if not getattr(spec.stages, stage).enabled:
            continue
        if ctx.layout.stage_done(stage).exists():
            path = str(ctx.layout.model_dir(stage))
            return spec.teacher.model_copy(update={"model": path, "revision": None}), stage
        if needed_by:
            raise RuntimeError(f"stage {needed_by} needs the {stage} stage's model at {ctx.layout.model_dir(stage)}; "
                               f"run stage {stage} first")
    return spec.teacher, "initial"


def last_checkpoint(directory: Path) -> str | None:
    from transformers.trainer_utils import get_last_checkpoint

    return get_last_checkpoint(str(directory)) if directory.is_dir() else None
