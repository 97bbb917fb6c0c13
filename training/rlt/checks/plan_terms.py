"""The parts a stage's plan terms are built from (rlt.checks.stage_terms.<stage>), and the one protocol each stage's
terms follow: the plan's checks and their totals, the memory of a model's states, activations, TRL's loss tiles and
the reward's scoring, a step's phases. The capacity plan (rlt.checks.capacity) and the step time
(rlt.checks.step_time) loop over the stage table and ask each enabled stage for its terms (`stage_terms`); nothing
here or there branches on a stage's name.

Where a library estimates a term, its estimator is used: DeepSpeed's ZeRO-2/ZeRO-3 model-state estimators (GPU and
host memory; written out torch-free in rlt.checks.zero_estimates, held equal to DeepSpeed's by a test), the model's own config for parameter counts (rlt.checks.shapes) and KV sizes."""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Protocol

from rlt.checks.decode_tail import Rollout
from rlt.checks.gpu_memory import GiB, kv_sequences
from rlt.checks.model_shape import ModelShape, Shapes, dtype_bytes
from rlt.contract.stage_registry import stage_info
from rlt.spec.run import RLTRunSpec
from rlt.spec.stages import reward_settings, teacher_completion_tokens, teacher_prompt_tokens

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


@dataclass(frozen=True)
class Goodput:
    """A Trainer stage's goodput (rlt.checks.goodput computes it from the stage's StepTime)."""

    share: float  # useful work (algorithm's) over held GPU-seconds
    strict: float  # the update and the decoding only
    losses: list[tuple[str, float]]  # by cause, shares of the held GPU-seconds, largest first
    period: float  # seconds of one optimizer step with its share of the saves
    gpus: int


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
    stage_goodput: dict[str, Goodput] = field(default_factory=dict)  # the figures of each stage's first goodput line
    unplaceable: list[str] = field(default_factory=list)  # pods no node set can hold (one line each, the fix named)
    warnings: list[str] = field(default_factory=list)  # settings that cost GPU-hours, with the value to set
    figures: dict[str, str] = field(default_factory=dict)  # the GPU figures the times use, with their sources
    checkpointing: list[str] = field(default_factory=list)  # per Trainer stage: the layers checkpointed, and why
    problems: list[tuple[str, str]] = field(default_factory=list)  # (stage, a setting its model contradicts)

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if not c.fits]

    def errors(self, stages: tuple[str, ...] | None = None) -> list[str]:
        """One line per resource that cannot fit (of `stages` only, when given), naming the field to change; the
        run's placement problems concern every stage."""
        return (
            [
                f"{c.stage}: {c.resource} needs {gib(c.total)} but has {gib(c.limit or 0)}; change {c.fix}"
                for c in self.failures
                if stages is None or c.stage in stages
            ]
            + [f"{stage}: {line}" for stage, line in self.problems if stages is None or stage in stages]
            + [f"all: {line}" for line in self.unplaceable]
        )

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

    One process or ZeRO 0: no DeepSpeed, so the whole model trains in fp32 (rlt.stages.trainer.master_fp32: weights,
    gradient and two Adam moments, 16 bytes per parameter); with LoRA the frozen base stays in b bytes and PEFT keeps
    the adapter in fp32 (16 bytes per trainable parameter).
    ZeRO 1/2/3: DeepSpeed's estimators for the trainable parameters (mixed precision: 18 bytes per parameter split
    over the ranks, plus the 16-bit copy for ZeRO 1/2 or the largest layer gathered for ZeRO 3); frozen parameters
    (LoRA's base) in 16 bit, partitioned by ZeRO 3. Host: the estimators' start-up memory (each rank loads the
    model before DeepSpeed partitions it)."""
    frozen = shape.params - trainable
    world = nodes * gpus
    lora = trainable < shape.params
    if world <= 1 or zero == 0:
        if lora:
            return shape.params * b + trainable * 16, shape.params * b, "no DeepSpeed (one process or ZeRO 0), LoRA"
        return shape.params * 16, shape.params * 4, "no DeepSpeed (one process or ZeRO 0): fp32 master weights"
    from rlt.checks.zero_estimates import zero2_states, zero3_states

    if zero == 3:
        host, gpu = zero3_states(trainable, min(trainable, shape.largest_param), gpus, nodes)
        return gpu + frozen * b // world, host, "DeepSpeed estimate_zero3_model_states_mem_needs"
    host, gpu = zero2_states(trainable, gpus, nodes)
    return gpu + frozen * b, host, f"DeepSpeed estimate_zero2_model_states_mem_needs (ZeRO {zero})"


def layer_bytes_per_token(shape: ModelShape, b: int) -> int:
    """Activations one decoder layer keeps for the backward pass, per token, in the compute dtype (b bytes): six
    hidden-wide tensors (the norms' outputs, q, the attention's output and o_proj's input), k and v, the MLP's gate,
    up, activation and down input; in fp32 whatever the dtype: the two RMS norms' inputs (transformers' RMSNorm
    computes in fp32), their rsqrt, and the attention's log-sum-exp per head (flash/SDPA attention: no length²
    term). tests/training/test_checkpoint_layers.py holds it equal to the bytes autograd saves for a Qwen2 decoder
    layer, bf16 and fp32 (Qwen2.5-7B in bf16: 225,400 bytes, 31.4 × hidden × 2)."""
    kv = shape.kv_heads * shape.head_dim
    return b * (6 * shape.hidden + 2 * kv + 4 * shape.intermediate) + 4 * (2 * shape.hidden + 2 + shape.heads)


@lru_cache(maxsize=8)
def trl_constant(module: str, name: str) -> int:
    """An integer constant of the installed TRL, read from the module's source: importing trl.trainer.utils imports
    all of TRL, 3 s more in every trainer pod's preflight."""
    import ast
    import importlib.util
    from pathlib import Path

    # find_spec of a submodule imports its package (all of TRL's __init__): locate the package only, then the file
    top, *rest = module.split(".")
    found = importlib.util.find_spec(top)
    if found is None or found.origin is None:
        raise LookupError(f"{module} is not installed: the capacity plan reads the loss tile sizes from TRL")
    source = Path(found.origin).parent.joinpath(*rest[:-1], rest[-1] + ".py") if rest else Path(found.origin)
    for node in ast.parse(source.read_text()).body:
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


