"""The rl stage's plan terms: a Trainer stage (GRPO) on spec.teacher whose rows are prompt + completion, with the
reward's student, GRPO's reference and the sampling beside the update in memory, and a rollout, the scoring and the
reference pass before each update in its step."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from rlt.checks.decode_tail import Engine, rollout
from rlt.checks.gpu_figures import figures
from rlt.checks.gpu_memory import GiB, kv_sequences, spec_gpu_memory
from rlt.checks.model_shape import ModelShape, Shapes, dtype_bytes
from rlt.checks.plan_terms import (
    DS_MAX_LIVE_PARAMETERS,
    Plan,
    PlanInputs,
    PromptTokens,
    StepTime,
    scoring_bytes_per_token,
    scoring_token_cap,
    scoring_tokens,
)
from rlt.checks.stage_terms.trainer import Terms, TrainerTerms, world_of
from rlt.checks.step_time import (
    MEAN_COMPLETION_SHARE,
    WEIGHT_SYNC_BYTES_PER_S,
    default_prompts,
    seconds_of,
    step_time,
)
from rlt.contract.method_registry import method_info
from rlt.spec.budgets import VLLM_MAX_NUM_SEQS
from rlt.spec.inputs import ModelRef
from rlt.spec.run import RLTRunSpec
from rlt.spec.stages import DEALABLE_LOSSES
from rlt.spec.stages.rl import NO_OVERLAP, PARTIAL_ROLLOUTS

# A sleeping vLLM engine keeps its CUDA graphs and allocator pools on the GPU: ~0.5-1 GiB for a 7B model (vLLM's
# sleep-mode notes); a documented estimate, not measured here.
VLLM_ASLEEP = 1 * GiB
# Colocated weight sync in place: TRL gathers each ZeRO-3 parameter over NVLink and loads it into the local engine
# (load_weights), no network broadcast; per-parameter overheads dominate, ~1.5 s for a 7B model. An estimate.
INPLACE_SYNC_BYTES_PER_S = 10e9
# TRL 1.16 puts the engine to sleep at level 2 (trl/generation/vllm_generation.py): weights and KV cache are
# discarded, nothing is kept in host memory, and the weights come back with the in-place sync (its own term). What
# is left per rollout is waking the weights' and the KV cache's memory and the sleep call: an estimate, not measured.
ENGINE_WAKE_SLEEP_SECONDS = 0.5


@dataclass(frozen=True)
class RlTerms(TrainerTerms):
    def lengths(self, spec: RLTRunSpec) -> tuple[int, int]:
        rl = spec.stages.rl
        return rl.max_prompt_length + rl.max_completion_length, rl.max_completion_length

    def gpu_fix(self, spec: RLTRunSpec) -> str:
        colocated = spec.stages.rl.generation.mode == "colocate"
        return (
            "resources.trainer.gpus/nodes (more ranks split ZeRO-3 states), stages.rl.maxCompletionLength, "
            + ("stages.rl.generation.gpuMemoryUtilization (the colocated engine's share), " if colocated else "")
            + "stages.rl.reward.maxBatchTokens or a GPU with more memory (--gpu-memory)"
        )

    def steps(self, spec: RLTRunSpec, rows: int | None) -> int | None:
        return spec.stages.rl.steps

    def kept_checkpoint(self, spec: RLTRunSpec, held: int, one: int, last_weights: int) -> int:
        # rl keeps its checkpoints whole (optimizer states: stages.rl.steps extends a finished run from them)
        return min(held, spec.stages.rl.save_total_limit or held) * one

    def step_models(self, spec: RLTRunSpec) -> set[str]:
        return {spec.teacher.model, spec.student.model}

    def checkpoint_extra(self, spec: RLTRunSpec, shape: ModelShape, trainable: int, b: int) -> int:
        """The synced GRPO reference (rlt.stages.reference.REFERENCE_FILE, the teacher's dtype), in every checkpoint
        after the first sync: with a reference (beta > 0), refSync on and no LoRA (whose reference is the base)."""
        rl = spec.stages.rl
        return shape.params * b if rl.beta > 0 and rl.ref_sync.enabled and trainable == shape.params else 0

    def extra_memory(
        self, spec: RLTRunSpec, shape: ModelShape, ref: ModelRef, shapes: Shapes, at: PlanInputs, plan: Plan,
        terms: Terms, phases: Terms,
    ) -> int:  # fmt: skip
        """The reward's student, the GRPO reference, sampling. Returns the host bytes its student adds."""
        rl = spec.stages.rl
        world, gpu, student = world_of(spec), at.gpu, shapes.student
        b = dtype_bytes(ref, gpu)
        host = 0
        if student is not None:
            sb = dtype_bytes(spec.student, gpu)
            whole = student.params * sb
            cap = rl.reward.max_batch_tokens or scoring_token_cap(spec, student, at.gpu_memory, sb)
            plan.values["rl.reward.maxBatchTokens"] = cap
            tokens = scoring_tokens(spec, cap)
            scoring = (f"scoring micro-batch ({tokens} tokens)", tokens * scoring_bytes_per_token(student, sb))
            # method rcl samples from its student too (probes, answers) and keeps it whole on every rank
            if world > 1 and rl.deepspeed_zero_stage == 3 and not method_info(spec.method).samples_student:
                # rlt.stages.rl.partition_frozen (TRL's prepare_deepspeed): 1/world between steps, gathered
                # whole for each score call (benchmarks/student_partition.py measures the 1/world)
                terms.append(("reward student, frozen (ZeRO-3 partitioned)", whole // world))
                scoring = (f"{scoring[0]} + student gathered whole", scoring[1] + whole - whole // world)
            else:
                terms.append((f"{spec.method} student, frozen, whole on every rank", whole))
            phases.append(scoring)
            host += world // spec.resources.trainer.nodes * student.params * sb
        if rl.beta > 0 and ref.lora is None and rl.ref_sync.enabled and rl.deepspeed_zero_stage == 3:
            # rlt.stages.rl.pairwise_ref_sync gathers one pair at a time (TRL's callback: both models)
            phases.append(("reference soft-sync, one parameter pair gathered", 2 * shape.largest_param * b))
        if rl.beta > 0 and ref.lora is None:
            split = world if rl.deepspeed_zero_stage == 3 and world > 1 else 1
            partitioned = " (ZeRO-3 partitioned)" if split > 1 else ""
            terms.append(("GRPO reference model" + partitioned, shape.params * b // split))
        if rl.generation.mode == "inprocess":
            seqs = rl.batch_size // world
            kv = seqs * (rl.max_prompt_length + rl.max_completion_length) * shape.kv_bytes_per_token * b
            if rl.deepspeed_zero_stage == 3 and world > 1:
                # sampling (and the one-step-off copy's refresh) gathers the whole policy (TRL's
                # unwrap_model_for_generation): what the live parameters' term does not already hold
                gathered = (shape.params - min(shape.params, DS_MAX_LIVE_PARAMETERS)) * b
                if gathered:
                    phases.append(("policy gathered whole for sampling (beyond the live parameters)", gathered))
            if rl.generation.overlap == NO_OVERLAP:
                phases.append((f"in-process sampling KV cache ({seqs} sequences)", kv))
            else:
                # one step off (rlt.stages.overlap.LocalBehaviour): a frozen copy of the policy samples the next
                # step's rows during this step's update, whole on every rank even under ZeRO-3 (it samples without
                # a collective); the copy and its KV cache sit beside the update, not between its phases. A LoRA
                # policy's copy is PEFT's model: the base in its dtype, the adapters in float32 (PEFT's autocast)
                adapters = 4 * shape.lora_params(ref.lora.r, ref.lora.target_modules) if ref.lora else 0
                terms.append(
                    ("one-step-off sampling copy of the policy, whole on every rank", shape.params * b + adapters)
                )
                terms.append((f"in-process sampling KV cache ({seqs} sequences), beside the update", kv))
        elif rl.generation.mode == "colocate":
            # vLLM's sleep mode (level 2, as TRL calls it) between rollouts: weights and KV cache discarded; awake,
            # the engine takes its gpuMemoryUtilization share of the GPU (weights, working memory, KV cache)
            util = rl.generation.gpu_memory_utilization
            terms.append(("vLLM engine asleep (CUDA graphs, allocator pools; constant)", VLLM_ASLEEP))
            phases.append(
                (f"vLLM engine awake (gpuMemoryUtilization {util:.2f}: weights, KV cache)", int(util * at.gpu_memory))
            )
        return host

    def step_phases(
        self, spec: RLTRunSpec, shape: ModelShape, shapes: Shapes, trainable: int, checkpoint: int,
        prompts: PromptTokens | None, gpu_memory: int | None,
    ) -> StepTime:  # fmt: skip
        """Rows of the teacher's prompts plus completions, dealt across the ranks by tokens for the loss types where
        a row weighs the same in any micro-batch; the rollout, scoring and passes before the update."""
        rl = spec.stages.rl
        prompts = prompts or default_prompts(spec)
        mean = prompts.mean + rl.max_completion_length * MEAN_COMPLETION_SHARE
        longest = prompts.longest + rl.max_completion_length
        dealt = rl.loss_type in DEALABLE_LOSSES
        t = step_time(spec, self.name, shape, trainable, checkpoint, mean, longest, dealt)
        rows = rl.batch_size / world_of(spec)
        return _rl_phases(spec, t, shape, shapes.student, rows, mean, gpu_memory)


def _rl_phases(
    spec: RLTRunSpec,
    t: StepTime,
    shape: ModelShape,
    student: ModelShape | None,
    rows: float,
    mean: float,
    gpu_memory: int | None,
) -> StepTime:
    """The rl step's phases before the update: the rollout, the scoring and the reference pass over a
    rank's `rows` of `mean` tokens."""
    rl, gen = spec.stages.rl, spec.resources.generator
    mode = rl.generation.mode
    completion = rl.max_completion_length * MEAN_COMPLETION_SHARE
    server = mode == "server"
    engines = max(1, gen.engines) if server else t.trainer_gpus
    slots = VLLM_MAX_NUM_SEQS
    b = dtype_bytes(spec.teacher)
    if mode != "inprocess":
        memory = gpu_memory if gpu_memory is not None else spec_gpu_memory(spec)[0]
        # vLLM allocates KV pages as tokens are made: the mean row, not the longest, sets how many share the cache;
        # a colocated engine is one GPU's, its share gpuMemoryUtilization as a generator's
        tp = gen.tensor_parallel_size if server else 1
        slots = min(slots, max(1, kv_sequences(spec, shape, memory, math.ceil(mean), tp, b)))
    at_once = min(rl.batch_size, engines * slots)
    # GRPO's reference at beta > 0 (LoRA: the base with its adapter off, still a whole forward). TRL's old-policy
    # forward for its vLLM importance sampling is folded into the update's (rlt.stages.folded_ratio): none here
    names = ["reference pass"] if rl.beta > 0 else []
    tokens = rows * mean
    fig = figures(spec)
    decode = fig.decode_tokens_per_s
    busy = rl.batch_size * completion / (engines * slots * decode)
    tail = None
    if mode != "inprocess":  # HF generate pads finished rows: no slot is freed, today's bounds stand
        tp = gen.tensor_parallel_size if server else 1
        weights, kv = shape.params * b / tp, shape.kv_bytes_per_token * b / tp  # one GPU's shard
        engine = Engine(weights, kv, round(mean - completion), slots, decode, fig.gpu.bandwidth)
        tail = rollout(engine, math.ceil(rl.batch_size / engines), rl.max_completion_length, MEAN_COMPLETION_SHARE)
        busy = tail.seconds - tail.empty
    # partial rollouts: after each push an engine's running rows (its slots; live rows hold a third of the longest
    # completion on average, rlt.checks.decode_tail) recompute their KV cache under the new weights: a prefill
    partial = server and rl.generation.overlap == PARTIAL_ROLLOUTS
    live = mean - completion + rl.max_completion_length / 3
    tp = gen.tensor_parallel_size if server else 1
    kv_recompute = seconds_of(slots * live * 2 * shape.params / tp, spec) if partial else 0.0
    return replace(
        t,
        reads_prompts=True,
        generator_gpus=gen.replicas * gen.gpus if server else 0,
        engine_gpus=gen.engine_gpus if server else 0,
        # generators on MIG slices hold a share of a GPU the plan does not know: counting none would credit their
        # decoding to the trainer GPUs (a goodput above 100 %)
        goodput_unknown="the generators hold MIG slices (resources.generator.gpus: 0), a share of a GPU the plan "
        "does not know"
        if server and not gen.gpus
        else "",
        throughput_bound=rl.batch_size * completion / (at_once * decode),
        longest_bound=rl.max_completion_length / decode,
        busy_generation=busy,
        decode=tail,
        transfer=shape.params * b / (INPLACE_SYNC_BYTES_PER_S if mode == "colocate" else WEIGHT_SYNC_BYTES_PER_S)
        if mode != "inprocess"
        else 0.0,
        engine_switch=ENGINE_WAKE_SLEEP_SECONDS if mode == "colocate" else 0.0,
        # only separate generators overlap the trainers: inprocess and colocate decode on the trainers' own GPUs
        one_step_off=rl.generation.overlap != NO_OVERLAP and mode == "server",
        partial_rollouts=partial,
        kv_recompute=kv_recompute,
        scoring=seconds_of(tokens * 2 * student.params, spec) if student is not None else 0.0,
        passes_work=seconds_of(tokens * 2 * shape.params * len(names), spec),
        passes_name=" + ".join(names),
    )


def position_problems(spec: RLTRunSpec, shape: ModelShape) -> list[str]:
    """vLLM refuses a --max-model-len beyond the model's max_position_embeddings, and without one serves at most
    that many tokens: the rl stage's longest request (prompt + completion) must fit."""
    top = shape.max_positions
    rl = spec.stages.rl
    if not top:
        return []
    gen = rl.generation
    if gen.max_model_len is not None and gen.max_model_len > top:
        return [
            f"spec.stages.rl.generation.maxModelLen: {gen.max_model_len} is above the {top} positions of "
            f"{spec.teacher.model} (max_position_embeddings; vLLM refuses it); at most {top}"
        ]
    need = rl.max_prompt_length + rl.max_completion_length
    if gen.max_model_len is None and rl.enabled and need > top:
        return [
            f"spec.stages.rl.maxPromptLength: {rl.max_prompt_length} + maxCompletionLength "
            f"{rl.max_completion_length} = {need} is above the {top} positions of {spec.teacher.model} "
            "(max_position_embeddings), the most its vLLM server takes"
        ]
    return []


TERMS = RlTerms("rl")
