"""The GRPO reference model as part of a checkpoint.

With refSync on, the reference is soft-updated from the policy every refSync.steps (rlt.stages.rl.pairwise_ref_sync)
and lives only in memory: the Trainer's checkpoint holds the policy, optimizer, scheduler and RNG. Without it, a
restart past the first sync anchors the KL term to the start model again until the next sync: another experiment.
So after the first sync every checkpoint also holds the reference's weights (REFERENCE_FILE, in the reference's
own dtype: the teacher's, bf16 on a GPU), gathered one parameter at a time under ZeRO-3 as the sync gathers them,
and a resume loads them before the first step.

With LoRA TRL keeps no reference model: the reference is the frozen base with the adapter switched off, and
refSync is off (TRL cannot soft-update it), so nothing differs from the start model and nothing is stored.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    import torch
    from transformers import Trainer
    from trl.trainer.grpo_config import GRPOConfig

log = logging.getLogger(__name__)

REFERENCE_FILE = "rlt-reference.safetensors"


def synced_reference(trainer: Trainer) -> torch.nn.Module | None:
    """The trainer's reference model when refSync updates it (None: no reference, LoRA, or refSync off), unwrapped
    from a DeepSpeed engine or accelerate wrapper."""
    ref = getattr(trainer, "ref_model", None)
    if ref is None or not getattr(trainer.args, "sync_ref_model", False):
        return None
    model: torch.nn.Module = getattr(ref, "module", ref)
    return model


def _sync_steps(trainer: Trainer) -> int:
    """refSync's period: only a GRPOTrainer has a synced reference, and its args are its GRPOConfig."""
    return cast("GRPOConfig", trainer.args).ref_model_sync_steps


def _gathered(param: torch.nn.Parameter, modifier_rank: int | None = None) -> contextlib.AbstractContextManager[Any]:
    """The whole parameter for the block (ZeRO-3 partitions it across the ranks; elsewhere it is whole)."""
    if not hasattr(param, "ds_id"):
        return contextlib.nullcontext()
    import deepspeed

    gathered: contextlib.AbstractContextManager[Any] = deepspeed.zero.GatheredParameters(
        [param], modifier_rank=modifier_rank
    )  # deepspeed ships no type information
    return gathered


def save_reference(trainer: Trainer, checkpoint: str | Path) -> Path | None:
    """Write the synced reference into `checkpoint` (rank 0 writes; every rank takes part in the gathers). Before
    the first sync the reference is still the start model, which a resume loads anyway: nothing is written."""
    ref = synced_reference(trainer)
    if ref is None or trainer.state.global_step < _sync_steps(trainer):
        return None
    from safetensors.torch import save_file

    main = trainer.accelerator.is_main_process
    tensors: dict[str, torch.Tensor] = {}
    for name, param in ref.named_parameters():  # tied weights once, as the sync updates them
        with _gathered(param):
            if main:
                tensors[name] = param.detach().to("cpu", copy=True).contiguous()
    path = Path(checkpoint) / REFERENCE_FILE
    if main:
        save_file(tensors, str(path), metadata={"step": str(trainer.state.global_step)})
    return path


def load_reference(trainer: Trainer, checkpoint: str | Path) -> bool:
    """Before training resumes from `checkpoint`: the reference as it was saved. A checkpoint saved after a sync
    without it (written before rlt kept the reference) resumes with the start model, with a warning. True when
    loaded."""
    ref = synced_reference(trainer)
    if ref is None:
        return False
    path = Path(checkpoint) / REFERENCE_FILE
    if not path.exists():
        step = _checkpoint_step(checkpoint)
        if step >= _sync_steps(trainer):
            log.warning(
                "checkpoint %s (step %d) holds no %s: the GRPO reference restarts from the start model until the "
                "next refSync",
                checkpoint,
                step,
                REFERENCE_FILE,
            )
        return False
    from safetensors import safe_open

    params = dict(ref.named_parameters())
    partitioned = any(hasattr(p, "ds_id") for p in params.values())
    loads_here = trainer.accelerator.is_main_process or not partitioned
    with safe_open(str(path), framework="pt") as f:  # every rank reads the names (the header), to fail alike
        names = set(f.keys())
        if names != set(params):
            missing, extra = sorted(set(params) - names), sorted(names - set(params))
            raise ValueError(
                f"{path}: the reference's parameters do not match the model's (missing {missing[:3]}, "
                f"unexpected {extra[:3]}); was the checkpoint written by another model?"
            )
        for name, param in params.items():
            with _gathered(param, modifier_rank=0):
                if loads_here:
                    param.data.copy_(f.get_tensor(name))
    log.info("GRPO reference loaded from %s", path)
    return True


def _checkpoint_step(checkpoint: str | Path) -> int:
    name = Path(checkpoint).name
    return int(name.rsplit("-", 1)[1]) if name.rsplit("-", 1)[-1].isdigit() else 0


def keep_reference_in_checkpoints(trainer: Trainer) -> bool:
    """Every checkpoint the trainer writes (periodic, final, a stop's) holds the synced reference, written before
    the completion marker (the record callback's on_save, after `_save_checkpoint`). True when wrapped."""
    if synced_reference(trainer) is None:
        return False
    from rlt.contract.layout import checkpoint_path

    save_checkpoint: Callable[[torch.nn.Module, Any], None] = trainer._save_checkpoint  # TRL's is unannotated

    def with_reference(model: torch.nn.Module, trial: Any) -> None:  # trial: passed on (optuna's, or None)
        save_checkpoint(model, trial)
        # the folder the Trainer saved into (rlt.stages.staged_saves points it at local storage)
        save_reference(trainer, checkpoint_path(trainer._get_output_dir(trial), trainer.state.global_step))

    trainer._save_checkpoint = with_reference  # type: ignore[method-assign]  # the save wrapped on this trainer only
    return True
