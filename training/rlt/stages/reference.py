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
from pathlib import Path

log = logging.getLogger(__name__)

REFERENCE_FILE = "rlt-reference.safetensors"


def synced_reference(trainer):
    """The trainer's reference model when refSync updates it (None: no reference, LoRA, or refSync off), unwrapped
    from a DeepSpeed engine or accelerate wrapper."""
    ref = getattr(trainer, "ref_model", None)
    if ref is None or not getattr(trainer.args, "sync_ref_model", False):
        return None
    return getattr(ref, "module", ref)


def _gathered(param, modifier_rank=None):
    """The whole parameter for the block (ZeRO-3 partitions it across the ranks; elsewhere it is whole)."""
    if not hasattr(param, "ds_id"):
        return contextlib.nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters([param], modifier_rank=modifier_rank)


def save_reference(trainer, checkpoint: str | Path) -> Path | None:
    """Write the synced reference into `checkpoint` (rank 0 writes; every rank takes part in the gathers). Before
    the first sync the reference is still the start model, which a resume loads anyway: nothing is written."""
    ref = synced_reference(trainer)
    if ref is None or trainer.state.global_step < trainer.args.ref_model_sync_steps:
        return None
    from safetensors.torch import save_file

    main = trainer.accelerator.is_main_process
    tensors = {}
    for name, param in ref.named_parameters():  # tied weights once, as the sync updates them
        with _gathered(param):
            if main:
                tensors[name] = param.detach().to("cpu", copy=True).contiguous()
    path = Path(checkpoint) / REFERENCE_FILE
    if main:
        save_file(tensors, str(path), metadata={"step": str(trainer.state.global_step)})
    return path


def load_reference(trainer, checkpoint: str | Path) -> bool:
    """Before training resumes from `checkpoint`: the reference as it was saved. A checkpoint saved after a sync
    without it (written before rlt kept the reference) resumes with the start model, with a warning. True when
    loaded."""
    ref = synced_reference(trainer)
    if ref is None:
        return False
    path = Path(checkpoint) / REFERENCE_FILE
    if not path.exists():
        step = _checkpoint_step(checkpoint)
        if step >= trainer.args.ref_model_sync_steps:
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


def keep_reference_in_checkpoints(trainer) -> bool:
    """Every checkpoint the trainer writes (periodic, final, a stop's) holds the synced reference, written before
    the completion marker (the record callback's on_save, after `_save_checkpoint`). True when wrapped."""
    if synced_reference(trainer) is None:
        return False
    from rlt.contract.layout import checkpoint_path

    save_checkpoint = trainer._save_checkpoint

    def with_reference(model, trial):
        save_checkpoint(model, trial)
        save_reference(trainer, checkpoint_path(trainer.args.output_dir, trainer.state.global_step))

    trainer._save_checkpoint = with_reference
    return True
