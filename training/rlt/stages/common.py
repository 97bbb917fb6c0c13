"""What every stage shares: its context, the record it keeps (metrics.jsonl, progress.json, Prometheus) and a
Trainer callback that feeds that record with a progress bar."""

from __future__ import annotations

import math
import os
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlt.contract.layout import (
    CHECKPOINT_COMPLETE,
    SET_ASIDE,
    atomic_write_json,
    atomic_write_text,
    checkpoint_path,
    checkpoints,
    format_time,
    is_complete,
)
from rlt.contract.metrics import METRIC_DEFS, RUN_LABELS, STEP_KEYS, tracking_name
from rlt.contract.stage_registry import teacher_stages_before
from rlt.data.jsonl import append_jsonl
from rlt.spec.budgets import collective_timeout_seconds
from rlt.spec.run import stage_settings, zero_stage
from rlt.stages.context import StageContext, world_size
from rlt.stages.tracking import Tracker, point_tensorboard

if TYPE_CHECKING:
    pass


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
        append_jsonl(self.ctx.layout.metrics_file, row)
        m = self.ctx.metrics
        if m:
            m.set("rlt_step", step)
        tracked: dict[str, float] = {}
        for key, (metric, label) in STEP_KEYS.items():
            value = values.get(key)
            if not isinstance(value, (int, float)) or not math.isfinite(value):
                continue
            d = METRIC_DEFS[metric]
            extra = d.labels[len(RUN_LABELS) :]
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

    def done(self) -> None:
        if self.tracker is not None:
            self.tracker.close()
        if self.ctx.metrics:
            self.ctx.metrics.set("rlt_stage_completed", 1)
        if self.ctx.is_main:
            from rlt.spec import fingerprint  # the spec this stage finished under, read by re-runs

            fingerprint.record(self.ctx.layout, self.ctx.spec, self.stage)
            atomic_write_text(self.ctx.layout.stage_done(self.stage), format_time() + "\n")


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


# The figures of TRL's step logs each step record keeps (metrics.jsonl; rlt.contract.metrics.STEP_KEYS says which become
# Prometheus series). frac_reward_zero_std: the share of groups whose G rewards were equal (advantage 0: no update).
TRL_LOG_KEYS = ("loss", "reward", "reward_std", "frac_reward_zero_std", "kl", "grad_norm", "learning_rate", "entropy")


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
            announce_world(recorder.stage)
            recorder.set_total(state.max_steps)
            if recorder.ctx.is_main and show_progress:
                self.bar = tqdm(
                    total=state.max_steps,
                    initial=state.global_step,
                    desc=recorder.stage,
                    unit="step",
                    dynamic_ncols=True,
                )

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
            for key in TRL_LOG_KEYS:
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
            path = checkpoint_path(args.output_dir, state.global_step)
            mark_checkpoint_complete(path, recorder.ctx.is_main)
            recorder.checkpoint(state.global_step, str(path))

        def on_train_end(self, args, state, control, **kw):
            if self.bar is not None:
                self.bar.n = state.global_step
                self.bar.close()

    return RecordCallback()


def quiet_trainer(trainer) -> None:
    """Our callback prints progress; drop the Trainer's own log printer, and its false alarm on resuming a model
    with tied embeddings (TiedKeysFilter)."""
    import logging

    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    trainer_log = logging.getLogger("transformers.trainer")
    for old in [f for f in trainer_log.filters if isinstance(f, TiedKeysFilter)]:
        trainer_log.removeFilter(old)  # one per process: the filter of the model trained now
    trainer_log.addFilter(TiedKeysFilter(trainer.model))


class TiedKeysFilter:
    """Drops the Trainer's "missing keys in the checkpoint" warning when every missing key is a tied weight.

    A checkpoint stores a tied tensor once (lm_head.weight shares the input embeddings' storage; safetensors keeps
    one name), so resuming loads it with lm_head.weight "missing", and transformers warns unless the model lists it
    in `_keys_to_ignore_on_save` (Qwen2 and most do not). The weight is there through the tie, so the warning is
    noise; a key that is truly missing (not an alias of another parameter) still warns."""

    PREFIX = "There were missing keys in the checkpoint model loaded: "

    def __init__(self, model) -> None:
        names: dict[int, list[str]] = {}
        for name, param in model.named_parameters(remove_duplicate=False):
            names.setdefault(id(param), []).append(name)
        # every name of a parameter that has more than one (one of them is the one the checkpoint kept)
        self.tied = {n for group in names.values() if len(group) > 1 for n in group}

    def filter(self, record) -> bool:
        import ast

        message = record.getMessage()
        if not message.startswith(self.PREFIX):
            return True
        try:
            keys = ast.literal_eval(message[len(self.PREFIX) :].rstrip("."))
        except (ValueError, SyntaxError):
            return True
        return not (keys and set(keys) <= self.tied)


