"""Stop on SIGTERM without losing a step: preemption, a node drain, a Kueue eviction or a suspend all end a pod
with SIGTERM and, after terminationGracePeriodSeconds, SIGKILL.

The signal only raises a flag. At the end of the optimizer step in progress every rank all-reduces the flag (one
small collective per step), so when ANY rank of the gang was told to stop (a preempted pod stops only its own
ranks) all ranks save the same checkpoint, leave the loop together and exit `ExitCode.STOPPED`. Under a launcher
(torchrun, accelerate) the launcher's own exit code is lost (it exits 1 after a signal), so `rlt launch` runs it
and turns a stop that the ranks reported into STOPPED too.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path
from typing import Any

from rlt.contract.env import RANK, STOP_MARKER

log = logging.getLogger(__name__)

# The file `rlt launch` asks the ranks to write once the gang has saved and stopped (it then exits STOPPED).
STOP_MARKER_ENV = STOP_MARKER.name


class Stopped(Exception):
    """The gang stopped on a signal after saving `checkpoint` at `step` (what `rlt stage` turns into STOPPED)."""

    def __init__(self, stage: str, step: int, checkpoint: str | None):
        self.stage, self.step, self.checkpoint = stage, step, checkpoint
        super().__init__(
            f"stage {stage} stopped on SIGTERM after step {step}"
            + (f"; checkpoint {checkpoint} saved, a restart resumes from it" if checkpoint else "")
        )


class StopRequest:
    """A SIGTERM handler that only raises a flag (the step in progress finishes); installed for the training loop."""

    def __init__(self) -> None:
        self.asked_at: float | None = None  # this process got the signal
        self.agreed = False  # the gang decided to stop (this rank or another was asked)
        self._previous: Any = None

    def install(self) -> StopRequest:
        self._previous = signal.signal(signal.SIGTERM, self._handle)
        return self

    def uninstall(self) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None

    def _handle(self, signum: int, _frame: Any) -> None:
        if self.asked_at is None:
            self.asked_at = time.monotonic()
            # one write, no logging machinery: this runs between two bytecodes of whatever the rank was doing
            os.write(
                2, f"rlt: SIGTERM on rank {os.environ.get(RANK.name, '0')}: finishing the step, then saving\n".encode()
            )

    def gang_agrees(self) -> bool:
        """True when any rank was asked to stop: every rank must call this at the same point of every step."""
        import torch
        import torch.distributed as dist

        asked = self.asked_at is not None
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None
            flag = torch.tensor([1 if asked else 0], dtype=torch.int32, device=device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            asked = bool(flag.item())
        self.agreed = self.agreed or asked
        return self.agreed


def stop_callback(stop: StopRequest):
    """A transformers TrainerCallback: at the end of a step the gang agrees on a stop, then saves and leaves."""
    from transformers import TrainerCallback

    class StopOnSignal(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            if stop.gang_agrees():
                control.should_save = True
                control.should_training_stop = True
            return control

    return StopOnSignal()


def report_stop(stopped: Stopped) -> None:
    """Tell `rlt launch` (when it runs this rank) that the gang stopped cleanly."""
    marker = os.environ.get(STOP_MARKER_ENV)
    if marker:
        Path(marker).write_text(f"{stopped.stage} {stopped.step} {stopped.checkpoint or ''}\n")