def selective_bytes_per_token(shape: ModelShape, b: int) -> int:
    """Activations a selectively checkpointed decoder layer keeps per token (rlt.stages.checkpoint_layers.
    selective_policy: the outputs of its matmuls and of its attention, the rest recomputed): its input, q, k, v,
    the attention's output and log-sum-exp (fp32 per head), o_proj's, the MLP's gate and up and down_proj's output.
    tests/training/test_checkpoint_layers.py holds it equal to what torch's selective checkpoint caches for a Qwen2
    decoder layer (Qwen2.5-7B in bf16: 113,776 bytes, half of layer_bytes_per_token's)."""
    kv = shape.kv_heads * shape.head_dim
    return b * (5 * shape.hidden + 2 * kv + 2 * shape.intermediate) + 4 * shape.heads


def selective_recompute_bytes_per_token(shape: ModelShape, b: int) -> int:
    """Bytes a selectively checkpointed decoder layer's recompute reads and writes per token: the ops between its
    cached matmuls, each memory-bound. Each RMS norm squares, averages and scales in fp32 (20 × hidden; in a 16-bit
    dtype also the upcast and the downcast, 8 × hidden + 2 × b × hidden) and multiplies by its weight; the rotary
    embedding of q and of k (mul, neg, cat, mul, add: 10 × their width × b, and the cos/sin tables); the attention's
    residual add; the MLP's SiLU and product. tests/training/test_checkpoint_layers.py holds it within 2 % of the
    ops a Qwen2 layer's recompute runs, bf16 and fp32."""
    kv, h = shape.kv_heads * shape.head_dim, shape.hidden
    norm = 20 * h + (8 * h + 2 * b * h if b < 4 else 0) + 2 * b * h
    rotary = 10 * b * (h + kv) + 4 * b * shape.head_dim
    return 2 * norm + rotary + 3 * b * h + 5 * b * shape.intermediate


