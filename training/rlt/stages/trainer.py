"""The TRL trainer every trained stage (sft, rl, student; both methods) builds: its TrainingArguments from the spec
(precision, DeepSpeed, schedule) and TrainerRun, which trains, resumes and ends the stage."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from rlt.contract.env import LOCAL_CHECKPOINTS, RANK
from rlt.contract.stage_registry import stage_info
from rlt.spec.budgets import collective_timeout_seconds
from rlt.spec.run import stage_settings, zero_stage
from rlt.stages.checkpoints import prune_finished_checkpoints, resume_checkpoint, save_final_model
from rlt.stages.context import StageContext, world_size
from rlt.stages.ranks import join_process_group
from rlt.stages.record import Recorder, make_callback, quiet_trainer, say_line
from rlt.stages.reference import load_reference
from rlt.stages.start_models import peft_config
from rlt.stages.tracking import point_tensorboard

if TYPE_CHECKING:
    from transformers import (
        PreTrainedTokenizerBase,
        Trainer,
        TrainerCallback,
        TrainerControl,
        TrainerState,
        TrainingArguments,
    )

    from rlt.spec.inputs import ModelRef
    from rlt.stages.preemption import Stopped
    from rlt.stages.staged_saves import StagedSaves

TrainerT = TypeVar("TrainerT", bound="Trainer")


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
        # transformers' "constant" drops the warmup steps: with a warmup it is its "constant_with_warmup"
        "lr_scheduler_type": "constant_with_warmup"
        if st.lr_scheduler == "constant" and st.warmup_ratio > 0
        else st.lr_scheduler,
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
        # saveTotalLimit is applied by rlt once the new checkpoint is marked complete (checkpoints.rotate): transformers
        # rotates right after writing, before the marker, and would leave no complete checkpoint to resume from
        "save_total_limit": None,
        "ddp_timeout": timeout,  # a rank waits this long in a collective while rank 0 waits on the rollout
        **trainer_precision(device, st.precision, processes),
        **report_to_args(ctx),
    }


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


@dataclass
class TrainerRun:
    """What every TRL-trained stage (sft, rl, student; both methods) shares around its own config and rows: the
    trainer built on the start model with the stage's record, and the epilogue (train, resuming from the last
    complete checkpoint; the final model; the stage marked done)."""

    ctx: StageContext
    stage: str
    start: ModelRef  # the model the stage trains
    tokenizer: PreTrainedTokenizerBase
    device: str
    total_steps: int = 0  # 0: the Trainer says once it has planned the steps

    def __post_init__(self) -> None:
        from rlt.stages.preemption import StopRequest

        self.recorder = Recorder(self.ctx, self.stage, self.total_steps)
        self.stop = StopRequest()  # SIGTERM: stop at the next micro-batch, save the last step (rlt.stages.preemption)

    def trainer(
        self,
        trainer_cls: Callable[..., TrainerT],
        args: TrainingArguments,
        rows: list[dict[str, Any]],
        step_values: Callable[[float], dict[str, float]] | None = None,
        **more: Any,
    ) -> TrainerT:
        """`trainer_cls` (a TRL trainer) on the start model (LoRA through PEFT when set) with our record callback;
        `step_values(step_seconds)` adds the stage's own numbers to each step's record."""
        from datasets import Dataset

        from rlt.data.models import load_model
        from rlt.stages.checkpoint_layers import checkpoint_layers_callback
        from rlt.stages.preemption import stop_callback

        return trainer_cls(
            model=load_model(self.start, self.device, trainable=True, master_fp32=master_fp32(args, self.start)),
            args=args,
            train_dataset=Dataset.from_list(rows),
            processing_class=self.tokenizer,
            callbacks=[
                end_reached_callback(),  # first: before the record callback opens a progress bar
                spec_cadence_callback(),
                make_callback(self.recorder, step_values, self.ctx.show_progress),
                stop_callback(self.stop),
                # after Trainer.train turns gradient checkpointing on: the layers that keep their activations
                checkpoint_layers_callback(self.ctx.spec, self.stage, self.device, self.ctx.is_main),
            ],
            peft_config=peft_config(self.start),
            **more,
        )

    def train(self, trainer: Trainer) -> str:
        """Train to the end and return the final model's folder; the stage is then done. Raises `Stopped` when
        the gang stopped on SIGTERM (after saving a complete checkpoint of the last finished step)."""
        from rlt.stages.preemption import Abandoned, Stopped, save_abandoned

        quiet_trainer(trainer)
        point_tensorboard(trainer, self.ctx, self.stage)
        staged = self.staged_saves(trainer)  # after every other wrapper of the save: it must see the whole save
        self.stop.install()
        resume = resume_checkpoint(self.ctx.layout.checkpoints_dir(self.stage))
        if resume is not None:
            load_reference(trainer, resume)  # GRPO's synced reference (rlt.stages.reference); others have none
        try:
            trainer.train(resume_from_checkpoint=resume)
            staged.wait()
        except EndReached as end:  # the checkpoint's weights are loaded: they are the final model
            say_line(f"{self.stage}: {Path(str(resume)).name} already reached step {end.step}: it is the final model")
        except Abandoned as where:  # every rank, at the same boundary: save the last completed step
            say_line(f"{self.stage}: SIGTERM: step abandoned {where}; saving step {trainer.state.global_step}")
            saved = save_abandoned(trainer, self.stop.step_rng)
            staged.wait()
            self.recorder.last_checkpoint = saved or self.recorder.last_checkpoint
        except Exception as error:
            if self.stop.asked_at is None and not self.stop.agreed:
                raise  # no stop was asked: a failure
            raise self.stopped_by_error(trainer, error, resume, staged) from error
        finally:
            if not self.stop.agreed:  # once stopping, a second SIGTERM (the launcher's) must not kill the exit
                self.stop.uninstall()
        if self.stop.agreed:
            raise Stopped(self.stage, trainer.state.global_step, self.recorder.last_checkpoint)
        if trainer.state.global_step == 0 and resume is None:  # transformers only warns; the start model is no result
            raise RuntimeError(
                f"{self.stage}: trained no step: its data loader gave no full batch (fewer usable rows than "
                f"spec.stages.{self.stage}.batchSize asks of a step)"
            )
        out = save_final_model(trainer, self.ctx, self.stage, self.start, self.tokenizer, self.device)
        # Every rank has written its part of the final model (save_model gathers): the stage is done. Marked done
        # before its checkpoints are pruned: a kill mid-prune must not leave an unfinished stage whose last
        # checkpoint has lost its optimizer states (a DeepSpeed resume refuses it, on every restart). An extendable
        # stage (rl) keeps its checkpoints (at most saveTotalLimit): `rlt run` with more stages.rl.steps continues
        # from the last one, optimizer included.
        self.recorder.done()
        if self.ctx.is_main and stage_info(self.stage).extendable is None:
            prune_finished_checkpoints(self.ctx.layout.checkpoints_dir(self.stage))
        return out

    def staged_saves(self, trainer: Trainer) -> StagedSaves:
        """Saves to RLT_LOCAL_CHECKPOINTS first, made durable in the background (rlt.stages.staged_saves), when it is
        set; else a StagedSaves that was never installed (its wait() returns at once)."""
        from rlt.stages.staged_saves import StagedSaves

        def durable(step: int, path: str) -> None:
            self.recorder.checkpoint(step, path)

        local = os.environ.get(LOCAL_CHECKPOINTS.name)
        keep = stage_settings(self.ctx.spec, self.stage).save_total_limit
        rank = int(os.environ.get(RANK.name, "0"))
        staged = StagedSaves(trainer, Path(local or "."), rank, world_size(), durable, keep=keep)
        if local:
            staged.install()
            self.recorder.marked_elsewhere = True
        return staged

    def stopped_by_error(self, trainer: Trainer, error: Exception, resume: str | None, staged: StagedSaves) -> Stopped:
        """An exception escaped training after SIGTERM (a drained generator aborting the rollout, a peer gone): a
        disruption, not a failure. A single process saves the last completed step unless the optimizer step was
        under way (the weights may be half-updated); a rank of a gang cannot (its peers may wait in a collective it
        left) and names the last complete checkpoint."""
        from rlt.stages.preemption import Stopped, save_abandoned

        self.stop.agreed = True
        step, saved = trainer.state.global_step, None
        if world_size() <= 1 and not self.stop.updating:
            say_line(f"{self.stage}: SIGTERM, then {type(error).__name__}: {error}; saving step {step}")
            try:
                written = save_abandoned(trainer, self.stop.step_rng)
                staged.wait()  # the durable copy: until it is fsynced and marked, the checkpoint is not the stop's
                saved = written
            except Exception as failed:  # noqa: BLE001 - the stop is still a stop; the older checkpoint stands
                say_line(f"{self.stage}: could not save step {step}: {type(failed).__name__}: {failed}")
        else:
            say_line(f"{self.stage}: SIGTERM, then {type(error).__name__}: {error}; not saving (gang or mid-update)")
        last = saved or self.recorder.last_checkpoint or resume  # each complete (saved, marked, resumed from)
        done = int(last.rsplit("-", 1)[1]) if last else 0
        return Stopped(self.stage, done, last, gang_agreed=world_size() <= 1)


def master_fp32(args: TrainingArguments, ref: ModelRef) -> bool:
    """Whether the trainable model is loaded in fp32: whenever DeepSpeed (which keeps fp32 master weights of a bf16
    model) is off and the whole model trains. A bf16 weight cannot take an update below 2^-8 of itself, so at the
    paper's lr 1e-6 pure bf16 training changes almost nothing; with LoRA PEFT keeps the adapters fp32 and the frozen
    base stays in its dtype."""
    return not args.deepspeed and ref.lora is None


class EndReached(Exception):
    """Resumed from a checkpoint of the stage's last step (stopped or crashed before its final model was written)."""

    def __init__(self, step: int) -> None:
        self.step = step
        super().__init__(f"resumed at step {step}, the stage's last")


