"""End of a stage on disk: the final model (LoRA merged), the checkpoint marker, the newest complete checkpoint, and
the checkpoints given back once the final model is written."""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from rlt.contract.layout import (
    CHECKPOINT_COMPLETE,
    SET_ASIDE,
    atomic_write_text,
    checkpoints,
    format_time,
    is_complete,
)
from rlt.stages.context import StageContext

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase, Trainer

    from rlt.spec.inputs import ModelRef

log = logging.getLogger(__name__)


def save_final_model(
    trainer: Trainer, ctx: StageContext, stage: str, start: ModelRef, tokenizer: PreTrainedTokenizerBase, device: str
) -> str:
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
def outside_zero3(trainer: Trainer) -> Iterator[None]:
    """While rank 0 alone loads the base model to merge the adapter: transformers must not see the Trainer's
    ZeRO-3 config, or `from_pretrained` builds the model inside `deepspeed.zero.Init`, whose collectives wait
    for the other ranks (already in their exit barrier) forever. The config is set again afterwards."""
    from transformers.integrations.deepspeed import set_hf_deepspeed_config, unset_hf_deepspeed_config

    live = getattr(trainer.args, "hf_deepspeed_config", None)
    unset_hf_deepspeed_config()  # type: ignore[no-untyped-call]  # transformers leaves it unannotated
    try:
        yield
    finally:
        if live is not None:
            set_hf_deepspeed_config(live)  # type: ignore[no-untyped-call]  # transformers leaves it unannotated


def mark_checkpoint_complete(path: str | Path, is_main: bool) -> None:
    """After every rank's save of `path` (ZeRO shards are written by all ranks), rank 0 writes the marker last.

    torch.save and safetensors do not fsync: a node crash soon after a save could leave a "complete" checkpoint
    whose shards never reached the disk. So every rank fsyncs the checkpoint's files and folders (its own among
    them) before the barrier, and rank 0 the folder holding the marker after writing it."""
    import torch.distributed as dist

    fsync_tree(Path(path))
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
    if is_main:
        atomic_write_text(Path(path) / CHECKPOINT_COMPLETE, format_time() + "\n")
        fsync_path(Path(path))  # the marker's directory entry


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def delete_checkpoint(path: Path) -> None:
    """Delete a checkpoint folder, its completion marker first and that fsynced: a pod killed midway leaves a folder
    without its marker (set aside on resume), never a marked one missing shards (which a resume would load, fail on
    and crash-loop)."""
    import shutil

    marker = path / CHECKPOINT_COMPLETE
    if marker.exists():
        marker.unlink()
        fsync_path(path)
    shutil.rmtree(path, ignore_errors=True)
    if path.exists():  # a busy or read-only volume: unmarked, it is set aside on resume, but the disk is not back
        log.warning("checkpoint %s: its marker is gone but the folder could not be deleted", path)


def rotate(directory: Path, keep: int | None) -> list[Path]:
    """saveTotalLimit, applied by rlt once a new checkpoint is marked complete (transformers' own rotation is off: it
    deletes before rlt marks): the newest `keep` complete checkpoints stay; older ones, and incomplete ones older
    than the newest complete one, go, each marker first."""
    if keep is None:
        return []
    found = checkpoints(directory)
    complete = [p for _s, p in found if (p / CHECKPOINT_COMPLETE).exists()]
    if not complete:
        return []
    newest = next(s for s, p in found if p == complete[0])
    gone = [p for s, p in found if (p in complete[keep:]) or (p not in complete and s < newest)]
    for p in gone:
        delete_checkpoint(p)
    return gone


def fsync_tree(path: Path) -> None:
    """fsync every file and folder under `path`, then `path`'s own entry in its parent. Files another rank is still
    writing are fsynced by that rank too (it calls this once its own save ended)."""
    for folder, _dirs, files in os.walk(path, topdown=False):
        for name in files:
            with contextlib.suppress(FileNotFoundError):  # a temporary file renamed meanwhile
                fsync_path(Path(folder) / name)
        fsync_path(Path(folder))
    fsync_path(path.parent)


def unloadable(path: Path) -> str | None:
    """Why checkpoint `path` cannot be loaded (a truncated or unreadable file: the first found), or None. Reads the
    structure of each file, not its data: a safetensors header and the length it promises, a torch zip's central
    directory (written last, so truncation loses it), a JSON document."""
    import json
    import zipfile

    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        where = file.relative_to(path)
        try:
            if file.suffix == ".safetensors":
                _check_safetensors(file)
            elif file.suffix in (".pt", ".pth", ".bin"):
                with zipfile.ZipFile(file) as z:
                    z.infolist()
            elif file.suffix == ".json":
                json.loads(file.read_text())
        except (OSError, ValueError, zipfile.BadZipFile) as e:
            return f"{where}: {e}"
    return None


def _check_safetensors(file: Path) -> None:
    import json

    size = file.stat().st_size
    with file.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ValueError(f"{size} bytes, shorter than a safetensors header")
        n = int.from_bytes(head, "little")
        header = json.loads(f.read(n))
    end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
    if size != 8 + n + end:
        raise ValueError(f"{size} bytes, its header describes {8 + n + end} (truncated?)")


def last_checkpoint(directory: Path) -> str | None:
    """The newest complete checkpoint under `directory` that can be loaded; newer partial ones (a pod killed
    mid-save) and unloadable ones (a truncated shard) are moved to `directory/set-aside/` with a warning, so neither
    a resume nor the Trainer's rotation ever reads them, and the run falls back to the one before."""
    for _step, path in checkpoints(directory):
        if not is_complete(path):
            set_aside(path, f"is incomplete (no {CHECKPOINT_COMPLETE})")
            continue
        reason = unloadable(path)
        if reason is None:
            return str(path)
        set_aside(path, f"cannot be loaded ({reason})")
    return None


def set_aside(path: Path, why: str) -> None:
    """Move checkpoint `path` to its folder's set-aside/ (kept for a person to look at, never deleted)."""
    target = path.parent / SET_ASIDE / f"{path.name}.{int(time.time())}.{os.getpid()}"
    log.warning("checkpoint %s %s: set aside as %s, not resumed", path, why, target)
    target.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):  # another rank set it aside first
        path.rename(target)


def resume_checkpoint(directory: Path) -> str | None:
    """`last_checkpoint` decided once for the gang: rank 0 checks (and sets aside), the others take its answer, so
    no rank reads a folder another is moving and every rank resumes the same checkpoint."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return last_checkpoint(directory)
    chosen = [last_checkpoint(directory) if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(chosen, src=0)
    return chosen[0]


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
            delete_checkpoint(path)
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