def activations(shape: ModelShape, rows: int, length: int, kept: int, b: int, selective: int = 0) -> int:
    """Training activations of one micro-batch whose last `kept` decoder layers keep their activations, the
    `selective` before them keep their matmuls' and attention's outputs (selective_bytes_per_token) and the others
    are checkpointed (kept = layers: no checkpointing; rlt.checks.checkpoint_layers): each checkpointed layer's
    input, each selective layer's outputs, each kept layer's whole activations, and one layer recomputed in the
    backward pass. The kept layers are the last ones, so the backward frees theirs before it recomputes the first
    checkpointed layer: the peak holds max(kept, 1) layers' whole activations (the loss is lm_head_loss_bytes)."""
    kept = min(max(kept, 0), shape.layers)
    selective = min(max(selective, 0), shape.layers - kept)
    per_layer = rows * length * layer_bytes_per_token(shape, b)
    inputs = rows * length * shape.hidden * b * (shape.layers - kept - selective)
    cached = rows * length * selective_bytes_per_token(shape, b) * selective
    return inputs + cached + per_layer * max(kept, 1 if shape.layers else 0)


def scoring_bytes_per_token(shape: ModelShape, b: int) -> int:
    """A scored position under no_grad: one layer's transients (norm, q/k/v, MLP) and the shared prompt's KV cache
    copied per row (rlt.method.scoring); the head runs on 128-row chunks, a constant."""
    kv = shape.kv_heads * shape.head_dim
    return b * (shape.kv_bytes_per_token + 2 * shape.hidden + 2 * kv + 3 * shape.intermediate)


def scoring_token_cap(spec: RLTRunSpec, shape: ModelShape, gpu_memory: int, dtype_bytes: int) -> int:
    """Default scoring micro-batch cap (reward.maxBatchTokens): SCORING_SHARE of the GPU over the student's bytes
    per scored token, at least one full row (prompt + completion)."""
    return max(
        teacher_prompt_tokens(spec) + teacher_completion_tokens(spec),
        int(SCORING_SHARE * gpu_memory) // (scoring_bytes_per_token(shape, dtype_bytes)),
    )


def scoring_tokens(spec: RLTRunSpec, cap: int) -> int:
    """Positions of the largest scoring micro-batch: at most reward.batchSize rows of full length and at most the
    token cap (rlt.method.scoring.Scorer batches by both)."""
    row = teacher_prompt_tokens(spec) + teacher_completion_tokens(spec)
    return min(cap, reward_settings(spec).batch_size * row)


def generator_kv_sequences(spec: RLTRunSpec, shape: ModelShape, gpu_memory: int, length: int) -> int:
    """Sequences of `length` tokens whose KV cache one vLLM engine holds at once: its gpuMemoryUtilization share of
    each of its tensorParallelSize GPUs, less the weights' shard and VLLM_NON_KV (the generator check's terms)."""
    tp = spec.resources.generator.tensor_parallel_size
    return kv_sequences(spec, shape, gpu_memory, length, tp, dtype_bytes(spec.teacher))


# --------------------------------------------------------------------------- a step (rlt.checks.step_time)


@dataclass(frozen=True)
class PromptTokens:
    """The teacher's prompt in tokens: the mean and the longest, and where the figures come from."""

    mean: int
    longest: int
    source: str


