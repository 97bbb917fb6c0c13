"""The data problem every reader raises (datasets, the run's own JSONL files): one line naming the file, the line
(or row) and the field; and the one way a stage refuses or skips the rows it cannot use (spec.dataset.badRows)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


class DataError(ValueError):
    """A dataset problem; the message names the file, the line (or row) and the field."""


def sift_rows(
    rows: list[dict[str, Any]], problem: Callable[[dict[str, Any]], str | None], bad_rows: str, stage: str, why: str
) -> list[dict[str, Any]]:
    """The rows `problem` finds nothing wrong with. badRows reject: a DataError naming the first bad row; skip: one
    warning for the stage (not one per row). No usable row at all is an error either way (`why`: what they were)."""
    out, skipped = [], []
    for r in rows:
        msg = problem(r)
        if msg is None:
            out.append(r)
        elif bad_rows == "reject":
            raise DataError(f"stage {stage}: {msg}")
        else:
            skipped.append(msg)
    if not out:
        raise DataError(
            f"stage {stage}: no usable rows" + (f" (all {len(skipped)} {why}, first {skipped[0]})" if skipped else "")
        )
    if skipped:
        log.warning(
            "stage %s: skipping %d of %d rows (badRows: skip), first %s", stage, len(skipped), len(rows), skipped[0]
        )
    return out
