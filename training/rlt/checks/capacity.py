"""The capacity plan of a run (`rlt plan`, `rlt validate`): for every enabled stage, per pod, what each process
needs on its GPU, what a trainer pod needs in host memory, what a generator's KV cache holds, and what the run's
volume holds at its fullest, each compared with what the spec gives it. Pure: spec + model shapes in, a Plan out.

Where a library estimates a term, its estimator is used: DeepSpeed's ZeRO-2/ZeRO-3 model-state estimators (GPU and
host memory), the model's own config for parameter counts (rlt.checks.shapes) and KV sizes. The rest is arithmetic
written out below with its assumptions; the CPU benchmark (benchmarks/capacity.py) measures it against real runs."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from rlt.checks.gpu_memory import (
    DEFAULT_GPU_MEMORY,
    GPU_MEMORY_LABEL,
    MIN_KV_SEQUENCES,
    VLLM_NON_KV,
    GiB,
    kv_sequences,
    spec_gpu_memory,
    tensor_parallel_choice,
)
from rlt.checks.model_shape import (
    ModelShape,
    Shapes,
    checkpoint_bytes,
    dtype_bytes,
    saved_model_bytes,
    trainable_params,
)
from rlt.checks.step_time import (
    MEAN_COMPLETION_SHARE,
    PromptTokens,
    default_prompts,
    goodput_line,
    preemption_notes,
    trainer_grace_period,
    trainer_step_times,
)
from rlt.contract.method_registry import method_info
from rlt.spec.budgets import VLLM_MAX_NUM_SEQS
from rlt.spec.inputs import ModelRef
from rlt.spec.k8s import quantity_bytes
from rlt.spec.run import RLTRunSpec, needs_generators, stage_settings

# DEFAULT_GPU_MEMORY, GPU_MEMORY_LABEL, VLLM_NON_KV and spec_gpu_memory live in rlt.checks.gpu_memory (torch-free: the
# operator sizes the grace period from the rollout they bound); re-exported for the plan's callers (__all__ names the
# re-exports only: nothing star-imports this module, and its own names are public as before).
__all__ = ["DEFAULT_GPU_MEMORY", "GPU_MEMORY_LABEL", "VLLM_NON_KV", "spec_gpu_memory"]
GPU_COUNT_LABEL = "nvidia.com/gpu.count"  # GPU feature discovery's label: GPUs of one node
DEFAULT_NODE_GPUS = 8  # an HGX/DGX node, when the run selects no node size
# Per GPU process, outside what torch allocates: the CUDA context with torch's kernels (0.5-1 GiB) and NCCL's
# communicators and buffers (NCCL_BUFFSIZE 4 MiB per channel and peer, up to 32 channels; ~1-2 GiB on 8 GPUs).
# Not measurable on CPU: a documented constant.
CUDA_OVERHEAD = 3 * GiB
# DeepSpeed's default reduce_bucket_size (elements; rlt's ZeRO config leaves it unset): ZeRO 1/2 allocate two
# gradient buckets of it with overlap_comm (stage_1_and_2.setup_buckets), ZeRO-3 one (stage3, "IPG").
DS_REDUCE_BUCKET = 500_000_000
# DeepSpeed's default stage3_max_live_parameters (parameters resident per GPU before it releases gathered ones).
DS_MAX_LIVE_PARAMETERS = 1_000_000_000
SCORING_SHARE = 0.1  # share of the GPU a scoring micro-batch may take (reward.maxBatchTokens default)
# The training loss (TRL 1.16's SFT and GRPO trainers both add a fused LM head, trl.trainer.utils.add_fused_lm_head):
# log-probabilities from tiles of at most TOKEN_CHUNK_SIZE tokens × _CHUNKED_LOGPROB_CHUNK_SIZE vocabulary entries
# (trl.kernels.chunked_logprob), never the whole logits. With Triton (a GPU) each tile is folded in place; without it
# (CPU) TRL's torch fallback `_backward_tile` keeps this many fp32 copies of a tile live at once (y, z, log_p, p,
# grad, the target mask as float, their difference and its product with the incoming gradient; torch.profiler
# shows 8 live at the benchmark's peak).
LOSS_TILE_FALLBACK_COPIES = 8
# Characters per token of a stored explanation, for the size of generated datasets (JSONL text).
CHARS_PER_TOKEN = 4
# Rows of hub datasets the examples use (dataset card): needed for step counts when the data is not local.
KNOWN_DATASET_ROWS = {"bespokelabs/Bespoke-Stratos-17k": 16710}


@dataclass
class Check:
    """One resource of one stage: its terms, their total, what the spec gives it, and the field that changes it."""

    stage: str
    resource: str
    terms: list[tuple[str, int]]
    limit: int | None
    fix: str
    note: str = ""
    # Terms of which only the largest is live at once (a GRPO step samples, then scores, then trains).
    phases: list[tuple[str, int]] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(b for _, b in self.terms) + max((b for _, b in self.phases), default=0)

    @property
    def fits(self) -> bool:
        return self.limit is None or self.total <= self.limit


@dataclass
class Plan:
    gpu_memory: int
    checks: list[Check] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    values: dict[str, int] = field(default_factory=dict)  # derived settings (e.g. the scoring token cap)
    shapes: Shapes | None = None
    disk: dict[str, tuple[int, int]] = field(default_factory=dict)  # stage -> (bytes at its fullest, bytes it keeps)
    stopping: list[str] = field(default_factory=list)  # step time, save time, what a stop loses (step_time)
    generation: list[str] = field(default_factory=list)  # distill's sequences in flight per rank, and why
    goodput: list[str] = field(default_factory=list)  # per Trainer stage: useful share of held GPU-seconds, losses
    unplaceable: list[str] = field(default_factory=list)  # pods no node set can hold (one line each, the fix named)
    warnings: list[str] = field(default_factory=list)  # settings that cost GPU-hours, with the value to set

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if not c.fits]

    def errors(self, stages: tuple[str, ...] | None = None) -> list[str]:
        """One line per resource that cannot fit (of `stages` only, when given), naming the field to change; the
        run's placement problems concern every stage."""
        return [
            f"{c.stage}: {c.resource} needs {gib(c.total)} but has {gib(c.limit or 0)}; change {c.fix}"
            for c in self.failures
            if stages is None or c.stage in stages
        ] + [f"all: {line}" for line in self.unplaceable]

    def headline(self, stages: tuple[str, ...]) -> str:
        """Need of has of every bounded resource of `stages`, one clause each (the plan of a pod that fits)."""
        return "; ".join(
            f"{c.resource} {c.total / GiB:.1f} of {gib(c.limit)}"
            for c in self.checks
            if c.stage in stages and c.limit is not None
        )


