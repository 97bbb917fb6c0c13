"""Each stage's part of `rlt run`'s summary (results/<run>/summary.json and the lines printed at the end): a module
named after the stage (rlt.contract.stage_registry.STAGE_SUMMARIES), for the stages that have something to say,
with the two functions of StageSummary. The runner loops over the stage table and asks each."""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any, Protocol, cast

from rlt.contract.layout import RunLayout
from rlt.contract.stage_registry import STAGE_SUMMARIES, stage_info


class StageSummary(Protocol):
    def summarize(self, layout: RunLayout, metrics: list[dict[str, Any]]) -> dict[str, Any] | None:
        """The stage's part of summary.json from its outputs and metrics.jsonl's rows; None: nothing to say."""
        ...

    def lines(self, part: dict[str, Any]) -> list[str]:
        """What `rlt run` prints of that part."""
        ...


def stage_summary(name: str) -> StageSummary | None:
    """The summary module of stage `name`; None for a stage without one."""
    module = STAGE_SUMMARIES.format(stage=stage_info(name).name)
    if importlib.util.find_spec(module) is None:
        return None
    return cast(StageSummary, importlib.import_module(module))
