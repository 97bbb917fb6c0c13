"""Selective gradient checkpointing in the trainer: after the Trainer turns gradient checkpointing on for every
decoder layer, the last `uncheckpointedLayers` of them (the plan's choice when unset: rlt.checks.checkpoint_layers)
keep their activations and are not recomputed.

transformers 5 checkpoints each decoder layer that is a `GradientCheckpointingLayer` (modeling_layers): its
wrapped `forward` runs under `_gradient_checkpointing_func` while the layer's `gradient_checkpointing` attribute is
true, which `_set_gradient_checkpointing` sets on every such layer when `Trainer.train` calls
`activation_checkpointing_enable`. Setting the attribute false on a layer makes its forward keep its activations
for the backward pass, as without checkpointing. transformers' own `every_n_layers` cannot say "N layers": it
spaces the checkpointed layers evenly. The kept layers are the last ones: the backward reaches them first and frees
their activations before it recomputes the first checkpointed layer, so the peak holds one layer less
(rlt.checks.plan_terms.activations).

Where the plan chooses (uncheckpointedLayers unset, on a GPU, ZeRO 0-2: under ZeRO-3 a changing recompute would
turn DeepSpeed's parameter prefetch off), its count is sized for the stage's longest micro-batch; a shorter one
keeps more layers in the same room (rlt.checks.checkpoint_layers.LayerSchedule).
`PerMicroBatch`, a forward pre-hook on the trained model, sets the count before each forward of the update from the
micro-batch's tokens, the fewest any rank's schedule allows (one collective of one integer per micro-batch).
Under ZeRO-3 the count is one for every micro-batch, and the plan may make some checkpointed layers selective
(`checkpoint_selectively`: torch's selective activation checkpointing keeps their matmuls' and attention's outputs
and recomputes only the ops between; the same modules run in the recompute, so DeepSpeed's prefetch order holds)."""

from __future__ import annotations

from dataclasses import replace
from functools import cache, partial
from typing import TYPE_CHECKING, Any

from rlt.checks.checkpoint_layers import LayerChoice, LayerSchedule, choose, field_name
from rlt.spec.run import RLTRunSpec, stage_settings

if TYPE_CHECKING:
    import torch
    from torch.utils.hooks import RemovableHandle
    from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
    from transformers.modeling_layers import GradientCheckpointingLayer


def decoder_layers(model: torch.nn.Module) -> list[GradientCheckpointingLayer]:
    """The model's layers transformers checkpoints one by one (GradientCheckpointingLayer), in forward order."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    return [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]


def keep_activations(model: torch.nn.Module, kept: int, stage: str) -> list[GradientCheckpointingLayer]:
    """Turn gradient checkpointing off on the last `kept` decoder layers of a model it is on for; the layers kept.
    ValueError naming the stage's uncheckpointedLayers for more layers than the model has."""
    layers = decoder_layers(model)
    if kept > len(layers):
        raise ValueError(
            f"{field_name(stage)}: {kept} is more than the {len(layers)} decoder layers of the stage's model; at most "
            f"{len(layers)}, or unset for the plan's choice"
        )
    chosen = layers[len(layers) - kept :]
    for layer in chosen:
        layer.gradient_checkpointing = False  # the flag GradientCheckpointingLayer's wrapped forward reads
    return chosen


def keeps_output(op: Any) -> bool:
    """The ops whose outputs a selective layer keeps: the matmuls (a linear layer's is mm or addmm once flattened)
    and the attention kernels (SDPA's every backend, flash-attn's op): the work that costs FLOPs to recompute. The
    ops between them (norms, rotary, SiLU, adds) are memory-bound and recomputed. Not bmm: eager attention's q·kᵀ
    is one, a length² tensor the plan's bytes (flash/SDPA attention) do not hold; eager attention recomputes it."""
    import torch

    name = str(op)
    return op in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default) or (
        "scaled_dot_product" in name or "flash_attn" in name
    )


