"""The capacity plan of a run (`rlt plan`, `rlt validate`): for every enabled stage, per pod, what each process
needs on its GPU, what a trainer pod needs in host memory, what a generator's KV cache holds, and what the run's
volume holds at its fullest, each compared with what the spec gives it. Pure: spec + model shapes in, a Plan out.

Where a library estimates a term, its estimator is used: DeepSpeed's ZeRO-2/ZeRO-3 model-state estimators (GPU and
host memory), the model's own config for parameter counts (rlt.checks.shapes) and KV sizes. The rest is arithmetic
written out below with its assumptions; the CPU benchmark (benchmarks/capacity.py) measures it against real runs."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from rlt.checks.decode_tail import tail_line
from rlt.checks.distill_modes import distill_lines
from rlt.checks.goodput import goodput, goodput_line
from rlt.checks.gpu_figures import figures
from rlt.checks.gpu_memory import (
    DEFAULT_GPU_MEMORY,
    MIN_KV_SEQUENCES,
    VLLM_NON_KV,
    kv_sequences,
    spec_gpu_memory,
    tensor_parallel_choice,
)
from rlt.checks.model_shape import ModelShape, Shapes, dtype_bytes
from rlt.checks.plan_terms import (
    Check,
    Plan,
    PlanInputs,
    generator_kv_sequences,
    gib,
    lm_head_loss_bytes,
    scoring_token_cap,
    scoring_tokens,
    stage_terms,
    trl_constant,
)
from rlt.checks.rl_modes import mode_lines, variant
from rlt.checks.stage_terms.distill import distill_sequences_in_flight
from rlt.checks.stage_terms.rl import position_problems
from rlt.checks.step_time import (
    MEAN_COMPLETION_SHARE,
    PromptTokens,
    StepTime,
    default_prompts,
    every_layer_recomputed,
    preemption_notes,
    rank_imbalance,
    trainer_grace_period,
    trainer_step_times,
)
from rlt.contract.stage_registry import TRAINER_STAGES
from rlt.spec.k8s import quantity_bytes
from rlt.spec.resources import GPU_MEMORY_LABEL
from rlt.spec.run import RLTRunSpec, needs_generators
from rlt.spec.stages import generation, own_student, teacher_completion_tokens, teacher_prompt_tokens

# The plan's parts live where they are built (rlt.checks.gpu_memory: torch-free, the operator sizes the grace period
# from the rollout they bound; rlt.checks.plan_terms: the terms every stage's are made of; a stage's own terms in
# rlt.checks.stage_terms.<stage>); re-exported for the plan's callers (__all__ names the re-exports only: nothing
# star-imports this module, and its own names are public as before).
__all__ = [
    "DEFAULT_GPU_MEMORY",
    "GPU_MEMORY_LABEL",
    "VLLM_NON_KV",
    "Check",
    "Plan",
    "distill_sequences_in_flight",
    "generator_kv_sequences",
    "gib",
    "lm_head_loss_bytes",
    "scoring_token_cap",
    "scoring_tokens",
    "spec_gpu_memory",
    "trl_constant",
]
GPU_COUNT_LABEL = "nvidia.com/gpu.count"  # GPU feature discovery's label: GPUs of one node
DEFAULT_NODE_GPUS = 8  # an HGX/DGX node, when the run selects no node size
# Rows of hub datasets the examples use (dataset card): needed for step counts when the data is not local.
KNOWN_DATASET_ROWS = {"bespokelabs/Bespoke-Stratos-17k": 16710}


def plan_run(
    spec: RLTRunSpec,
    shapes: Shapes,
    gpu_memory: int = DEFAULT_GPU_MEMORY,
    gpu: bool = True,
    prompts: PromptTokens | None = None,
) -> Plan:
    """The plan of every enabled stage, each asked for its terms (rlt.checks.plan_terms.stage_terms). `gpu`: plan
    for GPUs (bf16 auto dtype, CUDA terms); False plans a CPU run (fp32 auto dtype), what the benchmark measures.
    `prompts`: the teacher prompts' measured lengths (the step time's default, rlt.checks.step_time.default_prompts,
    when None)."""
    plan = Plan(gpu_memory)
    res = spec.resources
    at = PlanInputs(gpu_memory, gpu, prompts, dataset_rows(spec))
    host_need = 0
    stage_disk: dict[str, tuple[int, int]] = {}  # stage -> (peak extra while running, kept after)
    for stage in spec.stages.enabled():
        planned = stage_terms(stage).plan(spec, shapes, at, plan)
        if planned is not None:
            host_need = max(host_need, planned.host)
            stage_disk[stage] = planned.disk
        if (
            needs_generators(spec, stage)
            and shapes.teacher is not None
            and not any(c.resource.startswith("vLLM generator") for c in plan.checks)  # one StatefulSet serves all
        ):
            plan.checks.append(_generator_check(spec, stage, shapes.teacher, gpu_memory))
            line, warning = generator_parallelism(spec, shapes.teacher, gpu_memory, prompts)
            plan.generation.append(line)
            plan.warnings += [warning] if warning else []
        plan.generation += planned.generation if planned is not None else []
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
        before = every_layer_recomputed(spec)  # the earlier plan checkpointed every layer
        olds = trainer_step_times(before, shapes, prompts=prompts, gpu_memory=gpu_memory)
        with_goodput = [t for t in times if not t.goodput_unknown]  # no figure rather than a wrong one
        plan.stage_goodput = {t.stage: goodput(t) for t in with_goodput}
        plan.goodput = [goodput_line(stage, g) for stage, g in plan.stage_goodput.items()]
        plan.goodput += [f"{t.stage}: goodput not planned: {t.goodput_unknown}" for t in times if t.goodput_unknown]
        plan.goodput += old_goodput_lines(
            before, shapes, [t for t in olds if not t.goodput_unknown], prompts, gpu_memory
        )
        plan.goodput += [tail_line(t.stage, t.decode) for t in times if t.decode]
        gen = generation(spec)
        if (
            any(t.stage == "rl" for t in with_goodput)
            and shapes.teacher is not None
            and gen.mode in ("server", "colocate")
        ):
            lines, warnings = mode_lines(spec, shapes, gpu_memory, prompts, node_gpus(spec))
            plan.goodput += lines
            plan.warnings += warnings
        if spec.stages.distill.enabled:
            plan.goodput += distill_lines(spec, shapes, gpu_memory, prompts, at.rows)
        plan.unplaceable = one_node_problems(spec)
        plan.figures = figures(spec).sources
    return plan


def old_goodput_lines(
    spec: RLTRunSpec, shapes: Shapes, times: list[StepTime], prompts: PromptTokens | None, gpu_memory: int
) -> list[str]:
    """Each stage's goodput in the terms of the plan before issue 51, for comparison: saves on the critical path,
    sft's rows dealt at random, rl's generators separate (mode server, overlap none) where the spec has them."""
    out = []
    for t in times:
        old, how = t, "saves on the critical path"
        if t.stage != "rl":  # sft, student: transformers' random sampler before rlt.stages.sft_balance
            old, how = replace(t, imbalance=rank_imbalance(t.trainer_gpus)), how + ", rows dealt at random"
        if t.stage == "rl" and generation(spec).mode == "server" and spec.resources.generator.gpus:
            separate = stage_terms("rl").step_time(variant(spec, "server", "none"), shapes, True, prompts, gpu_memory)
            old, how = separate or t, how + ", generators separate"
        out.append(goodput_line(old.stage, goodput(old, asynchronous=False), f" before ({how})"))
    return out


def _generator_check(spec: RLTRunSpec, stage: str, shape: ModelShape, gpu_memory: int) -> Check:
    """A vLLM generator GPU: the weights of its tensor-parallel shard, vLLM's own working memory and the KV cache of
    at least one sequence of maxModelLen must fit in the share gpuMemoryUtilization gives vLLM; the rest of the
    share is KV cache, shown as concurrent sequences of maxModelLen."""
    gen, res = generation(spec), spec.resources.generator
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
    need = teacher_prompt_tokens(spec) + teacher_completion_tokens(spec)
    if max_len < min(need, shape.max_positions or need):
        check.note = f"maxModelLen {max_len} < maxPromptLength + maxCompletionLength {need}: long rows are cut"
    return check


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
        "storage.size" + (f" or stages.{when}.saveTotalLimit" if when in TRAINER_STAGES else ""),
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
    own = own_student(spec, enabled=True)
    if own is not None:
        refs.setdefault(own.model, shapes.trained_student)
    return sum(
        shape.params * shape.saved_bytes
        for model, shape in refs.items()
        if shape is not None and not model.startswith(("builtin:", "/", "."))
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
    if rows is None:  # the size is unknown: the limit, if any, bounds the training rows
        return d.limit
    rows -= d.held_out_rows(rows)  # as rlt.data.dataset splits them: the held-out rows first, then the limit
    return min(rows, d.limit) if d.limit is not None else rows


def generator_parallelism(
    spec: RLTRunSpec, shape: ModelShape, gpu_memory: int, prompts: PromptTokens | None
) -> tuple[str, str | None]:
    """The generators' tensor parallelism the plan chooses (rlt.checks.gpu_memory.tensor_parallel_choice: TP only
    when one GPU cannot hold the model and a KV cache of MIN_KV_SEQUENCES rows of the expected length), and a warning
    naming the values to set when the spec's differs. (line, warning or None)"""
    res = spec.resources.generator
    if res.gpus == 0:  # MIG slices named in extra: the plan does not know their memory
        return "generators: gpus 0 (MIG): their parallelism is not planned", None
    length = (prompts or default_prompts(spec)).mean + math.ceil(
        teacher_completion_tokens(spec) * MEAN_COMPLETION_SHARE
    )
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
        used = tp * res.data_parallel_size
        if used == res.gpus:
            return line, None
        # more engines where the GPUs hold another; else the GPUs no engine of tp GPUs can use are not asked for
        fix = (
            f"resources.generator.dataParallelSize: {res.gpus // tp}"
            if res.gpus // tp > res.data_parallel_size
            else f"resources.generator.gpus: {used}"
        )
        return line, (
            f"resources.generator.dataParallelSize {res.data_parallel_size}: vLLM runs on tensorParallelSize × "
            f"dataParallelSize = {used} of each generator pod's {res.gpus} GPUs; {res.gpus - used} hold no engine. "
            f"Set {fix}"
        )
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


