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
(rlt.checks.plan_terms.activations)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from rlt.checks.checkpoint_layers import LayerChoice, choose, field_name
from rlt.spec.run import RLTRunSpec, stage_settings

if TYPE_CHECKING:
    import torch
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


def runtime_choice(spec: RLTRunSpec, stage: str, layers: int, device: str) -> LayerChoice:
    """The plan's choice for this process (rlt.checks.stage_terms.trainer.TrainerTerms.layer_choice), on the
    smaller of the spec's GPU memory and this GPU's, so it never counts on more than either holds; on CPU every
    layer is checkpointed unless the spec says otherwise. `layers`: the model's, for an unreadable shape."""
    from rlt.checks.gpu_memory import spec_gpu_memory
    from rlt.checks.plan_terms import stage_terms
    from rlt.checks.shapes import run_shapes
    from rlt.checks.stage_terms.trainer import TrainerTerms
    from rlt.data.models import is_cuda

    st = stage_settings(spec, stage)
    gpu = is_cuda(device)
    if not gpu or st.uncheckpointed_layers is not None or not st.gradient_checkpointing:
        return choose(stage, layers, st.gradient_checkpointing, st.uncheckpointed_layers, None, 0, lambda k: 0)
    import torch

    memory = min(spec_gpu_memory(spec)[0], torch.cuda.get_device_properties(torch.device(device)).total_memory)
    shapes, unread = run_shapes(spec, build=False)
    terms = stage_terms(stage)
    choice = terms.layer_choice(spec, shapes, True, memory) if isinstance(terms, TrainerTerms) else None
    if choice is None:
        why = "; ".join(unread) or "not a Trainer stage's model"
        return LayerChoice(stage, layers, 0, f"{field_name(stage)} unset and the model's shape unread: {why}")
    return choice


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
            choice = runtime_choice(spec, stage, len(decoder_layers(model)), device)
            if choice.problem:
                raise ValueError(choice.problem)
            kept = agreed(choice.kept, device)
            if kept != choice.kept:
                choice = replace(choice, kept=kept, how=f"{choice.how}; {kept}: the fewest a rank of the gang chose")
            keep_activations(model, choice.kept, stage)
            if main:
                say_line(choice.line())

    return KeepLayers()
