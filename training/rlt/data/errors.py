"""The data problem every reader raises (datasets, the run's own JSONL files): one line naming the file, the line
(or row) and the field."""

from __future__ import annotations


class DataError(ValueError):
    """A dataset problem; the message names the file, the line (or row) and the field."""