def gib(n: int | float) -> str:
    return f"{n / GiB:.1f} GiB"


# --------------------------------------------------------------------------- GPU terms


def model_states(shape: ModelShape, trainable: int, zero: int, nodes: int, gpus: int, b: int) -> tuple[int, int, str]:
    """(GPU bytes, host bytes at start-up, how) of one process's weights, gradients and Adam states.

    One process or ZeRO 0: no DeepSpeed; the Trainer's AdamW keeps its states in the parameters' dtype (weights b,
    gradient b, two moments 2b per trainable parameter; a LoRA adapter is kept in fp32 by PEFT: 16 bytes).
    ZeRO 1/2/3: DeepSpeed's estimators for the trainable parameters (mixed precision: 18 bytes per parameter split
    over the ranks, plus the 16-bit copy for ZeRO 1/2 or the largest layer gathered for ZeRO 3); frozen parameters
    (LoRA's base) in 16 bit, partitioned by ZeRO 3. Host: the estimators' start-up memory (each rank loads the
    model before DeepSpeed partitions it)."""
    frozen = shape.params - trainable
    world = nodes * gpus
    lora = trainable < shape.params
    if world <= 1 or zero == 0:
        # weights b per parameter; per trainable one: gradient + two moments (3b), or 16 bytes for fp32 LoRA
        per_trainable = 16 if lora else 3 * b
        return shape.params * b + trainable * per_trainable, shape.params * b, "no DeepSpeed (one process or ZeRO 0)"
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    if zero == 3:
        host, gpu, _ = estimate_zero3_model_states_mem_needs(
            trainable,
            min(trainable, shape.largest_param),
            gpus,
            nodes,
            cpu_offload=False,
            cpu_offload_params=False,
            zero_init=False,
        )
        return gpu + frozen * b // world, host, "DeepSpeed estimate_zero3_model_states_mem_needs"
    host, gpu = estimate_zero2_model_states_mem_needs(trainable, gpus, nodes, cpu_offload=False)
    return gpu + frozen * b, host, f"DeepSpeed estimate_zero2_model_states_mem_needs (ZeRO {zero})"


def layer_bytes_per_token(shape: ModelShape, b: int) -> int:
    """Activations one decoder layer keeps for the backward pass, per token: the two norms' inputs and outputs,
    q/k/v, the attention output, the MLP's gate, up, activation and down input (flash/SDPA attention: no
    length² term)."""
    kv = shape.kv_heads * shape.head_dim
    return b * (6 * shape.hidden + 2 * kv + 4 * shape.intermediate)


@lru_cache(maxsize=8)
def trl_constant(module: str, name: str) -> int:
    """An integer constant of the installed TRL, read from the module's source: importing trl.trainer.utils imports
    all of TRL, 3 s more in every trainer pod's preflight."""
    import ast
    import importlib.util
    from pathlib import Path

    found = importlib.util.find_spec(module)
    if found is None or found.origin is None:
        raise LookupError(f"{module} is not installed: the capacity plan reads the loss tile sizes from TRL")
    for node in ast.parse(Path(found.origin).read_text()).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return int(ast.literal_eval(node.value))
    raise LookupError(f"{module}.{name} is gone from the installed TRL: rlt.checks.capacity needs its loss tile size")


def lm_head_loss_bytes(shape: ModelShape, tokens: int, b: int, gpu: bool, head_trainable: bool) -> int:
    """Memory of TRL's fused LM-head loss over `tokens` positions (LOSS_TILE_FALLBACK_COPIES): the tile buffer
    (min(tokens, TOKEN_CHUNK_SIZE) × the chunk width in the compute dtype; a GPU allocates the whole width, a CPU
    touches only the vocabulary's part), the fp32 gradient of the hidden states it accumulates, the fp32 gradient of
    the head's weight when the head trains, and on CPU the torch fallback's fp32 copies of a tile."""
    rows = min(tokens, trl_constant("trl.kernels.chunked_logprob", "TOKEN_CHUNK_SIZE"))
    CHUNK = trl_constant("trl.trainer.utils", "_CHUNKED_LOGPROB_CHUNK_SIZE")
    width = CHUNK if gpu else min(shape.vocab, CHUNK)
    total = rows * width * b + tokens * shape.hidden * 4 + (shape.vocab * shape.hidden * 4 if head_trainable else 0)
    if not gpu:
        total += LOSS_TILE_FALLBACK_COPIES * rows * min(shape.vocab, CHUNK) * 4
    return total


