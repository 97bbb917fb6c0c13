"""The plan terms every Trainer stage shares (sft, rl, student subclass or use TrainerTerms): the GPU memory of one
trainer process (model states, DeepSpeed's buckets, activations and TRL's loss tiles), the checkpoints on the
volume, one optimizer step and one save."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from rlt.checks.checkpoint_layers import (
    LayerChoice,
    LayerSchedule,
    choose,
    choose_selective,
    recompute_share,
    schedule,
    spread_checkpointed_share,
    update_room,
)
from rlt.checks.gpu_figures import figures
from rlt.checks.model_shape import (
    ModelShape,
    Shapes,
    checkpoint_bytes,
    dtype_bytes,
    pod_checkpoint_bytes,
    saved_model_bytes,
    trainable_params,
)
from rlt.checks.plan_terms import (
    CUDA_OVERHEAD,
    DS_MAX_LIVE_PARAMETERS,
    DS_REDUCE_BUCKET,
    Check,
    Plan,
    PlanInputs,
    PromptTokens,
    StagePlan,
    StepTime,
    activations,
    lm_head_loss_bytes,
    model_states,
    selective_recompute_bytes_per_token,
)
from rlt.checks.step_time import UTILISATION, local_write_rate, step_time
from rlt.spec.inputs import ModelRef
from rlt.spec.run import RLTRunSpec, stage_settings

Terms = list[tuple[str, int]]
# The share of the memory bandwidth a selective layer's recomputed ops (elementwise: norms, rotary, SiLU, adds)
# reach on large tensors; a stated estimate, not measured on a GPU (the plan's decode calibration implies 58 %).
SELECTIVE_BANDWIDTH_SHARE = 0.7


def world_of(spec: RLTRunSpec) -> int:
    """Trainer processes: nodes × GPUs (one process on a CPU pod)."""
    return spec.resources.trainer.nodes * max(1, spec.resources.trainer.gpus)


@dataclass(frozen=True)
class TrainerTerms:
    """A Trainer stage training spec.teacher on rows of maxLength tokens; subclasses change what differs."""

    name: str

    def settings(self, spec: RLTRunSpec) -> Any:
        return stage_settings(spec, self.name)

    def model(self, spec: RLTRunSpec, shapes: Shapes) -> tuple[ModelRef, ModelShape | None]:
        """The model the stage trains, and its shape."""
        return spec.teacher, shapes.teacher

    def lengths(self, spec: RLTRunSpec) -> tuple[int, int]:
        """(tokens of a row, tokens the loss scores on a GPU)."""
        length: int = self.settings(spec).max_length
        return length, length

    def gpu_fix(self, spec: RLTRunSpec) -> str:
        return (
            f"resources.trainer.gpus/nodes, stages.{self.name}.maxLength, stages.{self.name}.deepspeedZeroStage "
            "or a GPU with more memory (--gpu-memory)"
        )

    def extra_memory(
        self, spec: RLTRunSpec, shape: ModelShape, ref: ModelRef, shapes: Shapes, at: PlanInputs, plan: Plan,
        terms: Terms, phases: Terms,
    ) -> int:  # fmt: skip
        """The stage's own GPU terms and phases beyond a trainer's (added to `terms`, `phases`); its host bytes."""
        return 0

    def steps(self, spec: RLTRunSpec, rows: int | None) -> int | None:
        st = self.settings(spec)
        if st.max_steps:
            return int(st.max_steps)
        if rows is None:
            return None
        steps: int = math.ceil(math.ceil(rows / st.batch_size) * st.epochs)
        return steps

    def kept_checkpoint(self, spec: RLTRunSpec, held: int, one: int, last_weights: int) -> int:
        """Bytes of the checkpoints left after the stage: the last one without its optimizer states."""
        return last_weights if held else 0

    # ----------------------------------------------------------------------- StageTerms

    def plan(self, spec: RLTRunSpec, shapes: Shapes, at: PlanInputs, plan: Plan) -> StagePlan | None:
        ref, shape = self.model(spec, shapes)
        if shape is None:
            plan.notes.append(f"{self.name}: model shape unknown, its memory and disk are not planned")
            return None
        planned = self._layers(spec, shapes, at.gpu, at.gpu_memory)
        choice, per_micro = planned if planned is not None else (None, None)
        kept, selective = (choice.kept, choice.selective) if choice is not None else (0, 0)
        host, terms, phases, trainable = self.memory(spec, shape, ref, at.gpu, kept, selective)
        host += self.extra_memory(spec, shape, ref, shapes, at, plan, terms, phases)
        if choice is not None:
            plan.checkpointing.append(choice.line())
            if per_micro is not None and per_micro.steps:
                plan.checkpointing.append(per_micro.line(self.name, self.longest_micro_tokens(spec)))
            elif at.gpu and choice.kept < choice.layers and self.settings(spec).deepspeed_zero_stage == 3:
                plan.checkpointing.append(
                    f"{self.name}: one count for every micro-batch under ZeRO-3 (a count that follows each "
                    "micro-batch's tokens would change the module order DeepSpeed prefetches parameters along, "
                    "turning its prefetch off; with deepspeedZeroStage 0-2 shorter micro-batches keep more layers), "
                    + (
                        "with selective layers where they recompute less"
                        if not ref.lora
                        else "no selective layers: TRL turns PEFT under ZeRO-3 to reentrant checkpointing, which "
                        "cannot keep chosen outputs"
                    )
                )
            plan.problems += [(self.name, choice.problem)] if choice.problem else []
        limit = at.gpu_memory if at.gpu else None
        plan.checks.append(
            Check(self.name, "GPU memory per trainer process", terms, limit, self.gpu_fix(spec), phases=phases)
        )
        b = dtype_bytes(ref, at.gpu)
        return StagePlan(host, self.disk(spec, shape, trainable, b, at.rows, plan))

    def checkpoint_extra(self, spec: RLTRunSpec, shape: ModelShape, trainable: int, b: int) -> int:
        """Bytes a checkpoint of this stage holds beside the Trainer's (rank 0 writes them)."""
        return 0

    def step_time(
        self, spec: RLTRunSpec, shapes: Shapes, gpu: bool, prompts: PromptTokens | None, gpu_memory: int | None
    ) -> StepTime | None:
        ref, shape = self.model(spec, shapes)
        if shape is None:
            return None
        trainable = trainable_params(shape, ref)
        zero = self.settings(spec).deepspeed_zero_stage
        b, nodes = dtype_bytes(ref, gpu), spec.resources.trainer.nodes
        extra = self.checkpoint_extra(spec, shape, trainable, b)  # rank 0's: on the first pod
        one = checkpoint_bytes(shape, trainable, zero, world_of(spec), b) + extra
        pod = pod_checkpoint_bytes(shape, trainable, zero, world_of(spec), nodes, b) + extra
        t = self.step_phases(spec, shape, shapes, trainable, one, prompts, gpu_memory)
        # step_time charges a whole forward's recompute; only the checkpointed layers recompute, and a micro-batch
        # shorter than the longest keeps more layers (layer_schedule) over the rows' stated spread. The longest
        # micro-batch keeps the whole recompute: the grace period errs long (the operator sizes it without TRL)
        planned = self._layers(spec, shapes, gpu, gpu_memory)
        if planned is not None:
            choice, plan = planned
            share = recompute_share(shape.params, shape.layer_params, choice)
            if plan is not None and shape.layers:
                length = self.lengths(spec)[0]
                mean, longest = t.row_tokens
                low, high = max(0.0, 2 * mean - longest) / length, min(1.0, longest / length)
                share *= spread_checkpointed_share(plan, low, high) * choice.layers / max(1, choice.checkpointed)
            t = replace(t, recompute=t.recompute * share)
        # each pod writes its own share to its local volume at once: the first pod's is the longest
        return replace(t, local_bytes=pod, save_local=pod / local_write_rate(spec)[0])

    def layer_choice(self, spec: RLTRunSpec, shapes: Shapes, gpu: bool, gpu_memory: int | None) -> LayerChoice | None:
        """How many decoder layers keep their activations (rlt.checks.checkpoint_layers.choose): with
        uncheckpointedLayers unset, the most whose update fits a GPU of `gpu_memory` (the spec's when None) beside
        the terms held through the step; None when the model's shape is unknown."""
        planned = self._layers(spec, shapes, gpu, gpu_memory, per_micro=False)
        return None if planned is None else planned[0]

    def layer_schedule(
        self, spec: RLTRunSpec, shapes: Shapes, gpu: bool, gpu_memory: int | None
    ) -> LayerSchedule | None:
        """The layers kept per micro-batch (rlt.checks.checkpoint_layers.schedule): where the plan chooses
        (uncheckpointedLayers unset, on a GPU) and the stage runs ZeRO 0-2, a micro-batch shorter than the longest
        keeps the most layers whose update fits the same room; None where the count is fixed (set, checkpointing
        off, CPU, ZeRO-3, shape unknown)."""
        planned = self._layers(spec, shapes, gpu, gpu_memory)
        return None if planned is None else planned[1]

    def longest_micro_tokens(self, spec: RLTRunSpec) -> int:
        """Tokens of the longest micro-batch the stage allows (perDeviceBatchSize rows of its longest): a
        LayerSchedule's shares are of it."""
        return int(self.settings(spec).per_device_batch_size * self.lengths(spec)[0])

    def _layers(
        self, spec: RLTRunSpec, shapes: Shapes, gpu: bool, gpu_memory: int | None, per_micro: bool = True
    ) -> tuple[LayerChoice, LayerSchedule | None] | None:
        """(layer_choice, layer_schedule; the schedule's search left out without `per_micro`)."""
        from rlt.checks.gpu_memory import spec_gpu_memory
        from rlt.checks.plan_terms import Plan

        ref, shape = self.model(spec, shapes)
        if shape is None:
            return None
        st = self.settings(spec)
        asked = st.uncheckpointed_layers
        if not st.gradient_checkpointing or asked is not None or not gpu:
            return choose(self.name, shape.layers, st.gradient_checkpointing, asked, None, 0, lambda k: 0), None
        memory = gpu_memory if gpu_memory is not None else spec_gpu_memory(spec)[0]
        _, terms, phases, _ = self.memory(spec, shape, ref, gpu, 0)
        at = PlanInputs(memory, gpu, None, None)
        self.extra_memory(spec, shape, ref, shapes, at, Plan(memory), terms, phases)  # the stage's frozen models
        held = sum(size for _, size in terms)
        choice = choose(
            self.name, shape.layers, True, None, memory, held, lambda k: self.update_phase(spec, shape, ref, gpu, k)[1]
        )
        room = update_room(memory, held)[1]
        if st.deepspeed_zero_stage == 3:
            # ZeRO-3 prefetches each layer's parameters along the module order it recorded (DeepSpeed's
            # PartitionedParameterCoordinator trace); a recompute that comes and goes between micro-batches changes
            # that order, and every change turns the prefetch off for that pass and the next: one count for all,
            # with selective layers (the same modules run in the recompute, so the order holds). Not with LoRA:
            # TRL forces reentrant checkpointing for PEFT under ZeRO-3, and it cannot keep chosen op outputs
            if ref.lora is None:
                sel = lambda k, s: self.update_phase(spec, shape, ref, gpu, k, selective=s)[1] <= room  # noqa: E731
                choice = choose_selective(choice, sel, self.selective_cost(spec, shape, ref, gpu))
            return choice, None
        if not per_micro:
            return choice, None
        fits = lambda k, share: self.update_phase(spec, shape, ref, gpu, k, share)[1] <= room  # noqa: E731
        return choice, schedule(choice, fits)

    def selective_cost(self, spec: RLTRunSpec, shape: ModelShape, ref: ModelRef, gpu: bool) -> float:
        """A selective layer's recompute as a share of the layer's forward: its memory-bound ops' bytes
        (selective_recompute_bytes_per_token) at SELECTIVE_BANDWIDTH_SHARE of the GPU's bandwidth, over the
        layer's 2 FLOPs a parameter a token at the plan's utilisation of its peak (rlt.checks.step_time)."""
        if not shape.layers or not shape.layer_params:
            return 1.0
        f = figures(spec)
        memory = selective_recompute_bytes_per_token(shape, dtype_bytes(ref, gpu)) / (
            f.gpu.bandwidth * SELECTIVE_BANDWIDTH_SHARE
        )
        forward = 2 * shape.layer_params / shape.layers / (f.peak_flops * UTILISATION)
        return min(1.0, memory / forward)

    def step_phases(
        self, spec: RLTRunSpec, shape: ModelShape, shapes: Shapes, trainable: int, checkpoint: int,
        prompts: PromptTokens | None, gpu_memory: int | None,
    ) -> StepTime:  # fmt: skip
        """The step of rows of half maxLength on average, maxLength at the longest, dealt across the ranks by
        tokens (the sft-like stages: rlt.stages.sft_balance)."""
        length: int = self.settings(spec).max_length
        return step_time(spec, self.name, shape, trainable, checkpoint, length / 2, length, dealt=True, window=True)

    def step_models(self, spec: RLTRunSpec) -> set[str]:
        return {spec.teacher.model}

    # ----------------------------------------------------------------------- shared parts

    def memory(
        self, spec: RLTRunSpec, shape: ModelShape, ref: ModelRef, gpu: bool, kept: int = 0, selective: int = 0
    ) -> tuple[int, Terms, Terms, int]:
        """(host bytes at start-up, GPU terms, phase terms, trainable parameters) of one trainer process whose last
        `kept` decoder layers keep their activations and `selective` before them their matmuls' (layer_choice)."""
        st = self.settings(spec)
        res = spec.resources.trainer
        b = dtype_bytes(ref, gpu)
        trainable = trainable_params(shape, ref)
        states, host, how = model_states(shape, trainable, st.deepspeed_zero_stage, res.nodes, max(1, res.gpus), b)
        terms = [(f"model states ({how})", states)]
        world = world_of(spec)
        zero = st.deepspeed_zero_stage
        if world > 1 and zero > 0:
            buckets = 1 if zero == 3 else 2  # rlt's config turns overlap_comm on: ZeRO 1/2 double-buffer
            if not gpu:
                # torch.empty on a GPU reserves each whole bucket; on CPU only the pages gradients are copied into
                # count, and the second buffer is first used by the second flush
                buckets = min(buckets, math.ceil(trainable / DS_REDUCE_BUCKET))
            per_bucket = DS_REDUCE_BUCKET if gpu else min(DS_REDUCE_BUCKET, trainable)
            terms.append((f"DeepSpeed gradient buckets ({buckets} × reduce_bucket_size)", buckets * per_bucket * b))
            if zero == 3:
                # DeepSpeed keeps gathered parameters until stage3_max_live_parameters are resident (reused within
                # stage3_max_reuse_distance, both 1e9 by default, rlt sets neither): a model under 1e9 parameters
                # stays whole on every rank through forward and backward
                live = min(shape.params, DS_MAX_LIVE_PARAMETERS)
                terms.append(("ZeRO-3 gathered parameters (stage3_max_live_parameters)", live * b))
        phases = [self.update_phase(spec, shape, ref, gpu, kept, selective=selective)]
        if gpu:
            terms.append(("CUDA context + NCCL (constant)", CUDA_OVERHEAD))
        return host, terms, phases, trainable

    def update_phase(
        self, spec: RLTRunSpec, shape: ModelShape, ref: ModelRef, gpu: bool, kept: int, share: float = 1.0,
        selective: int = 0,
    ) -> tuple[str, int]:  # fmt: skip
        """The update's activations for the longest micro-batch (perDeviceBatchSize rows of the stage's longest;
        `share` of its tokens for a shorter one), its last `kept` decoder layers keeping theirs and `selective`
        before them their matmuls' and attention's outputs, and TRL's loss tiles: (name, bytes)."""
        st = self.settings(spec)
        b = dtype_bytes(ref, gpu)
        length, scored = self.lengths(spec)
        if share != 1.0:
            length, scored = max(1, round(length * share)), max(1, round(scored * share))
        rows = st.per_device_batch_size
        # TRL scores only the labelled positions on a Triton device; its torch fallback scores every position
        loss_tokens = rows * scored if gpu else rows * length
        head_trainable = ref.lora is None  # PEFT's all-linear leaves the output head out
        if not st.gradient_checkpointing:
            kept, selective, how = shape.layers, 0, "checkpointing off"
        else:
            how = f"checkpointing {shape.layers - kept} of {shape.layers} layers" + (
                f", {selective} selectively" if selective else ""
            )
        name = f"activations ({rows} × {length} tokens, {how}) + TRL loss tiles"
        size = activations(shape, rows, length, kept, b, selective) + lm_head_loss_bytes(
            shape, loss_tokens, b, gpu, head_trainable
        )
        if ref.lora is not None and ref.lora.dropout > 0:
            # PEFT applies the LoRA dropout to each adapted layer's input: a new tensor and its mask (1 byte) kept
            # for the backward pass, per adapted layer: the kept layers' and one recomputed layer's
            live = min(shape.layers, max(kept, 1))
            width = shape.lora_input_width(ref.lora.target_modules) * live // max(1, shape.layers)
            name, size = f"{name} + LoRA dropout copies", size + rows * length * width * (b + 1)
        return name, size

    def disk(
        self, spec: RLTRunSpec, shape: ModelShape, trainable: int, b: int, rows: int | None, plan: Plan
    ) -> tuple[int, int]:
        """(peak extra bytes while the stage runs, bytes it leaves)."""
        st = self.settings(spec)
        world = world_of(spec)
        one = checkpoint_bytes(shape, trainable, st.deepspeed_zero_stage, world, b)
        one += self.checkpoint_extra(spec, shape, trainable, b)
        steps = self.steps(spec, rows)
        saves = None if steps is None else max(1, steps // st.save_steps + (steps % st.save_steps > 0))
        if st.save_total_limit is not None:
            held = st.save_total_limit + 1  # the Trainer writes the new checkpoint before it deletes the oldest
            held = held if saves is None else min(held, saves)
        elif saves is not None:
            held = saves
        else:
            plan.checks.append(
                Check(
                    self.name,
                    "checkpoints on the volume",
                    [("unbounded (saveTotalLimit unset, steps unknown)", 1)],
                    0,
                    f"stages.{self.name}.saveTotalLimit",
                )
            )
            held = 0
        lora = trainable < shape.params
        model = saved_model_bytes(shape, st.deepspeed_zero_stage, world, b) + (trainable * 4 if lora else 0)
        # finished: the model, and the last checkpoint; a LoRA checkpoint holds the adapter only
        last_weights = trainable * 4 if lora else saved_model_bytes(shape, st.deepspeed_zero_stage, world, b)
        return held * one + model, model + self.kept_checkpoint(spec, held, one, last_weights)