@dataclass(frozen=True)
class StepTime:
    """One optimizer step of a Trainer stage, phase by phase (seconds), and one save."""

    stage: str
    micro_batches: int  # per rank per step
    update_work: float  # forward and backward at balanced ranks, without recompute
    recompute: float  # gradient checkpointing's second forward, at balanced ranks
    imbalance: float  # rank_imbalance of the trainer's world
    longest_micro: float  # one micro-batch of rows of the longest allowed length
    save: float  # seconds to write one checkpoint and exit
    save_steps: int
    trainer_gpus: int
    generator_gpus: int = 0  # GPUs of the vLLM generators held beside the trainer (server mode)
    engine_gpus: int | None = None  # of those, the ones vLLM runs on (tp × dp per replica); None: all of them
    goodput_unknown: str = ""  # why the stage's goodput is not planned ("" when it is)
    throughput_bound: float = 0.0  # the completion tokens over the sequences decoded at once
    longest_bound: float = 0.0  # the longest allowed completion, one sequence's decode
    busy_generation: float = 0.0  # the rollout's token work were every decode slot full (goodput's useful part)
    transfer: float = 0.0  # the policy's weights to the generators
    scoring: float = 0.0  # the reward's student forward
    passes_work: float = 0.0  # the reference forward (beta > 0), at balanced ranks
    passes_name: str = "reference pass"  # the ones this step runs
    reads_prompts: bool = False  # its rows are the teacher's prompts (PromptTokens) plus completions
    save_local: float = 0.0  # a periodic save's write to the pod's local disk: what it blocks
    staged_saves: bool = True  # saves go to local storage first (resources.trainer.localCheckpoints.enabled)
    local_bytes: int = 0  # the first trainer pod's share of one checkpoint: what its local volume holds
    durable_copy: float = 0.0  # the background copy of a save to the run's volume
    one_step_off: bool = False  # the next step's rollout runs while this step scores, passes and updates
    partial_rollouts: bool = False  # two steps' rollouts in flight, held through the push: the slots stay full
    kv_recompute: float = 0.0  # partial rollouts: an engine recomputing its running rows' KV cache after a push
    engine_switch: float = 0.0  # colocated: waking the vLLM engine before the rollout, putting it to sleep after
    decode: Rollout | None = None  # the rollout's decoding step by step (rlt.checks.decode_tail), an engine's
    row_tokens: tuple[float, float] = (0.0, 0.0)  # (mean, longest) tokens of the step's rows
    imbalance_source: str = "rlt.checks.step_time.IMBALANCE_PER_DOUBLING"  # where `imbalance` comes from

    @property
    def generating(self) -> float:
        """The rollout's decoding: the step-by-step estimate where the stage has one, else the longer of the
        throughput and the longest-completion bounds."""
        if not self.longest_bound:
            return 0.0
        return self.decode.seconds if self.decode else max(self.throughput_bound, self.longest_bound)

    @property
    def rollout(self) -> float:
        return self.generating + self.transfer + self.engine_switch if self.longest_bound else 0.0

    @property
    def trainer_phases(self) -> float:
        """What the trainer GPUs do after the rollout: scoring, passes, update."""
        return self.scoring + self.passes + self.update

    @property
    def passes(self) -> float:
        return self.passes_work * self.imbalance

    @property
    def update(self) -> float:
        return (self.update_work + self.recompute) * self.imbalance

    @property
    def before_update(self) -> float:
        """The phases before a step's first micro-batch: rollout, scoring, reference pass."""
        return self.rollout + self.scoring + self.passes

    @property
    def decoding_held(self) -> float:
        """Seconds of a step the generators decode: the rollout's decoding; with partial rollouts the step's
        tokens at full slots (the next rollout's rows fill a finishing one's empty slots) plus the KV recompute
        after the push."""
        if self.partial_rollouts:
            return self.busy_generation + self.kv_recompute
        return self.generating

    @property
    def step(self) -> float:
        """One optimizer step: the phases in turn; one step off, the longer of the decoding and the trainer's
        phases, then the weight transfer (neither side can start the next step before it). With partial rollouts
        the decoding is `decoding_held`, and a rollout decoded alone must end within the two steps it has."""
        if self.partial_rollouts and self.rollout:
            return max(self.decoding_held, self.trainer_phases, self.generating / 2) + self.transfer
        if self.one_step_off and self.rollout:
            return max(self.generating, self.trainer_phases) + self.transfer
        return self.before_update + self.update

    def save_blocked(self, asynchronous: bool) -> float:
        """Seconds one periodic save holds the training loop: the local write, plus the wait for the previous
        durable copy when it outlasts saveSteps steps (`asynchronous`); else the whole write to the volume (not the
        ranks' exit that a stop's save adds: `save`)."""
        if not asynchronous or not self.staged_saves:
            return self.durable_copy
        return self.save_local + max(0.0, self.durable_copy - self.save_steps * self.step)

    @property
    def grace(self) -> int:
        """The grace period a stop needs: every phase before the first micro-batch, one micro-batch of the longest
        allowed rows, and a save (the module's docstring says why a sum)."""
        return math.ceil(self.before_update - self.rollout + self.grace_rollout + self.longest_micro + self.save)

    @property
    def grace_rollout(self) -> float:
        """The rollout a stop may wait for: its decoding at least the earlier bounds (a grace period errs long)."""
        bound = max(self.throughput_bound, self.longest_bound)
        return self.rollout + max(0.0, bound - self.generating) if self.rollout else 0.0