def activations(shape: ModelShape, rows: int, length: int, checkpointing: bool, b: int) -> int:
    """Training activations of one micro-batch: with gradient checkpointing every layer's input plus one layer
    recomputed, else every layer's (the loss is lm_head_loss_bytes)."""
    per_layer = rows * length * layer_bytes_per_token(shape, b)
    return rows * length * shape.hidden * b * shape.layers + per_layer if checkpointing else per_layer * shape.layers


def scoring_bytes_per_token(shape: ModelShape, b: int) -> int:
    """A scored position under no_grad: one layer's transients (norm, q/k/v, MLP) and the shared prompt's KV cache
    copied per row (rlt.method.scoring); the head runs on 128-row chunks, a constant."""
    kv = shape.kv_heads * shape.head_dim
    return b * (shape.kv_bytes_per_token + 2 * shape.hidden + 2 * kv + 3 * shape.intermediate)


def scoring_token_cap(spec: RLTRunSpec, shape: ModelShape, gpu_memory: int, dtype_bytes: int) -> int:
    """Default scoring micro-batch cap (reward.maxBatchTokens): SCORING_SHARE of the GPU over the student's bytes
    per scored token, at least one full row (prompt + completion)."""
    rl = spec.stages.rl
    return max(
        rl.max_prompt_length + rl.max_completion_length,
        int(SCORING_SHARE * gpu_memory) // (scoring_bytes_per_token(shape, dtype_bytes)),
    )


def scoring_tokens(spec: RLTRunSpec, cap: int) -> int:
    """Positions of the largest scoring micro-batch: at most reward.batchSize rows of full length and at most the
    token cap (rlt.method.scoring.Scorer batches by both)."""
    rl = spec.stages.rl
    return min(cap, rl.reward.batch_size * (rl.max_prompt_length + rl.max_completion_length))


# --------------------------------------------------------------------------- the plan


def _trainer_terms(
    spec: RLTRunSpec, stage: str, shape: ModelShape, ref: ModelRef, gpu: bool
) -> tuple[int, list[tuple[str, int]], list[tuple[str, int]], int]:
    """(host bytes at start-up, GPU terms, phase terms, trainable parameters) of a Trainer stage's process."""
    st = stage_settings(spec, stage)
    res = spec.resources.trainer
    b = dtype_bytes(ref, gpu)
    trainable = trainable_params(shape, ref)
    states, host, how = model_states(shape, trainable, st.deepspeed_zero_stage, res.nodes, max(1, res.gpus), b)
    terms = [(f"model states ({how})", states)]
    world = res.nodes * max(1, res.gpus)
    zero = st.deepspeed_zero_stage
    if world > 1 and zero > 0:
        buckets = 1 if zero == 3 else 2  # rlt's config turns overlap_comm on: ZeRO 1/2 double-buffer
        if not gpu:
            # torch.empty on a GPU reserves each whole bucket; on CPU only the pages gradients are copied into count,
            # and the second buffer is first used by the second flush
            buckets = min(buckets, math.ceil(trainable / DS_REDUCE_BUCKET))
        per_bucket = DS_REDUCE_BUCKET if gpu else min(DS_REDUCE_BUCKET, trainable)
        terms.append((f"DeepSpeed gradient buckets ({buckets} × reduce_bucket_size)", buckets * per_bucket * b))
        if zero == 3:
            # DeepSpeed keeps gathered parameters until stage3_max_live_parameters are resident (reused within
            # stage3_max_reuse_distance, both 1e9 by default, rlt sets neither): a model under 1e9 parameters stays
            # whole on every rank through forward and backward
            live = min(shape.params, DS_MAX_LIVE_PARAMETERS)
            terms.append(("ZeRO-3 gathered parameters (stage3_max_live_parameters)", live * b))
    if stage == "rl":
        length, scored = st.max_prompt_length + st.max_completion_length, st.max_completion_length
    else:
        length = scored = st.max_length
    rows = st.per_device_batch_size
    # TRL scores only the labelled positions on a Triton device; its torch fallback scores every position
    loss_tokens = rows * scored if gpu else rows * length
    head_trainable = ref.lora is None  # PEFT's all-linear leaves the output head out
    phases = [
        (
            f"activations ({rows} × {length} tokens, checkpointing {'on' if st.gradient_checkpointing else 'off'})"
            " + TRL loss tiles",
            activations(shape, rows, length, st.gradient_checkpointing, b)
            + lm_head_loss_bytes(shape, loss_tokens, b, gpu, head_trainable),
        )
    ]
    if ref.lora is not None and ref.lora.dropout > 0:
        # PEFT applies the LoRA dropout to each adapted layer's input: a new tensor and its mask (1 byte) kept for
        # the backward pass, per adapted layer (one layer's worth under gradient checkpointing)
        width = shape.lora_input_width(ref.lora.target_modules)
        width = width // shape.layers if st.gradient_checkpointing else width
        name, size = phases[0]
        phases[0] = (f"{name} + LoRA dropout copies", size + st.per_device_batch_size * length * width * (b + 1))
    if gpu:
        terms.append(("CUDA context + NCCL (constant)", CUDA_OVERHEAD))
    return host, terms, phases, trainable