def trainer_precision(device: str, precision: str = "auto", processes: int = 1) -> dict[str, Any]:
    """TrainingArguments for the device (pure): auto = fp32 on CPU (TRL defaults to bf16, which the CPU path
    rejects), bf16 on a GPU.

    Several CPU processes (the gloo stand-in for GPUs and nodes): accelerate 1.15 picks no backend for DeepSpeed
    without CUDA and every rank would think it is alone, so the Trainer is told to use the process group that
    `join_process_group` made; `use_cpu` would switch accelerate to MULTI_CPU and away from DeepSpeed."""
    from rlt.data.models import is_cuda

    on_gpu = is_cuda(device)
    if precision == "auto":
        precision = "bf16" if on_gpu else "fp32"
    out: dict[str, Any] = {"bf16": precision == "bf16", "fp16": precision == "fp16"}
    if not on_gpu:
        if processes > 1:
            out.update(use_cpu=False, accelerator_config={"use_configured_state": True})
        else:
            out["use_cpu"] = True
    return out


def trainer_options(ctx: StageContext, stage: str, device: str) -> dict[str, Any]:
    """TrainingArguments every TRL-trained stage (sft, rl, student) shares, from spec.stages.<stage>: the schedule and
    TrainerOptions, the DeepSpeed config of its ZeRO stage (the value the operator's accelerate launch gets too),
    the layout, the seed, tracking. The stage's trainerArgs are added by the config builder (the spec keeps them off
    the keys set here: spec.stages.TRAINER_OWNED_ARGS)."""
    from rlt.data.models import is_cuda
    from rlt.stages.tracking import report_to_args

    st = stage_settings(ctx.spec, stage)
    processes = world_size()
    timeout = collective_timeout_seconds(ctx.spec, stage)
    if not is_cuda(device) and processes > 1:
        join_process_group(device, timeout)  # the configured state the Trainer is told to use (trainer_precision)
    return {
        "output_dir": str(ctx.layout.checkpoints_dir(stage)),
        "per_device_train_batch_size": st.per_device_batch_size,
        "learning_rate": st.learning_rate,
        "lr_scheduler_type": st.lr_scheduler,
        "warmup_steps": st.warmup_ratio,  # below 1: a share of the steps
        "weight_decay": st.weight_decay,
        "save_strategy": "steps",
        "save_steps": st.save_steps,
        "seed": ctx.spec.seed,
        "gradient_checkpointing": st.gradient_checkpointing,
        "disable_tqdm": True,
        "deepspeed": deepspeed_config(zero_stage(ctx.spec, stage)),
        "max_grad_norm": st.max_grad_norm,
        "logging_steps": st.logging_steps,
        "save_total_limit": st.save_total_limit,
        "ddp_timeout": timeout,  # a rank waits this long in a collective while rank 0 waits on the rollout
        **trainer_precision(device, st.precision, processes),
        **report_to_args(ctx),
    }