# --------------------------------------------------------------------------- a stage's terms


@dataclass(frozen=True)
class PlanInputs:
    """What the plan gives every stage: the GPU's memory, a GPU or a CPU run (dtype, CUDA terms), the teacher
    prompts' measured lengths (None: not measured) and the training rows (None: unknown)."""

    gpu_memory: int
    gpu: bool
    prompts: PromptTokens | None
    rows: int | None


@dataclass
class StagePlan:
    """What a stage's plan gives back beside the checks it adds to the Plan."""

    host: int  # host bytes of a trainer pod while the stage loads its models
    disk: tuple[int, int]  # (bytes at its fullest while it runs, bytes it keeps after)
    generation: list[str] = field(default_factory=list)  # lines for Plan.generation, after the generators' line


class StageTerms(Protocol):
    """A stage's plan terms: what its pods need (memory, disk) and what its step costs (the grace period a stop
    needs, the collective timeouts rlt.spec.budgets sizes from the stage's settings model)."""

    def plan(self, spec: RLTRunSpec, shapes: Shapes, at: PlanInputs, plan: Plan) -> StagePlan | None:
        """Add the stage's checks (and notes) to `plan`; None when the stage plans nothing (a note says why)."""
        ...

    def step_time(
        self, spec: RLTRunSpec, shapes: Shapes, gpu: bool, prompts: PromptTokens | None, gpu_memory: int | None
    ) -> StepTime | None:
        """One optimizer step and one save of the stage; None for a stage without a Trainer or an unknown shape."""
        ...

    def step_models(self, spec: RLTRunSpec) -> set[str]:
        """The models whose shapes step_time reads (empty: no step time)."""
        ...


def stage_terms(name: str) -> StageTerms:
    """The plan terms of stage `name`: the TERMS of the module its table row names (StageInfo.terms_module), imported
    on first use."""
    module = stage_info(name).terms_module
    terms: StageTerms | None = getattr(importlib.import_module(module), "TERMS", None)
    if terms is None:
        raise LookupError(f"{module} has no TERMS: the plan terms of stage {name!r} (rlt.checks.plan_terms)")
    return terms


def generation_check(stage: str, terms: list[tuple[str, int]], at: PlanInputs, samples: str) -> Check:
    """The GPU of a process that generates or scores without a Trainer (distill, evaluate): `terms` plus CUDA's. The
    fix names what sizes one process's sampling: the sequences at once (batchSize × `samples`, the stage's field of
    samples per row) and their length; more GPUs do not shrink a process."""
    if at.gpu:
        terms = [*terms, ("CUDA context + NCCL (constant)", CUDA_OVERHEAD)]
    return Check(
        stage,
        "GPU memory per process",
        terms,
        at.gpu_memory if at.gpu else None,
        f"stages.{stage}.batchSize × {samples} (the sequences sampled at once) or maxNewTokens",
    )


def sampling_terms(shape: ModelShape, b: int, seqs: int, length: int) -> list[tuple[str, int]]:
    """A model generating in process: its weights and the KV cache of `seqs` sequences of `length` tokens."""
    return [
        ("generating model", shape.params * b),
        (f"sampling KV cache ({seqs} × {length} tokens)", seqs * length * shape.kv_bytes_per_token * b),
    ]