def plan_run(
    spec: RLTRunSpec,
    shapes: Shapes,
    gpu_memory: int = DEFAULT_GPU_MEMORY,
    gpu: bool = True,
    prompts: PromptTokens | None = None,
) -> Plan:
    """The plan of every enabled stage. `gpu`: plan for GPUs (bf16 auto dtype, CUDA terms); False plans a CPU run
    (fp32 auto dtype), what the benchmark measures. `prompts`: the teacher prompts' measured lengths (the step
    time's default, rlt.checks.step_time.default_prompts, when None)."""
    plan = Plan(gpu_memory)
    res = spec.resources
    world = res.trainer.nodes * max(1, res.trainer.gpus)
    teacher, student = shapes.teacher, shapes.student
    rows = dataset_rows(spec)
    host_need = 0
    stage_disk: dict[str, tuple[int, int]] = {}  # stage -> (peak extra while running, kept after)
    for stage in spec.stages.enabled():
        if stage in ("sft", "rl", "student"):
            ref = spec.teacher if stage != "student" else (spec.stages.student.model or spec.student)
            shape = teacher if stage != "student" else shapes.student_stage(spec)
            if shape is None:
                plan.notes.append(f"{stage}: model shape unknown, its memory and disk are not planned")
                continue
            b = dtype_bytes(ref, gpu)
            host, terms, phases, trainable = _trainer_terms(spec, stage, shape, ref, gpu)
            if stage == "rl":
                host += _rl_terms(spec, shape, ref, b, student, world, gpu_memory, gpu, plan, terms, phases)
            plan.checks.append(
                Check(
                    stage,
                    "GPU memory per trainer process",
                    terms,
                    gpu_memory if gpu else None,
                    _gpu_fix(stage, spec),
                    phases=phases,
                )
            )
            host_need = max(host_need, host)
            stage_disk[stage] = _trainer_disk(spec, stage, shape, trainable, b, rows, plan)
        elif stage in ("distill", "evaluate"):
            _generation_stage(spec, stage, shapes, gpu_memory, plan, gpu)
            stage_disk[stage] = (0, _generated_bytes(spec, stage, rows))
        if (
            stage in ("rl", "distill")
            and spec.stages.rl.generation.mode == "server"
            and teacher is not None
            and not any(c.resource.startswith("vLLM generator") for c in plan.checks)  # one StatefulSet serves both
        ):
            plan.checks.append(_generator_check(spec, stage, teacher, gpu_memory))
            line, warning = generator_parallelism(spec, teacher, gpu_memory, prompts)
            plan.generation.append(line)
            plan.warnings += [warning] if warning else []
        if stage == "distill" and spec.stages.rl.generation.mode == "server":
            plan.generation.append(
                f"distill, at prompts of maxPromptLength {spec.stages.rl.max_prompt_length} (each rank counts its "
                f"rows' mean prompt): {distill_sequences_in_flight(spec, teacher, gpu_memory)[1]}"
            )
    # Host memory of a trainer pod: DeepSpeed's start-up estimate (or every rank's loaded copy) and /dev/shm.
    limit = quantity_bytes(res.trainer.memory_limit or res.trainer.memory or f"{max(8, 32 * res.trainer.gpus)}Gi")
    plan.checks.append(
        Check(
            "all",
            "host memory per trainer pod",
            [("model loading / ZeRO start-up (DeepSpeed's estimate, all ranks of the pod)", host_need)],
            limit,
            "resources.trainer.memory",
            note="sharedMemory is added to the pod's request on top",
        )
    )
    plan.disk = stage_disk
    plan.checks.append(_volume_check(spec, shapes, stage_disk))
    if gpu:
        times = trainer_step_times(spec, shapes, prompts=prompts, gpu_memory=gpu_memory)
        plan.stopping, stop_warnings = preemption_notes(spec, times, trainer_grace_period(spec), prompts)
        plan.warnings += stop_warnings
        plan.goodput = [goodput_line(t) for t in times]
        plan.unplaceable = one_node_problems(spec)
    return plan


