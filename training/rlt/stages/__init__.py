"""The stages of a run, in order. Each is a plain function of a StageContext that returns its output path; which
function runs a stage for a teaching method is listed in rlt.contract.stage_registry."""

from __future__ import annotations

from rlt.contract.stage_registry import stage_function

__all__ = ["stage_function"]
