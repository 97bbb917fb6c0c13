"""What every stage function is given (the run, its layout, the metrics, the device) and the process facts it
reads from the launcher (world size, this rank's device)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

from rlt.contract.env import LOCAL_RANK, RANK, WORLD_SIZE
from rlt.contract.layout import RunLayout
from rlt.contract.metrics import TrainerMetrics
from rlt.spec.run import RLTRun, RLTRunSpec

if TYPE_CHECKING:
    from rlt.method.prompts import Formatter


@dataclass
class StageContext:
    run: RLTRun
    layout: RunLayout
    metrics: TrainerMetrics | None = None
    device: str | None = None
    show_progress: bool = True

    @property
    def spec(self) -> RLTRunSpec:
        return self.run.spec

    @property
    def is_main(self) -> bool:
        return int(os.environ.get(RANK.name, "0")) == 0

    def world_size(self) -> int:
        return world_size()

    @cached_property
    def compute_device(self) -> str:
        """Where this process computes: `device` (default: cuda when available), under a launcher the rank's own GPU.
        Resolved once, on first use, before any model of the stage is loaded."""
        from rlt.data.models import pick_device

        return rank_device(self.device or pick_device())

    @cached_property
    def formatter(self) -> Formatter:
        """The run's prompt format (spec.format resolved once); the student's system prompt is the data's `system`
        column when its rows carry one and spec.format names none (rlt.data.dataset.data_system_prompt)."""
        from rlt.method.prompts import Formatter, resolve_format

        fmt = resolve_format(self.spec.format)
        if self.spec.format.student_system_prompt is None:  # the data's own, when its rows carry it
            from rlt.data.dataset import data_system_prompt

            system = data_system_prompt(self.spec.dataset)
            if system is not None:
                fmt = fmt.model_copy(update={"student_system_prompt": system})
        return Formatter(fmt)


def world_size() -> int:
    """Processes in the job (the launcher's WORLD_SIZE; 1 without a launcher): the one place it is read."""
    return int(os.environ.get(WORLD_SIZE.name, "1"))


def rank_device(device: str) -> str:
    """This process's device. Under a launcher each rank owns GPU LOCAL_RANK, made current before any model is
    loaded (a bare "cuda" would put every rank's models on GPU 0)."""
    from rlt.data.models import is_cuda

    if is_cuda(device) and LOCAL_RANK.name in os.environ:
        import torch

        local = int(os.environ[LOCAL_RANK.name])
        torch.cuda.set_device(local)
        return f"cuda:{local}"
    return device