@dataclass
class TrainerRun:
    """What every TRL-trained stage (sft, rl, student; both methods) shares around its own config and rows: the
    trainer built on the start model with the stage's record, and the epilogue (train, resuming from the last
    complete checkpoint; the final model; the stage marked done)."""

    ctx: StageContext
    stage: str
    start: Any  # the ModelRef the stage trains
    tokenizer: Any
    device: str
    total_steps: int = 0  # 0: the Trainer says once it has planned the steps

    def __post_init__(self) -> None:
        from rlt.stages.preemption import StopRequest

        self.recorder = Recorder(self.ctx, self.stage, self.total_steps)
        self.stop = StopRequest()  # SIGTERM: stop at the next micro-batch, save the last step (rlt.stages.preemption)

    def trainer(self, trainer_cls, args, rows: list[dict], step_values=None, **more):
        """`trainer_cls` (a TRL trainer) on the start model (LoRA through PEFT when set) with our record callback;
        `step_values(step_seconds)` adds the stage's own numbers to each step's record."""
        from datasets import Dataset

        from rlt.data.models import load_model
        from rlt.stages.preemption import stop_callback

        return trainer_cls(
            model=load_model(self.start, self.device, trainable=True, master_fp32=master_fp32(args, self.start)),
            args=args,
            train_dataset=Dataset.from_list(rows),
            processing_class=self.tokenizer,
            callbacks=[
                end_reached_callback(),  # first: before the record callback opens a progress bar
                make_callback(self.recorder, step_values, self.ctx.show_progress),
                stop_callback(self.stop),
            ],
            peft_config=peft_config(self.start),
            **more,
        )

    def train(self, trainer) -> str:
        """Train to the end and return the final model's folder; the stage is then done. Raises `Stopped` when
        the gang stopped on SIGTERM (after saving a complete checkpoint of the last finished step)."""
        from rlt.stages.preemption import Abandoned, Stopped, save_abandoned

        quiet_trainer(trainer)
        point_tensorboard(trainer, self.ctx, self.stage)
        self.stop.install()
        resume = last_checkpoint(self.ctx.layout.checkpoints_dir(self.stage))
        try:
            trainer.train(resume_from_checkpoint=resume)
        except EndReached as end:  # the checkpoint's weights are loaded: they are the final model
            say_line(f"{self.stage}: {Path(str(resume)).name} already reached step {end.step}: it is the final model")
        except Abandoned as where:  # every rank, at the same micro-batch: save the last completed step
            say_line(f"{self.stage}: SIGTERM: step abandoned {where}; saving step {trainer.state.global_step}")
            self.recorder.last_checkpoint = save_abandoned(trainer) or self.recorder.last_checkpoint
        finally:
            if not self.stop.agreed:  # once stopping, a second SIGTERM (the launcher's) must not kill the exit
                self.stop.uninstall()
        if self.stop.agreed:
            raise Stopped(self.stage, trainer.state.global_step, self.recorder.last_checkpoint)
        out = save_final_model(trainer, self.ctx, self.stage, self.start, self.tokenizer, self.device)
        # Every rank has written its part of the final model (save_model gathers). rl keeps its checkpoints (at most
        # saveTotalLimit): `rlt run` with more stages.rl.steps continues from the last one, optimizer included.
        if self.ctx.is_main and self.stage != "rl":
            prune_finished_checkpoints(self.ctx.layout.checkpoints_dir(self.stage))
        self.recorder.done()
        return out


def master_fp32(args, ref) -> bool:
    """Whether the trainable model is loaded in fp32: whenever DeepSpeed (which keeps fp32 master weights of a bf16
    model) is off and the whole model trains. A bf16 weight cannot take an update below 2^-8 of itself, so at the
    paper's lr 1e-6 pure bf16 training changes almost nothing; with LoRA PEFT keeps the adapters fp32 and the frozen
    base stays in its dtype."""
    return not args.deepspeed and ref.lora is None


class EndReached(Exception):
    """Resumed from a checkpoint of the stage's last step (stopped or crashed before its final model was written)."""

    def __init__(self, step: int):
        self.step = step
        super().__init__(f"resumed at step {step}, the stage's last")


