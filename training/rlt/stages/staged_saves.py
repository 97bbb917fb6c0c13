"""Saves off the critical path: the Trainer writes each checkpoint to fast local storage (RLT_LOCAL_CHECKPOINTS,
one folder per rank), and a background thread per rank copies what its rank wrote to the run's volume and fsyncs it.
The training loop is blocked for the local write only.

Every guarantee of the direct save stands: the checkpoint holds what it held (model, optimizer, trainer state, the
synced GRPO reference, each rank's RNG); the completion marker is written last, by rank 0, once every rank's copy
is fsynced (each rank says so with a `rank-R.copied` file, fsynced too) and it is fsynced itself; a crash during the
copy leaves a checkpoint without its marker, which a resume sets aside, falling back to the one before. No
collective runs in the background (the ranks meet through those files). A save waits for the previous copy first,
and the stage's end and a stop wait for the last one, so the reported checkpoint is always the durable one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlt.contract.layout import CHECKPOINT_COMPLETE, atomic_write_text, checkpoint_path, format_time
from rlt.stages.checkpoints import fsync_path, rotate

if TYPE_CHECKING:
    from transformers import Trainer

log = logging.getLogger(__name__)

COPIED = "rank-{}.copied"  # in the durable checkpoint: that rank's files are copied and fsynced
# how long a rank waits for its peers' copies (or rank 0's marker) while nothing more reaches the checkpoint
MARK_TIMEOUT_SECONDS = 1800.0


def copy_fsynced(src: Path, dst: Path) -> int:
    """Copy the tree `src` into `dst` (merged with what other ranks copy there), fsyncing every file and folder.
    Returns the bytes copied."""
    copied = 0
    for folder, _dirs, files in os.walk(src):
        target = dst / Path(folder).relative_to(src)
        target.mkdir(parents=True, exist_ok=True)
        for name in files:
            shutil.copyfile(Path(folder) / name, target / name)
            fsync_path(target / name)
            copied += (target / name).stat().st_size
    for folder, _dirs, _files in os.walk(dst, topdown=False):
        fsync_path(Path(folder))
    fsync_path(dst.parent)  # the checkpoint's entry in the checkpoints folder
    fsync_path(dst.parent.parent)  # and that folder's, new at a stage's first save
    return copied


def tree_size(folder: Path) -> tuple[int, int]:
    """(files, bytes) under `folder`: what the ranks' copies have brought so far."""
    files = size = 0
    for root, _dirs, names in os.walk(folder):
        for name in names:
            with contextlib.suppress(FileNotFoundError):  # retention may take an old file meanwhile
                size += (Path(root) / name).stat().st_size
                files += 1
    return files, size


def wait_for(
    paths: list[Path], timeout: float, what: str, progress: Callable[[], object] | None = None, every: float = 5.0
) -> None:
    """Until every path exists. Gives up after `timeout` seconds in which `progress()` (looked at `every` seconds:
    on a network volume it walks the checkpoint's metadata) did not change: a large checkpoint on a slow volume takes
    as long as its copies go on, a dead peer `timeout`. (A volume that shows a file only once it is closed, an
    object store's FUSE mount, shows no progress during one shard's copy.)"""
    last, seen = time.monotonic(), progress() if progress else None
    looked = last
    while not all(p.exists() for p in paths):
        now = time.monotonic()
        if progress is not None and now - looked >= every:
            looked = now
            if (current := progress()) != seen:
                last, seen = now, current
        if now - last > timeout:
            missing = [p.name for p in paths if not p.exists()]
            raise TimeoutError(f"{what}: {missing} not there, and no copy went on, for {timeout:.0f} s (a peer died?)")
        time.sleep(0.05)


class StagedSaves:
    """Installed on a trainer (`install`); `wait()` joins the copy in flight and raises its error."""

    def __init__(
        self,
        trainer: Trainer,
        local_root: Path,
        rank: int,
        world: int,
        on_complete: Callable[[int, str], None],
        timeout: float = MARK_TIMEOUT_SECONDS,
        keep: int | None = None,
    ) -> None:
        self.trainer, self.rank, self.world, self.on_complete, self.timeout = trainer, rank, world, on_complete, timeout
        self.keep = keep  # saveTotalLimit: the durable folder's complete checkpoints kept once a new one is marked
        self.local = local_root / f"rank-{rank}"  # one folder per rank: each copies only what it wrote
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self.seconds = {"local_write": 0.0, "durable_copy": 0.0}  # the last save's

    def install(self) -> None:
        trainer = self.trainer
        save: Callable[[Any, Any], None] = trainer._save_checkpoint  # TRL's/transformers' is unannotated
        durable_dir: Callable[[Any], str] = trainer._get_output_dir

        def staged(model: Any, trial: Any) -> None:
            self.wait()
            step = trainer.state.global_step
            durable = checkpoint_path(durable_dir(trial), step)
            if (durable / CHECKPOINT_COMPLETE).exists():
                return  # already saved and durable (a stop right after a periodic save): never rewrite it
            t0 = time.perf_counter()
            trainer._get_output_dir = lambda trial: str(self.local)  # type: ignore[method-assign]
            try:
                save(model, trial)
            finally:
                del trainer._get_output_dir  # the class's again
            self.seconds["local_write"] = time.perf_counter() - t0
            self.start_copy(checkpoint_path(self.local, step), durable, step)

        trainer._save_checkpoint = staged  # type: ignore[method-assign]  # this trainer only

    def start_copy(self, local: Path, durable: Path, step: int) -> None:
        def copy() -> None:
            try:
                t0 = time.perf_counter()
                copy_fsynced(local, durable) if local.exists() else durable.mkdir(parents=True, exist_ok=True)
                atomic_write_text(durable / COPIED.format(self.rank), format_time() + "\n")
                fsync_path(durable / COPIED.format(self.rank))
                fsync_path(durable)
                shutil.rmtree(local, ignore_errors=True)  # durable now: the local space is given back
                if self.rank == 0:
                    peers = [durable / COPIED.format(r) for r in range(self.world)]
                    wait_for(peers, self.timeout, f"checkpoint {durable}", lambda: tree_size(durable))
                    atomic_write_text(durable / CHECKPOINT_COMPLETE, format_time() + "\n")
                    fsync_path(durable)  # the marker's directory entry
                    rotate(durable.parent, self.keep)
                else:
                    marker = [durable / CHECKPOINT_COMPLETE]
                    wait_for(marker, self.timeout, f"checkpoint {durable}", lambda: tree_size(durable))
                self.seconds["durable_copy"] = time.perf_counter() - t0
                self.on_complete(step, str(durable))
            except BaseException as e:  # raised to the training loop at the next save or the stage's end
                self.error = e

        self.thread = threading.Thread(target=copy, name=f"rlt-durable-copy-{step}", daemon=True)
        self.thread.start()

    def wait(self) -> None:
        if self.thread is not None:
            self.thread.join()
            self.thread = None
        if self.error is not None:
            error, self.error = self.error, None
            raise RuntimeError(f"the durable copy of a checkpoint failed: {error}") from error
