"""Distillation rows on the volume as they are made, so a lost rank or a restart costs at most its batch in progress.

Each rank appends the rows of every finished batch to its own file `distill/parts/<fingerprint>/rank-<R>.jsonl`,
one write + fsync per batch, each line `{"index": i, "row": {...}, "attempt": "<launch>"}` (i: the row's place in
the stage's rows; the launch: torchrun's run id and restart count). A restart reads every part file of the same stage
spec (the fingerprint of its compared fields: a spec edit starts from nothing, a loggingSteps edit does not) and deals only the unfinished batches to the ranks, whatever
the world size is now (rlt.stages.distill.my_share). The ranks of one launch deal from the rows of earlier launches
only: a rank that reads the files after a peer wrote its first batch still deals as its peers did (else a batch
could fall to no rank, and the merge would wait forever). Rank 0 merges by reading the files once all indices are
there: no collective, so ranks may finish hours apart.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rlt.contract.env import ELASTIC_RESTART_COUNT, ELASTIC_RUN_ID
from rlt.data.jsonl import dumps_line
from rlt.spec.fingerprint import compared_fingerprint, stage_fingerprint
from rlt.spec.run import RLTRunSpec
from rlt.stages.record import say_line


def parts_dir(stage_dir: Path, fingerprint: str) -> Path:
    return stage_dir / "parts" / fingerprint


def parts_folder(stage_dir: Path, spec: RLTRunSpec) -> Path:
    """The part files of this distill spec, named by its compared fields: an edit of loggingSteps keeps the rows
    written. A folder that an older rlt named by all the fields (the same rows) is taken over, so an upgrade in the
    middle of the stage loses nothing; a link keeps the old name, so a rollback to that rlt finds them too."""
    folder = parts_dir(stage_dir, compared_fingerprint(spec, "distill"))
    older = parts_dir(stage_dir, stage_fingerprint(spec, "distill"))
    if older != folder and older.is_dir() and not older.is_symlink() and not folder.exists():
        with contextlib.suppress(OSError):  # a peer rank renamed it first, or made the link
            older.rename(folder)
            older.symlink_to(folder.name, target_is_directory=True)
    return folder


def rank_file(folder: Path, rank: int) -> Path:
    return folder / f"rank-{rank}.jsonl"


def repair_tail(path: Path) -> None:
    """Cut a torn last line (the process died inside a write) so that the next append starts on a line of its own."""
    if not path.exists():
        return
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    if end != len(data):
        with path.open("r+b") as f:
            f.truncate(end)
            f.flush()
            os.fsync(f.fileno())


def launch() -> str | None:
    """This launch of the ranks, the same in each (torchrun's run id and restart count); None without a launcher
    (one process: no peer can write while it deals)."""
    run_id = os.environ.get(ELASTIC_RUN_ID.name)
    if not run_id or run_id == "none":  # torchrun's default id without --standalone: the same for every launch
        return None
    return f"{run_id}/{os.environ.get(ELASTIC_RESTART_COUNT.name, '0')}"


def append_rows(path: Path, pairs: Iterable[tuple[int, dict[str, Any]]]) -> None:
    """One batch, in one write, on disk before returning (fsync): a kill loses the batch in progress only."""
    tag = {"attempt": attempt} if (attempt := launch()) else {}
    text = "".join(dumps_line({"index": i, "row": row} | tag) for i, row in pairs)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def read_done(folder: Path, before: str | None = None) -> dict[int, dict[str, Any]]:
    """index -> row of every row any rank has written (with `before`, a launch: written by earlier launches only); a
    torn last line (a kill mid-write) is not a row."""
    done: dict[int, dict[str, Any]] = {}
    for path in sorted(folder.glob("rank-*.jsonl")) if folder.is_dir() else []:
        for line in path.read_text().splitlines():
            try:
                item = json.loads(line)
            except json.JSONDecodeError:
                continue  # only ever the last line of a file, cut by repair_tail before its rank appends again
            if before is None or item.get("attempt") != before:
                done.setdefault(int(item["index"]), item["row"])
    return done


class PartsTail:
    """The rows the ranks have written so far, read incrementally: each poll parses only the complete lines added
    since the last (per-file byte offsets), so rank 0 waiting hours on a slow rank never re-parses the GBs already
    written. Files only grow while the ranks run (a torn last line is left for the next poll)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.offsets: dict[Path, int] = {}
        self.done: dict[int, dict[str, Any]] = {}

    def poll(self) -> dict[int, dict[str, Any]]:
        for path in sorted(self.folder.glob("rank-*.jsonl")) if self.folder.is_dir() else []:
            start = self.offsets.get(path, 0)
            with path.open("rb") as f:
                f.seek(start)
                data = f.read()
            end = data.rfind(b"\n") + 1  # complete lines only
            for line in data[:end].decode().splitlines():
                try:
                    item = json.loads(line)
                except json.JSONDecodeError:
                    continue  # as read_done: a torn line of an earlier run, cut before its rank appended again
                self.done.setdefault(int(item["index"]), item["row"])
            self.offsets[path] = start + end
        return self.done


def wait_for_all(folder: Path, total: int, poll: float = 2.0, say_every: float = 300.0) -> list[dict[str, Any]]:
    """Rank 0: every row 0..total-1, in order, once the other ranks have written theirs (read from their files as
    they grow: PartsTail). A rank that dies ends the pod (its launcher stops the others), so this never waits on a
    dead rank."""
    started = last_said = time.monotonic()
    tail = PartsTail(folder)
    while True:
        done = tail.poll()
        if len(done) >= total and all(i in done for i in range(total)):
            return [done[i] for i in range(total)]
        if time.monotonic() - last_said >= say_every:
            last_said = time.monotonic()
            say_line(
                f"distill: {len(done)}/{total} rows written; waiting for the other ranks "
                f"({time.monotonic() - started:.0f} s)"
            )
        time.sleep(poll)