def end_reached_callback():
    """A transformers TrainerCallback that ends `train()` before the first step when the checkpoint it resumed from
    already reached max_steps: the Trainer checks max_steps only after a step, so it would train one step past the
    end whenever the steps do not end on an epoch boundary. Every rank resumes the same checkpoint, so every rank
    raises here, before any collective of the loop."""
    from transformers import TrainerCallback

    class StopAtTheEnd(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            if 0 < state.max_steps <= state.global_step:
                raise EndReached(state.global_step)

    return StopAtTheEnd()


def peft_config(ref):
    """PEFT LoraConfig for a model with `lora` set (handed to TRL's trainers as peft_config), else None."""
    if ref.lora is None:
        return None
    from peft import LoraConfig

    lo = ref.lora
    targets = "all-linear" if lo.target_modules == ["all-linear"] else lo.target_modules
    return LoraConfig(
        r=lo.r, lora_alpha=lo.alpha, lora_dropout=lo.dropout, target_modules=targets, task_type="CAUSAL_LM"
    )


def save_final_model(trainer, ctx: StageContext, stage: str, start, tokenizer, device: str) -> str:
    """The stage's final model in model_dir(stage). With LoRA the adapter is saved beside it (stage/adapter) and
    the model is the base with the adapter merged in: what distill, the vLLM generators and the next stage load
    as a plain model. Merging from the saved adapter works the same under ZeRO-3, where the live weights are
    sharded."""
    out = ctx.layout.model_dir(stage)
    if start.lora is None:
        trainer.save_model(str(out))
    else:
        adapter = ctx.layout.adapter_dir(stage)
        trainer.save_model(str(adapter))
        if ctx.is_main:
            from peft import PeftModel

            from rlt.data.models import load_model

            with outside_zero3(trainer):
                merged = PeftModel.from_pretrained(load_model(start, device), str(adapter)).merge_and_unload()
                merged.save_pretrained(str(out))
    if ctx.is_main:
        tokenizer.save_pretrained(str(out))
    return str(out)


@contextmanager
def outside_zero3(trainer):
    """While rank 0 alone loads the base model to merge the adapter: transformers must not see the Trainer's
    ZeRO-3 config, or `from_pretrained` builds the model inside `deepspeed.zero.Init`, whose collectives wait
    for the other ranks (already in their exit barrier) forever. The config is set again afterwards."""
    from transformers.integrations.deepspeed import set_hf_deepspeed_config, unset_hf_deepspeed_config

    live = getattr(trainer.args, "hf_deepspeed_config", None)
    unset_hf_deepspeed_config()
    try:
        yield
    finally:
        if live is not None:
            set_hf_deepspeed_config(live)


def join_process_group(device: str, timeout_s: float | None = None) -> tuple[int, int]:
    """(rank, world size) of this process; the one place a stage makes its process group. Under a launcher
    (WORLD_SIZE > 1) it joins it: gloo on CPU, NCCL on GPU (call `rank_device` first so NCCL uses this rank's GPU).
    On CPU accelerate's PartialState is made over the same group, so a Trainer with `use_configured_state` joins it
    too (accelerate alone would make none for DeepSpeed without CUDA). `timeout_s`: how long a collective waits for
    the slowest rank (rlt.spec.budgets.collective_timeout_seconds; torch's 30 minutes when None)."""
    if world_size() <= 1:
        return 0, 1
    from datetime import timedelta

    import torch.distributed as dist

    from rlt.data.models import is_cuda

    cuda = is_cuda(device)
    if not dist.is_initialized():
        dist.init_process_group(
            backend="nccl" if cuda else "gloo",
            timeout=timedelta(seconds=timeout_s) if timeout_s else None,
        )
    if not cuda:
        from accelerate import PartialState

        PartialState(backend="gloo")
    return dist.get_rank(), dist.get_world_size()


def my_share(items: list, rank: int, world: int) -> list[tuple[int, Any]]:
    """This rank's rows with their global index: every `world`-th one from `rank` (shares differ by one at most)."""
    return [(i, item) for i, item in enumerate(items) if i % world == rank]


def shard_rows(ctx: StageContext, stage: str, rows: list) -> tuple[int, int, list[tuple[int, Any]]]:
    """(rank, world size, this rank's rows with their index) for a stage whose ranks split the rows (distill,
    evaluate): joins the process group, says which world and which rows (the rlt-world and rlt-shard lines)."""
    rank, world = join_process_group(ctx.compute_device, collective_timeout_seconds(ctx.spec, stage))
    announce_world(stage)
    share = my_share(rows, rank, world)
    trace_line(f"rlt-shard stage={stage} rank={rank} rows={','.join(str(i) for i, _ in share)}")
    return rank, world, share


def gather_shares(share: list[tuple[int, Any]], rank: int, world: int, total: int) -> list[Any] | None:
    """Every rank's (index, result) pairs, on rank 0 only, in global index order; None on the other ranks.
    Refuses a duplicate or missing index: the merged output must have each row exactly once."""
    if world == 1:
        parts = [share]
    else:
        import torch.distributed as dist

        parts = [None] * world if rank == 0 else None
        dist.gather_object(share, parts, dst=0)
        if rank != 0:
            return None
    merged = sorted((pair for part in parts for pair in part), key=lambda p: p[0])
    indices = [i for i, _ in merged]
    if indices != list(range(total)):
        raise RuntimeError(
            f"the ranks returned rows {indices}: duplicates or gaps (expected each of 0..{total - 1} once)"
        )
    return [item for _, item in merged]


def leave_process_group() -> None:
    """Without it a gloo rank aborts at exit (`terminate called without an active exception`)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def announce_world(stage: str) -> None:
    """One line per process saying which process group it is in (read by people and by the multi-process tests)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        rank, world, backend = dist.get_rank(), dist.get_world_size(), dist.get_backend()
    else:  # a stage whose ranks share no process group (distill): the launcher's numbers
        rank, world, backend = int(os.environ.get("RANK", "0")), world_size(), "none"
    trace_line(
        f"rlt-world stage={stage} rank={rank} world_size={world} backend={backend} "
        f"node_rank={os.environ.get('NODE_RANK', os.environ.get('GROUP_RANK', '0'))} "
        f"local_rank={os.environ.get('LOCAL_RANK', '0')} pid={os.getpid()}"
    )


def trace_line(text: str) -> None:
    """A line for the logs of a pod or a multi-process run (which world, which rows), read by people debugging and by
    the multi-process tests; a single local `rlt run` keeps its terminal for the progress bars (RLT_TRACE=1 shows
    them there too)."""
    if os.environ.get("RLT_STAGE") or world_size() > 1 or os.environ.get("RLT_TRACE") == "1":
        say_line(text)


def say_line(text: str) -> None:
    """One line to stdout in ONE write: the ranks of a pod share its log, and with unbuffered stdout `print` writes
    the text and its newline apart, so two ranks' lines could run together."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def deepspeed_config(stage: int | None) -> dict[str, Any] | None:
    """ZeRO config for distributed runs (WORLD_SIZE > 1); None for a single process, ZeRO 0 or no ZeRO stage."""
    if world_size() <= 1 or not stage:
        return None
    return {
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "train_batch_size": "auto",
        "gradient_clipping": "auto",
        "bf16": {"enabled": "auto"},
        "zero_optimization": {
            "stage": stage,
            "overlap_comm": True,
            **({"stage3_gather_16bit_weights_on_model_save": True} if stage == 3 else {}),
        },
    }


def newest_teacher(ctx: StageContext, for_stage: str, strict: bool = True):
    """The teacher stage `for_stage` works from: the newest model of the run's earlier teacher stages
    (rlt.contract.stage_registry), as (ModelRef, stage); spec.teacher, labelled "initial", when none has produced one.

    `strict`: an enabled earlier teacher stage that has not finished is an error (it must run first); otherwise it
    is passed over."""
    spec = ctx.spec
    for stage in teacher_stages_before(for_stage):
        if not stage_settings(spec, stage).enabled:
            continue
        if ctx.layout.stage_done(stage).exists():
            path = str(ctx.layout.model_dir(stage))
            return spec.teacher.model_copy(update={"model": path, "revision": None}), stage
        if strict:
            raise RuntimeError(
                f"stage {for_stage} needs the {stage} stage's model at {ctx.layout.model_dir(stage)}; "
                f"run stage {stage} first"
            )
    return spec.teacher, "initial"


def mark_checkpoint_complete(path: str | Path, is_main: bool) -> None:
    """After every rank's save of `path` (ZeRO shards are written by all ranks), rank 0 writes the marker last."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
    if is_main:
        atomic_write_text(Path(path) / CHECKPOINT_COMPLETE, format_time() + "\n")


def last_checkpoint(directory: Path) -> str | None:
    """The newest complete checkpoint under `directory`; newer partial ones (a pod killed mid-save) are moved to
    `directory/set-aside/` with a warning, so neither a resume nor the Trainer's rotation ever reads them."""
    import logging

    for _step, path in checkpoints(directory):
        if is_complete(path):
            return str(path)
        target = directory / SET_ASIDE / f"{path.name}.{int(time.time())}.{os.getpid()}"
        logging.getLogger(__name__).warning(
            "checkpoint %s is incomplete (no %s): set aside as %s, not resumed", path, CHECKPOINT_COMPLETE, target
        )
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            path.rename(target)
        except FileNotFoundError:
            pass  # another rank set it aside first
    return None


# What a checkpoint holds only to resume training: the Trainer's optimizer, DeepSpeed's ZeRO shards (optimizer and
# fp32 master weights, several times the model) and the script DeepSpeed writes beside them.
OPTIMIZER_STATE_FILES = ("optimizer.pt", "latest", "zero_to_fp32.py")
OPTIMIZER_STATE_DIRS = "global_step*"


def prune_finished_checkpoints(directory: Path) -> list[Path]:
    """Once a stage's final model is written: every checkpoint but the last complete one is deleted, and that one
    loses its optimizer states (it keeps its weights, trainer state and marker; set-aside partial ones are kept).
    Returns what was removed. No later stage reads a checkpoint (they read <stage>/model), so this is the stage's
    disk given back to the next one."""
    import shutil

    last = last_checkpoint(directory)
    if last is None:
        return []
    removed: list[Path] = []
    for _step, path in checkpoints(directory):
        if str(path) != last:
            shutil.rmtree(path)
            removed.append(path)
    keep = Path(last)
    for name in OPTIMIZER_STATE_FILES:
        if (keep / name).exists():
            (keep / name).unlink()
            removed.append(keep / name)
    for sub in keep.glob(OPTIMIZER_STATE_DIRS):
        shutil.rmtree(sub)
        removed.append(sub)
    return removed