def spec_cadence_callback() -> TrainerCallback:
    """A transformers TrainerCallback that gives a resumed stage the spec's loggingSteps and saveSteps: transformers
    takes them from the checkpoint's trainer_state.json (with a warning), so an edit since, which is no edit of the
    stage's output (rlt.spec.fingerprint), would silently not apply to the rest of the stage."""
    from transformers import TrainerCallback

    class SpecCadence(TrainerCallback):
        def on_train_begin(
            self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
        ) -> None:
            # what a fresh start sets: logging, eval and save steps (transformers leaves compute_steps untyped)
            state.compute_steps(args, state.max_steps)  # type: ignore[no-untyped-call]

    return SpecCadence()


def end_reached_callback() -> TrainerCallback:
    """A transformers TrainerCallback that ends `train()` before the first step when the checkpoint it resumed from
    already reached max_steps: the Trainer checks max_steps only after a step, so it would train one step past the
    end whenever the steps do not end on an epoch boundary. Every rank resumes the same checkpoint, so every rank
    raises here, before any collective of the loop."""
    from transformers import TrainerCallback

    class StopAtTheEnd(TrainerCallback):
        def on_train_begin(
            self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
        ) -> None:
            if 0 < state.max_steps <= state.global_step:
                raise EndReached(state.global_step)

    return StopAtTheEnd()