def _rl_terms(
    spec: RLTRunSpec,
    shape: ModelShape,
    ref,
    b: int,
    student: ModelShape | None,
    world: int,
    gpu_memory: int,
    gpu: bool,
    plan: Plan,
    terms: list,
    phases: list,
) -> int:
    """The rl stage's own GPU terms and phases beyond a trainer's (added to `terms` and `phases`): the reward's
    student, the GRPO reference, sampling. Returns the host bytes its student adds."""
    st = stage_settings(spec, "rl")
    host = 0
    rl = spec.stages.rl
    if student is not None:
        sb = dtype_bytes(spec.student, gpu)
        whole = student.params * sb
        cap = rl.reward.max_batch_tokens or scoring_token_cap(spec, student, gpu_memory, sb)
        plan.values["rl.reward.maxBatchTokens"] = cap
        tokens = scoring_tokens(spec, cap)
        scoring = (f"scoring micro-batch ({tokens} tokens)", tokens * scoring_bytes_per_token(student, sb))
        # method rcl samples from its student too (probes, answers) and keeps it whole on every rank
        if world > 1 and st.deepspeed_zero_stage == 3 and not method_info(spec.method).samples_student:
            # rlt.stages.rl.partition_frozen (TRL's prepare_deepspeed): 1/world between steps, gathered
            # whole for each score call (benchmarks/student_partition.py measures the 1/world)
            terms.append(("reward student, frozen (ZeRO-3 partitioned)", whole // world))
            scoring = (f"{scoring[0]} + student gathered whole", scoring[1] + whole - whole // world)
        else:
            terms.append((f"{spec.method} student, frozen, whole on every rank", whole))
        phases.append(scoring)
        host += world // spec.resources.trainer.nodes * student.params * sb
    if rl.beta > 0 and ref.lora is None and rl.ref_sync.enabled and st.deepspeed_zero_stage == 3:
        # rlt.stages.rl.pairwise_ref_sync gathers one pair at a time (TRL's callback: both models)
        phases.append(("reference soft-sync, one parameter pair gathered", 2 * shape.largest_param * b))
    if rl.beta > 0 and ref.lora is None:
        split = world if st.deepspeed_zero_stage == 3 and world > 1 else 1
        terms.append(
            (
                "GRPO reference model" + (" (ZeRO-3 partitioned)" if split > 1 else ""),
                shape.params * b // split,
            )
        )
    if rl.generation.mode == "inprocess":
        seqs = rl.batch_size // world
        phases.append(
            (
                f"in-process sampling KV cache ({seqs} sequences)",
                seqs * (rl.max_prompt_length + rl.max_completion_length) * shape.kv_bytes_per_token * b,
            )
        )
    elif rl.generation.mode == "colocate":
        terms.append(("colocated vLLM share", int(rl.generation.gpu_memory_utilization * gpu_memory)))
    return host


def _volume_check(spec: RLTRunSpec, shapes: Shapes, stage_disk: dict[str, tuple[int, int]]) -> Check:
    """The run's volume at its fullest: every finished stage's kept bytes plus the running stage's peak."""
    # The volume at its fullest: every finished stage's kept bytes plus the running stage's peak.
    kept, best = 0, (-1, "", 0, 0)
    for stage, (extra, after) in stage_disk.items():
        if kept + extra > best[0]:
            best = (kept + extra, stage, kept, extra)
        kept += after
    if kept > best[0]:
        best = (kept, "the end", kept, 0)
    _, when, before, running = best
    moment = "at the end" if when == "the end" else f"during {when}"
    before_what = "of every stage" if when == "the end" else f"of the stages before {when}"
    terms = [(f"outputs {before_what} (models, last checkpoints, datasets)", before)]
    downloads = hub_downloads(spec, shapes)
    if downloads:
        terms.insert(0, ("hub models downloaded to the run's cache (HF_HOME on the volume)", downloads))
    if running:
        terms.append((f"{when} while it runs (checkpoints × retention, its model)", running))
    return Check(
        "all",
        f"run volume at its fullest ({moment})",
        terms,
        quantity_bytes(spec.storage.size),
        "storage.size" + (f" or stages.{when}.saveTotalLimit" if when in ("sft", "rl", "student") else ""),
    )


def node_gpus(spec: RLTRunSpec) -> int:
    """GPUs of one node: spec.scheduling.nodeSelector's nvidia.com/gpu.count when it selects by it, else 8."""
    count = spec.scheduling.node_selector.get(GPU_COUNT_LABEL)
    return int(count) if count is not None and count.isdigit() else DEFAULT_NODE_GPUS


def one_node_problems(spec: RLTRunSpec) -> list[str]:
    """A ReadWriteOnce volume mounts on one node only, so every pod of the run (the trainer gang and the vLLM
    generators beside it) must fit one node's GPUs; more never schedules, and the gang re-places forever."""
    if spec.storage.access_mode != "ReadWriteOnce" or spec.storage.existing_claim is not None:
        return []
    res = spec.resources
    trainer = res.trainer.nodes * res.trainer.gpus
    generators = res.generator.replicas * res.generator.gpus
    serves = any(needs_generators(spec, stage) for stage in spec.stages.enabled())
    need = trainer + (generators if serves else 0)
    have = node_gpus(spec)
    if need <= have:
        return []
    parts = f"trainer {res.trainer.nodes} × {res.trainer.gpus}" + (f" + generators {generators}" if serves else "")
    return [
        f"a ReadWriteOnce volume holds every pod of the run to one node, but the run asks for {need} GPUs ({parts}) "
        f"and a node has {have} ({GPU_COUNT_LABEL} in spec.scheduling.nodeSelector, else {DEFAULT_NODE_GPUS}); "
        f"change storage.accessMode: ReadWriteMany (a storage class that provides it) or fewer GPUs"
    ]


def hub_downloads(spec: RLTRunSpec, shapes: Shapes) -> int:
    """Bytes of the hub models the pods download into the run's Hugging Face cache, which lives on the run's volume
    (rlt_operator.builders: HF_HOME under the volume's cache folder): each distinct hub id once, its parameters in the
    dtype its config was saved in. Built-in models and local folders are not downloaded."""
    refs = {spec.teacher.model: shapes.teacher, spec.student.model: shapes.student}
    if spec.stages.student.enabled and spec.stages.student.model is not None:
        refs.setdefault(spec.stages.student.model.model, shapes.trained_student)
    return sum(
        shape.params * shape.saved_bytes
        for model, shape in refs.items()
        if shape is not None and not model.startswith(("builtin:", "/", "."))
    )


def _gpu_fix(stage: str, spec: RLTRunSpec) -> str:
    if stage == "rl":
        return (
            "resources.trainer.gpus/nodes (more ranks split ZeRO-3 states), stages.rl.maxCompletionLength, "
            "stages.rl.reward.maxBatchTokens or a GPU with more memory (--gpu-memory)"
        )
    return (
        f"resources.trainer.gpus/nodes, stages.{stage}.maxLength, stages.{stage}.deepspeedZeroStage "
        "or a GPU with more memory (--gpu-memory)"
    )


def dataset_rows(spec: RLTRunSpec) -> int | None:
    """Training rows, when they can be known without reading the data: limit, a built-in task's size, a local
    JSONL's lines, or a known hub dataset."""
    from pathlib import Path

    d = spec.dataset
    rows: int | None = None
    if d.source.startswith("builtin:"):
        rows = d.size
    elif Path(d.source).is_file() and d.source.endswith(".jsonl"):
        with Path(d.source).open("rb") as f:
            rows = sum(1 for line in f if line.strip())
    else:
        rows = KNOWN_DATASET_ROWS.get(d.source)
    if rows is not None and d.limit is not None:
        rows = min(rows, d.limit)
    if rows is None and d.limit is not None:
        rows = d.limit
    if rows is not None:
        rows = int(rows * (1 - d.eval_fraction))
    return rows


def stage_steps(spec: RLTRunSpec, stage: str, rows: int | None) -> int | None:
    st = stage_settings(spec, stage)
    if stage == "rl":
        return spec.stages.rl.steps
    if st.max_steps:
        return st.max_steps
    if rows is None or stage == "student":
        return None
    return math.ceil(math.ceil(rows / st.batch_size) * st.epochs)


def _trainer_disk(
    spec: RLTRunSpec, stage: str, shape: ModelShape, trainable: int, b: int, rows: int | None, plan: Plan
) -> tuple[int, int]:
    """(peak extra bytes while the stage runs, bytes it leaves) of a Trainer stage."""
    st = stage_settings(spec, stage)
    res = spec.resources.trainer
    world = res.nodes * max(1, res.gpus)
    one = checkpoint_bytes(shape, trainable, st.deepspeed_zero_stage, world, b)
    steps = stage_steps(spec, stage, rows)
    saves = None if steps is None else max(1, steps // st.save_steps + (steps % st.save_steps > 0))
    if st.save_total_limit is not None:
        held = st.save_total_limit + 1  # the Trainer writes the new checkpoint before it deletes the oldest
        held = held if saves is None else min(held, saves)
    elif saves is not None:
        held = saves
    else:
        plan.checks.append(
            Check(
                stage,
                "checkpoints on the volume",
                [("unbounded (saveTotalLimit unset, steps unknown)", 1)],
                0,
                f"stages.{stage}.saveTotalLimit",
            )
        )
        held = 0
    lora = trainable < shape.params
    model = saved_model_bytes(shape, st.deepspeed_zero_stage, world, b) + (trainable * 4 if lora else 0)
    # finished: the model, and the last checkpoint (rl: whole, others: without optimizer states)
    # a LoRA checkpoint holds the adapter only
    last_weights = trainable * 4 if lora else saved_model_bytes(shape, st.deepspeed_zero_stage, world, b)
    kept_ckpt = min(held, st.save_total_limit or held) * one if stage == "rl" else (last_weights if held else 0)
    return held * one + model, model + kept_ckpt


def _generated_bytes(spec: RLTRunSpec, stage: str, rows: int | None) -> int:
    if stage != "distill" or rows is None:
        return 0
    d = spec.stages.distill
    n = min(rows, d.limit or rows)
    return n * d.samples_per_question * d.max_new_tokens * CHARS_PER_TOKEN


def _generation_stage(spec: RLTRunSpec, stage: str, shapes: Shapes, gpu_memory: int, plan: Plan, gpu: bool) -> None:
    """distill/evaluate processes: the student (scoring) and, generating in process, the teacher and its KV cache."""
    terms: list[tuple[str, int]] = []
    if stage == "distill" and shapes.student is not None:
        sb = dtype_bytes(spec.student, gpu)
        cap = spec.stages.rl.reward.max_batch_tokens or scoring_token_cap(spec, shapes.student, gpu_memory, sb)
        terms += [
            ("reward student (scoring)", shapes.student.params * sb),
            (
                f"scoring micro-batch ({scoring_tokens(spec, cap)} tokens)",
                scoring_tokens(spec, cap) * scoring_bytes_per_token(shapes.student, sb),
            ),
        ]
    mode = spec.stages.rl.generation.mode if stage == "distill" else spec.stages.evaluate.generation.mode
    # evaluate tests the student stage's model, or the one it names (whose shape the plan does not read)
    if stage == "evaluate" and spec.stages.evaluate.model is not None:
        plan.notes.append(f"evaluate: {spec.stages.evaluate.model.model} (stages.evaluate.model) is not planned")
        return
    shape = shapes.teacher if stage == "distill" else shapes.student_stage(spec)
    if mode != "server" and shape is not None:
        b = dtype_bytes(spec.teacher if stage == "distill" else (spec.stages.student.model or spec.student), gpu)
        if stage == "distill":
            d = spec.stages.distill
            seqs, length = d.batch_size * d.samples_per_question, spec.stages.rl.max_prompt_length + d.max_new_tokens
        else:
            e = spec.stages.evaluate
            seqs, length = e.batch_size * e.samples, spec.stages.rl.max_prompt_length + e.max_new_tokens
        terms += [
            ("generating model", shape.params * b),
            (f"sampling KV cache ({seqs} × {length} tokens)", seqs * length * shape.kv_bytes_per_token * b),
        ]
    if not terms:
        return
    if gpu:
        terms.append(("CUDA context + NCCL (constant)", CUDA_OVERHEAD))
    plan.checks.append(
        Check(
            stage,
            "GPU memory per process",
            terms,
            gpu_memory if gpu else None,
            f"stages.{stage}.batchSize or resources.trainer.gpus",
        )
    )


def _generator_check(spec: RLTRunSpec, stage: str, shape: ModelShape, gpu_memory: int) -> Check:
    """A vLLM generator GPU: the weights of its tensor-parallel shard, vLLM's own working memory and the KV cache of
    at least one sequence of maxModelLen must fit in the share gpuMemoryUtilization gives vLLM; the rest of the
    share is KV cache, shown as concurrent sequences of maxModelLen."""
    gen, res = spec.stages.rl.generation, spec.resources.generator
    b = dtype_bytes(spec.teacher)
    tp = res.tensor_parallel_size
    share = int(gen.gpu_memory_utilization * gpu_memory)
    weights = shape.params * b // tp
    max_len = gen.max_model_len or shape.max_positions or 0
    per_seq = max_len * shape.kv_bytes_per_token * b // tp
    seqs = generator_kv_sequences(spec, shape, gpu_memory, max_len)
    check = Check(
        stage,
        f"vLLM generator GPU (KV cache for {seqs} sequences of {max_len} tokens at once)",
        [
            (f"weights (1/{tp} of the model)", weights),
            ("vLLM activations, CUDA graphs (constant)", VLLM_NON_KV),
            (f"KV cache of one sequence of maxModelLen {max_len}", per_seq),
        ],
        share,
        "resources.generator.tensorParallelSize, stages.rl.generation.gpuMemoryUtilization or "
        "stages.rl.generation.maxModelLen",
    )
    need = spec.stages.rl.max_prompt_length + spec.stages.rl.max_completion_length
    if max_len < min(need, shape.max_positions or need):
        check.note = f"maxModelLen {max_len} < maxPromptLength + maxCompletionLength {need}: long rows are cut"
    return check


def generator_kv_sequences(spec: RLTRunSpec, shape: ModelShape, gpu_memory: int, length: int) -> int:
    """Sequences of `length` tokens whose KV cache one vLLM engine holds at once: its gpuMemoryUtilization share of
    each of its tensorParallelSize GPUs, less the weights' shard and VLLM_NON_KV (the generator check's terms)."""
    tp = spec.resources.generator.tensor_parallel_size
    return kv_sequences(spec, shape, gpu_memory, length, tp, dtype_bytes(spec.teacher))


def generator_parallelism(
    spec: RLTRunSpec, shape: ModelShape, gpu_memory: int, prompts: PromptTokens | None
) -> tuple[str, str | None]:
    """The generators' tensor parallelism the plan chooses (rlt.checks.gpu_memory.tensor_parallel_choice: TP only
    when one GPU cannot hold the model and a KV cache of MIN_KV_SEQUENCES rows of the expected length), and a warning
    naming the values to set when the spec's differs. (line, warning or None)"""
    res, rl = spec.resources.generator, spec.stages.rl
    if res.gpus == 0:  # MIG slices named in extra: the plan does not know their memory
        return "generators: gpus 0 (MIG): their parallelism is not planned", None
    length = (prompts or default_prompts(spec)).mean + math.ceil(rl.max_completion_length * MEAN_COMPLETION_SHARE)
    b = dtype_bytes(spec.teacher)
    chosen = tensor_parallel_choice(spec, shape, gpu_memory, length, b)
    tp = res.tensor_parallel_size
    held = kv_sequences(spec, shape, gpu_memory, length, chosen or tp, b)
    engines = res.replicas * (res.gpus // chosen if chosen else res.data_parallel_size)
    if chosen is None:
        line = (
            f"generators: no tensor parallelism within {res.gpus} GPUs holds {spec.teacher.model} with a KV cache of "
            f"{MIN_KV_SEQUENCES} sequences of {length} tokens ({gib(gpu_memory)} GPUs)"
        )
        return line, None
    line = (
        f"generators: TP{chosen} x DP{res.gpus // chosen} chosen by the plan ({engines} engine(s)): {chosen} GPU(s) of "
        f"{gib(gpu_memory)} hold {spec.teacher.model} and a KV cache of {held} sequences of {length} tokens (prompt "
        f"+ mean completion; at least {MIN_KV_SEQUENCES} wanted); the spec has TP{tp} x DP{res.data_parallel_size}"
    )
    if tp == chosen:
        return line, None
    why = (
        "TP splits it for nothing: two all-reduces per layer per token, and half the engines' schedulers"
        if tp > chosen
        else "a smaller TP leaves too little KV cache for a full decode batch"
    )
    return line, (
        f"resources.generator.tensorParallelSize {tp}: {chosen} GPU(s) hold {spec.teacher.model} with a KV cache of "
        f"{held} sequences of {length} tokens; {why}. Set resources.generator.tensorParallelSize: {chosen}, "
        f"dataParallelSize: {res.gpus // chosen}"
    )


def distill_sequences_in_flight(
    spec: RLTRunSpec, shape: ModelShape | None, gpu_memory: int, prompt_tokens: int | None = None
) -> tuple[int, str]:
    """How many sequences (one request each) one distill rank keeps in flight, and why.

    Each generator engine decodes min(its KV capacity, vLLM's max-num-seqs) sequences at once; the trainer ranks share
    that evenly. A sequence counts its prompt (`prompt_tokens`: the rank's mean prompt; the plan, not knowing the
    rows, takes maxPromptLength) plus the expected completion, MEAN_COMPLETION_SHARE of maxNewTokens (the step-time
    estimate's assumption): vLLM allocates KV pages as tokens are made, so the expected length, not the longest,
    sets how many sequences share the cache. More in flight would wait in vLLM's queue or be preempted and
    recomputed; fewer leaves decode slots idle. The rank sends the next sequence as soon as one finishes
    (rlt.method.pipeline.as_completed), so the slots stay filled, not only at the start of a wave. Without the
    teacher's shape, max-num-seqs alone bounds it."""
    d, res = spec.stages.distill, spec.resources
    servers = max(1, res.generator.replicas * res.generator.data_parallel_size)
    ranks = res.trainer.nodes * max(1, res.trainer.gpus)
    prompt = spec.stages.rl.max_prompt_length if prompt_tokens is None else prompt_tokens
    length = prompt + math.ceil(d.max_new_tokens * MEAN_COMPLETION_SHARE)
    per_server = VLLM_MAX_NUM_SEQS
    why = f"vLLM's max-num-seqs {VLLM_MAX_NUM_SEQS}"
    if shape is not None:
        kv = generator_kv_sequences(spec, shape, gpu_memory, length)
        if kv < per_server:
            per_server, why = kv, f"a KV cache of {kv} sequences of {length} tokens ({gib(gpu_memory)} GPUs)"
    else:
        why += " (the teacher's shape is unknown: its KV cache is not counted)"
    k = max(1, per_server * servers // ranks)
    return k, (
        f"{k} sequence(s) in flight per rank, one request each, the next sent as one finishes: {servers} generator "
        f"engine(s) of {why} each, shared by {ranks} rank(s)"
    )


def plan_for_run(
    spec: RLTRunSpec, gpu_memory: int = DEFAULT_GPU_MEMORY, build: bool = True, prompts: PromptTokens | None = None
) -> Plan:
    """Read the models' shapes (rlt.checks.shapes: never downloads) and plan; what could not be read is a note.
    `prompts`: the teacher prompts' lengths where measured (rlt.cli.plan_command.measure_prompt_tokens)."""
    from rlt.checks.shapes import read_shape

    teacher, why_t = read_shape(spec.teacher, build)
    student, why_s = read_shape(spec.student, build)
    trained, why_d = read_shape(spec.stages.student.model, build) if spec.stages.student.model else (None, "")
    shapes = Shapes(teacher, student, trained)
    plan = plan_run(spec, shapes, gpu_memory, prompts=prompts)
    plan.notes[:0] = [why for why in (why_t, why_s, why_d) if why]
    plan.shapes = shapes
    return plan


def render(plan: Plan, name: str) -> str:
    """The plan as a table a platform engineer reads: one block per stage and resource, its terms, need / has."""
    lines = [f"{name}: capacity plan for {gib(plan.gpu_memory)} GPUs"]
    if plan.shapes is not None:
        roles = [("teacher", plan.shapes.teacher), ("student", plan.shapes.student)]
        roles += [("stages.student.model", plan.shapes.trained_student)] if plan.shapes.trained_student else []
        for role, shape in roles:
            if shape is not None:
                lines.append(f"  {role}: {shape.params / 1e9:.2f} B parameters ({shape.source})")
    for key, value in plan.values.items():
        lines.append(f"  derived: stages.{key} = {value}")
    width = 78
    lines.append(f"  {'stage':<9}{'resource / term':<{width}}{'need':>11}{'has':>11}")
    for c in plan.checks:
        verdict = "ok" if c.fits else "DOES NOT FIT"
        has = gib(c.limit) if c.limit is not None else "-"
        lines.append(f"  {c.stage:<9}{c.resource:<{width}}{gib(c.total):>11}{has:>11}  {verdict}")
        for term, size in c.terms:
            lines.append(f"  {'':<9}  {term[: width - 2]:<{width - 2}}{gib(size):>11}")
        for term, size in c.phases:  # one at a time: the largest counts
            lines.append(f"  {'':<9}  {('phase: ' + term)[: width - 2]:<{width - 2}}{gib(size):>11}")
        if c.note:
            lines.append(f"  {'':<9}  note: {c.note}")
    lines += [f"  note: {n}" for n in plan.notes]
    lines += [f"  stopping: {n}" for n in plan.stopping]
    lines += [f"  generation: {n}" for n in plan.generation]
    lines += [f"  goodput: {n}" for n in plan.goodput]
    lines += [f"  WARNING: {n}" for n in plan.warnings]
    return "\n".join(lines)


def capacity_problems(spec: RLTRunSpec) -> list[str]:
    """What `rlt validate` reports of the plan (spec_gpu_memory, built-in models not built): one line per misfit."""
    return [f"capacity: {line} (rlt plan)" for line in plan_for_run(spec, spec_gpu_memory(spec)[0], False).errors()]


def model_problems(spec: RLTRunSpec) -> tuple[list[str], list[str]]:
    """What the models' own configs say, where this machine can read them (rlt.checks.shapes: never downloads):
    vLLM's tensor parallelism must divide the teacher's attention heads, LoRA targets must be modules of the model.
    (problems, notes: what could not be checked and why)."""
    from rlt.checks.shapes import read_shape
    from rlt.spec.run import needs_generators

    problems: list[str] = []
    notes: list[str] = []
    tp = spec.resources.generator.tensor_parallel_size
    served = [s for s in spec.stages.enabled() if needs_generators(spec, s)]
    checks: list[tuple[str, Any]] = []
    if served and tp > 1:
        checks.append(("tp", spec.teacher))
    for where, ref in (("spec.teacher", spec.teacher), ("spec.stages.student.model", spec.stages.student.model)):
        if ref is not None and ref.lora is not None and ref.lora.target_modules != ["all-linear"]:
            checks.append((where, ref))
    for what, ref in checks:
        shape, why = read_shape(ref, build=False)
        if shape is None:
            notes.append(f"{ref.model}: not checked against its config ({why})")
            continue
        if what == "tp" and shape.heads % tp:
            problems.append(
                f"spec.resources.generator.tensorParallelSize: {tp} does not divide the {shape.heads} attention "
                f"heads of {ref.model} (vLLM needs it to); use one of "
                + ", ".join(str(d) for d in range(1, shape.heads + 1) if shape.heads % d == 0 and d <= 16)
            )
        elif what != "tp":
            modules = shape.modules
            missing = [t for t in ref.lora.target_modules if t.rsplit(".", 1)[-1] not in modules]
            if missing:
                linear = sorted({name for name, _, _ in shape.linears})
                problems.append(
                    f"{what}.lora.targetModules: {', '.join(missing)} not in {ref.model} (its linear modules: "
                    f"{', '.join(linear)}; or all-linear)"
                )
    return problems, notes