def plan_for_run(
    spec: RLTRunSpec, gpu_memory: int = DEFAULT_GPU_MEMORY, build: bool = True, prompts: PromptTokens | None = None
) -> Plan:
    """Read the models' shapes (rlt.checks.shapes: never downloads) and plan; what could not be read is a note.
    `prompts`: the teacher prompts' lengths where measured (rlt.cli.plan_command.measure_prompt_tokens)."""
    from rlt.checks.shapes import run_shapes

    shapes, unread = run_shapes(spec, build)
    plan = plan_run(spec, shapes, gpu_memory, prompts=prompts)
    plan.notes[:0] = unread
    plan.shapes = shapes
    return plan


def render(plan: Plan, name: str) -> str:
    """The plan as a table a platform engineer reads: one block per stage and resource, its terms, need / has."""
    lines = [f"{name}: capacity plan for {gib(plan.gpu_memory)} GPUs"]
    lines += [f"  figures: {key}: {value}" for key, value in plan.figures.items()]
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
    lines += [f"  checkpointing: {n}" for n in plan.checkpointing]
    lines += [f"  stopping: {n}" for n in plan.stopping]
    lines += [f"  generation: {n}" for n in plan.generation]
    lines += [f"  goodput: {n}" for n in plan.goodput]
    lines += [f"  WARNING: {n}" for n in plan.warnings]
    return "\n".join(lines)


