"""End of a stage on disk: the final model (LoRA merged), the checkpoint marker, the newest complete checkpoint, and
the checkpoints given back once the final model is written."""

from __future__ import annotations

import contextlib
import os
import time
from contextlib import contextmanager
from pathlib import Path

from rlt.contract.layout import (
    CHECKPOINT_COMPLETE,
    SET_ASIDE,
    atomic_write_text,
    checkpoints,
    format_time,
    is_complete,
)
from rlt.stages.context import StageContext


def save_final_model(trainer, ctx: StageContext, stage: str, start, tokenizer, device: str) -> str:
    """The stage's final model in model_dir(stage). With LoRA the adapter is saved beside it (stage/adapter) and
    the model is the base with the adapter merged in: what distill, the vLLM generators and the next stage load
    as a plain model. Merging from the saved adapter works the same under ZeRO-3, where the live weights are
    sharded."""
    out = ctx.layout.model_dir(stage)
    if start.lora is None:
        trainer.save_model(str(out))
    else:
        adapter = ctx.layout.adapter_dir(stage)
        trainer.save_model(str(adapter))
        if ctx.is_main:
            from peft import PeftModel

            from rlt.data.models import load_model

            with outside_zero3(trainer):
                merged = PeftModel.from_pretrained(load_model(start, device), str(adapter)).merge_and_unload()
                merged.save_pretrained(str(out))
    if ctx.is_main:
        tokenizer.save_pretrained(str(out))
    return str(out)


@contextmanager
def outside_zero3(trainer):
    """While rank 0 alone loads the base model to merge the adapter: transformers must not see the Trainer's
    ZeRO-3 config, or `from_pretrained` builds the model inside `deepspeed.zero.Init`, whose collectives wait
    for the other ranks (already in their exit barrier) forever. The config is set again afterwards."""
    from transformers.integrations.deepspeed import set_hf_deepspeed_config, unset_hf_deepspeed_config

    live = getattr(trainer.args, "hf_deepspeed_config", None)
    unset_hf_deepspeed_config()
    try:
        yield
    finally:
        if live is not None:
            set_hf_deepspeed_config(live)


def mark_checkpoint_complete(path: str | Path, is_main: bool) -> None:
    """After every rank's save of `path` (ZeRO shards are written by all ranks), rank 0 writes the marker last."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
    if is_main:
        atomic_write_text(Path(path) / CHECKPOINT_COMPLETE, format_time() + "\n")


def last_checkpoint(directory: Path) -> str | None:
    """The newest complete checkpoint under `directory`; newer partial ones (a pod killed mid-save) are moved to
    `directory/set-aside/` with a warning, so neither a resume nor the Trainer's rotation ever reads them."""
    import logging

    for _step, path in checkpoints(directory):
        if is_complete(path):
            return str(path)
        target = directory / SET_ASIDE / f"{path.name}.{int(time.time())}.{os.getpid()}"
        logging.getLogger(__name__).warning(
            "checkpoint %s is incomplete (no %s): set aside as %s, not resumed", path, CHECKPOINT_COMPLETE, target
        )
        target.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):  # another rank set it aside first
            path.rename(target)
    return None


# What a checkpoint holds only to resume training: the Trainer's optimizer, DeepSpeed's ZeRO shards (optimizer and
# fp32 master weights, several times the model) and the script DeepSpeed writes beside them.
OPTIMIZER_STATE_FILES = ("optimizer.pt", "latest", "zero_to_fp32.py")


OPTIMIZER_STATE_DIRS = "global_step*"


def prune_finished_checkpoints(directory: Path) -> list[Path]:
    """Once a stage's final model is written: every checkpoint but the last complete one is deleted, and that one
    loses its optimizer states (it keeps its weights, trainer state and marker; set-aside partial ones are kept).
    Returns what was removed. No later stage reads a checkpoint (they read <stage>/model), so this is the stage's
    disk given back to the next one."""
    import shutil

    last = last_checkpoint(directory)
    if last is None:
        return []
    removed: list[Path] = []
    for _step, path in checkpoints(directory):
        if str(path) != last:
            shutil.rmtree(path)
            removed.append(path)
    keep = Path(last)
    for name in OPTIMIZER_STATE_FILES:
        if (keep / name).exists():
            (keep / name).unlink()
            removed.append(keep / name)
    for sub in keep.glob(OPTIMIZER_STATE_DIRS):
        shutil.rmtree(sub)
        removed.append(sub)
    return removed
