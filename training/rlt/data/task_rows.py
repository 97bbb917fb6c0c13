"""The row type of the built-in tasks, in a module of its own: `tasks` and `headroom` both build rows, and
`tasks` imports `headroom`, so the type cannot live in either without an import circle."""

from __future__ import annotations

from typing import TypedDict


class TaskRow(TypedDict):
    """One generated row: the fields every built-in task writes."""

    question: str
    reasoning_trace: str
    solution: str


class BasicRow(TaskRow, total=False):
    """A `basic` row also names its calibrated level."""

    level: int