def plan_document(plan: Plan, file: str, run: str) -> dict[str, Any]:
    """The plan as `rlt plan -o json` prints it: what render shows, with sizes in bytes, times in seconds and shares
    as fractions, for a pipeline to read (e.g. to refuse a run whose rl goodput is under a bar)."""

    def check(c: Check) -> dict[str, Any]:
        return {
            "stage": c.stage,
            "resource": c.resource,
            "needBytes": c.total,
            "hasBytes": c.limit,
            "fits": c.fits,
            "change": c.fix,
            "terms": [{"term": term, "bytes": size} for term, size in c.terms],
            "phases": [{"term": term, "bytes": size} for term, size in c.phases],
            "note": c.note,
        }

    return {
        "file": file,
        "run": run,
        "gpuMemoryBytes": plan.gpu_memory,
        "fits": not (plan.failures or plan.unplaceable or plan.problems),
        "errors": plan.errors(),
        "warnings": list(plan.warnings),
        "checks": [check(c) for c in plan.checks],
        "goodput": {
            stage: {
                "share": g.share,
                "strict": g.strict,
                "stepSeconds": g.period,
                "gpus": g.gpus,
                "losses": [{"cause": cause, "share": share} for cause, share in g.losses],
            }
            for stage, g in plan.stage_goodput.items()
        },
        "derived": {f"stages.{key}": value for key, value in plan.values.items()},
        "figures": dict(plan.figures),
        "lines": {
            "goodput": list(plan.goodput),
            "stopping": list(plan.stopping),
            "generation": list(plan.generation),
            "checkpointing": list(plan.checkpointing),
            "notes": list(plan.notes),
        },
    }


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
    if served:
        checks.append(("positions", spec.teacher))
    for where, ref, _ in spec.named_models():  # LoRA is refused where no stage trains the model
        if ref.lora is not None and ref.lora.target_modules != ["all-linear"]:
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
        elif what == "tp" and not _kv_heads_split(shape.kv_heads, tp):
            problems.append(
                f"spec.resources.generator.tensorParallelSize: {tp} and the {shape.kv_heads} key/value heads of "
                f"{ref.model} do not divide one another (vLLM shards or replicates KV heads only so); use one of "
                + ", ".join(str(d) for d in range(1, 17) if shape.heads % d == 0 and _kv_heads_split(shape.kv_heads, d))
            )
        elif what == "positions":
            problems += position_problems(spec, shape)
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


def _kv_heads_split(kv_heads: int, tp: int) -> bool:
    """vLLM's rule for a tensor-parallel size: it divides the KV heads (each rank holds some) or they divide it (each
    head replicated on tp / kv ranks)."""
    return kv_heads % tp == 0 if kv_heads >= tp else tp % kv_heads == 0