def selective_policy() -> Any:
    """torch.utils.checkpoint's policy for one selective checkpoint: keep what keeps_output names, and an in-place
    op that writes into a kept output. DeepSpeed ZeRO-3's linear (zero3_linear_wrap, memory_efficient_linear on by
    default) adds the bias in place to its matmul's output, which the cache shares; re-run in the recompute, the add
    would find the bias already there and add it twice. Kept, the recompute takes both as the forward left them,
    which is right only if nothing read the output between the matmul and the write: a RuntimeError naming the ops
    otherwise, never a silently wrong gradient. An in-place op that only reads a kept output (writing elsewhere) is
    recomputed like any other: kept, the recompute would hand back its result without writing it into the tensor
    later ops read. Stateful (the kept outputs' storages), so one per checkpoint call; torch's own check on cached
    tensors is off (selective_contexts), for these writes are that check's case."""
    import torch
    from torch.utils._pytree import tree_leaves
    from torch.utils.checkpoint import CheckpointPolicy

    read: dict[int, str] = {}  # a kept output's storage -> "" or the first op that read it after it was kept
    aliases = (torch.ops.aten._unsafe_view.default, torch.ops.aten.detach.default)

    def storages(values: Any) -> set[int]:
        # an empty tensor's storage has no address (0, every one alike): it holds nothing to keep or write into
        return {
            t.untyped_storage().data_ptr()
            for t in tree_leaves(values)
            if isinstance(t, torch.Tensor) and t.untyped_storage().nbytes()
        }

    def written(op: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> set[int]:
        """The storages `op` writes in place (its schema's arguments marked `(a!)`), of the kept outputs."""
        schema = getattr(op, "_schema", None)
        if schema is None or not schema.is_mutable:
            return set()
        values = [
            kwargs[a.name] if a.name in kwargs else args[i] if i < len(args) else None
            for i, a in enumerate(schema.arguments)
            if a.alias_info is not None and a.alias_info.is_write
        ]
        return storages(values) & read.keys()

    def policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
        if ctx.is_recompute:
            return CheckpointPolicy.PREFER_RECOMPUTE  # the cached mode follows what the caching one stored
        into = written(op, args, kwargs)
        if into:
            readers = sorted({read[s] for s in into if read[s]})
            if readers:
                raise RuntimeError(
                    f"selective checkpointing: {op} writes in place into a kept output that {', '.join(readers)} "
                    "read first; the recompute cannot reproduce that order. Set the stage's uncheckpointedLayers "
                    "(no selective layers) and report the model"
                )
            return CheckpointPolicy.MUST_SAVE
        if keeps_output(op):
            read.update(dict.fromkeys(storages(ctx.op_output), ""))
            return CheckpointPolicy.MUST_SAVE
        touched = storages((args, kwargs)) & read.keys()
        if touched and not op.is_view and op not in aliases:
            for s in touched:
                read[s] = read[s] or str(op)
        return CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def selective_contexts() -> Any:
    """The context_fn of a selective layer's checkpoint: torch's caching mode for the forward, with rlt's policy and
    its mutation check off (selective_policy keeps the in-place writes into kept outputs itself), and for the
    recompute a lenient copy of torch's cached mode (lenient_recompute)."""
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    caching, cached = create_selective_checkpoint_contexts(  # type: ignore[no-untyped-call]
        selective_policy(), allow_cache_entry_mutation=True
    )
    return caching, lenient_recompute(cached)


def lenient_recompute(cached: Any) -> Any:
    """torch's cached mode (the recompute's side of selective checkpointing) for `cached`'s storage, except that an op
    of a kind the forward never kept runs when the forward recorded fewer of it (LenientRecompute)."""
    return lenient_recompute_mode()(None, cached.storage, cached.allow_cache_entry_mutation)


@cache
def lenient_recompute_mode() -> type:
    """LenientRecompute: torch pairs every op of the recompute with the forward's by kind and count and raises on one
    more; under DeepSpeed ZeRO-3 the parameter gathers, allocations and slices a layer's hooks run inside the
    checkpoint fall differently in the forward and in the recompute, as its prefetch did (benchmarks/zero3_trace.py,
    two gloo ranks). Those ops were stored as "recompute" anyway. A kind with a kept output (a matmul, an in-place
    write into a kept output) stays strictly paired. Built on torch's private _CachedTorchDispatchMode, _RECOMPUTE
    and _sac_storage_key (torch 2.13)."""
    from torch.utils.checkpoint import _RECOMPUTE, SAC_IGNORED_OPS, _CachedTorchDispatchMode, _sac_storage_key

    class LenientRecompute(_CachedTorchDispatchMode):  # type: ignore[no-untyped-call]  # torch's is untyped
        def __torch_dispatch__(
            self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
        ) -> Any:
            key = _sac_storage_key(func, args)  # type: ignore[no-untyped-call]
            entries = self.storage.get(key, {})
            if (
                func not in SAC_IGNORED_OPS
                and self.func_counter[key] not in entries
                and all(e is _RECOMPUTE for e in entries.values())
            ):
                self.func_counter[key] += 1
                return func(*args, **(kwargs or {}))
            return super().__torch_dispatch__(func, types, args, kwargs)  # type: ignore[no-untyped-call]

    return LenientRecompute


def checkpoint_selectively(
    model: torch.nn.Module, kept: int, selective: int, stage: str
) -> list[GradientCheckpointingLayer]:
    """Make the `selective` decoder layers just before the last `kept` selective: their checkpoint (the function
    transformers calls them under, a partial of torch's checkpoint) keeps their matmuls' and attention's outputs.
    Needs the non-reentrant checkpoint (transformers 5's default); a reentrant one cannot keep chosen outputs: a
    ValueError saying so rather than a silent full recompute."""
    layers = decoder_layers(model)
    chosen = layers[max(0, len(layers) - kept - selective) : len(layers) - kept] if selective else []
    for layer in chosen:
        func = layer._gradient_checkpointing_func
        if not isinstance(func, partial) or func.keywords.get("use_reentrant", True):
            raise ValueError(
                f"{stage}: the plan made {selective} decoder layers selectively checkpointed, which needs torch's "
                f"non-reentrant checkpoint; this model's layers run under {func!r} (TRL sets use_reentrant for PEFT "
                f"under ZeRO-3, where the plan makes none selective); set stages.{stage}.uncheckpointedLayers to "
                "fix the count instead"
            )
        # the attribute transformers' wrapped forward calls (set per layer by _set_gradient_checkpointing)
        layer._gradient_checkpointing_func = partial(func, context_fn=selective_contexts)  # type: ignore[assignment]
    return chosen


def runtime_choice(spec: RLTRunSpec, stage: str, layers: int, device: str) -> LayerChoice:
    """The plan's choice for this process (rlt.checks.stage_terms.trainer.TrainerTerms.layer_choice), on the
    smaller of the spec's GPU memory and this GPU's, so it never counts on more than either holds; on CPU every
    layer is checkpointed unless the spec says otherwise. `layers`: the model's, for an unreadable shape."""
    return runtime_layers(spec, stage, layers, device)[0]


def runtime_layers(
    spec: RLTRunSpec, stage: str, layers: int, device: str
) -> tuple[LayerChoice, LayerSchedule | None, int]:
    """(runtime_choice, the plan's per-micro-batch schedule at the same memory or None where the count is fixed,
    the tokens of the longest micro-batch its shares are of)."""
    from rlt.checks.gpu_memory import spec_gpu_memory
    from rlt.checks.plan_terms import stage_terms
    from rlt.checks.shapes import run_shapes
    from rlt.checks.stage_terms.trainer import TrainerTerms
    from rlt.data.models import is_cuda

    st = stage_settings(spec, stage)
    gpu = is_cuda(device)
    if not gpu or st.uncheckpointed_layers is not None or not st.gradient_checkpointing:
        return choose(stage, layers, st.gradient_checkpointing, st.uncheckpointed_layers, None, 0, lambda k: 0), None, 0
    import torch

    memory = min(spec_gpu_memory(spec)[0], torch.cuda.get_device_properties(torch.device(device)).total_memory)
    shapes, unread = run_shapes(spec, build=False)
    terms = stage_terms(stage)
    choice = terms.layer_choice(spec, shapes, True, memory) if isinstance(terms, TrainerTerms) else None
    if choice is None or not isinstance(terms, TrainerTerms):
        why = "; ".join(unread) or "not a Trainer stage's model"
        return LayerChoice(stage, layers, 0, f"{field_name(stage)} unset and the model's shape unread: {why}"), None, 0
    return choice, terms.layer_schedule(spec, shapes, True, memory), terms.longest_micro_tokens(spec)


class PerMicroBatch:
    """A forward pre-hook (with kwargs) on the trained model: before each forward of the update (the model
    training, gradients on; the reference, old-policy and evaluation passes run without), the last
    `plan.kept_for(tokens / longest)` decoder layers keep their activations, the others are checkpointed, for the
    fewest any rank allows (agreed). Counts the micro-batches by layers kept."""

    def __init__(self, layers: list[GradientCheckpointingLayer], plan: LayerSchedule, longest: int, device: str):
        self.layers, self.plan, self.longest, self.device = layers, plan, max(1, longest), device
        self.counts: dict[int, int] = {}

    def __call__(self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        import torch

        if not module.training or not torch.is_grad_enabled():
            return
        ids = kwargs.get("input_ids", args[0] if args else None)
        ids = kwargs.get("inputs_embeds") if ids is None else ids
        if ids is None:
            raise ValueError("a training forward without input_ids or inputs_embeds: its tokens are unknown")
        tokens = int(ids.shape[0]) * int(ids.shape[1]) if ids.dim() > 1 else int(ids.numel())
        kept = agreed(min(self.plan.kept_for(tokens / self.longest), len(self.layers)), self.device)
        first = len(self.layers) - kept
        for i, layer in enumerate(self.layers):
            layer.gradient_checkpointing = i < first
        self.counts[kept] = self.counts.get(kept, 0) + 1

    def line(self, stage: str) -> str:
        spread = ", ".join(f"{k} layers × {n}" for k, n in sorted(self.counts.items(), reverse=True))
        return f"{stage}: micro-batches by decoder layers that kept their activations: {spread or 'none'}"


def agreed(kept: int, device: str) -> int:
    """The fewest layers any rank of the process group keeps (itself when there is no group): every rank must
    recompute the same layers, for ZeRO-3 gathers a layer's parameters in a collective at each forward, the
    recompute's included; ranks whose GPUs differ would otherwise choose apart and wait on each other for ever."""
    import torch
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() <= 1:
        return kept
    value = torch.tensor([kept], dtype=torch.int64, device=torch.device(device))
    dist.all_reduce(value, op=dist.ReduceOp.MIN)
    return int(value.item())


def checkpoint_layers_callback(spec: RLTRunSpec, stage: str, device: str, main: bool) -> TrainerCallback:
    """A TrainerCallback whose on_train_begin, which `Trainer.train` calls after it turned checkpointing on,
    keeps the chosen layers' activations; the `main` rank says the choice in one line."""
    from transformers import TrainerCallback

    from rlt.stages.record import say_line

    class KeepLayers(TrainerCallback):
        def __init__(self) -> None:
            self.hook: PerMicroBatch | None = None
            self.handle: RemovableHandle | None = None

        def on_train_begin(
            self,
            args: TrainingArguments,
            state: TrainerState,
            control: TrainerControl,
            model: torch.nn.Module | None = None,
            **kw: Any,
        ) -> None:
            if model is None or not args.gradient_checkpointing:
                return
            choice, plan, longest = runtime_layers(spec, stage, len(decoder_layers(model)), device)
            if choice.problem:
                raise ValueError(choice.problem)
            kept, selective = agreed(choice.kept, device), agreed(choice.selective, device)
            if (kept, selective) != (choice.kept, choice.selective):
                # fewer of either holds less, so the fewest of each fits every rank (it can hold less than the
                # smallest GPU's own pair would: ranks on different GPUs are rare)
                choice = replace(
                    choice, kept=kept, selective=selective,
                    how=f"{choice.how}; {kept} kept, {selective} selective: the fewest a rank of the gang chose",
                )  # fmt: skip
            keep_activations(model, choice.kept, stage)
            checkpoint_selectively(model, choice.kept, choice.selective, stage)
            if main:
                say_line(choice.line())
            if plan is not None and plan.steps:
                self.hook = PerMicroBatch(decoder_layers(model), plan, longest, device)
                self.handle = model.register_forward_pre_hook(self.hook, with_kwargs=True)
                if main:
                    say_line(plan.line(stage, longest))

        def on_train_end(
            self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
        ) -> None:
            if self.handle is not None:
                self.handle.remove()
                if main and self.hook is not None:
                    say_line(self.hook.line(stage))
            self.hook, self.handle = None, None

    return KeepLayers()
