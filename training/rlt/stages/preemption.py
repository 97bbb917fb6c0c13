"""Stop on SIGTERM without losing a step: preemption, a node drain, a Kueue eviction or a suspend all end a pod
with SIGTERM and, after terminationGracePeriodSeconds, SIGKILL.

The signal only raises a flag. Every rank all-reduces the flag at each boundary of a step (before its rollout,
after the rollout returns, after the reference and old-policy passes, after scoring, after each accumulated
micro-batch, after the optimizer step: one 4-byte collective each), so when ANY rank of the gang was told to stop
(a preempted pod stops only its own ranks) all ranks decide at the same point. After the optimizer step they save
that step; inside a step they abandon it: no gradient exists before its first backward, its partial gradients are
dropped after, and the state saved is the one before its optimizer step, which is the state after the last
completed step (`Abandoned`), with the random state the step started from. So a stop costs at most one phase of a
step (the rollout, the scoring, one micro-batch) of waiting, not a whole step — a paper-scale GRPO step holds 256
micro-batches and 20-45 minutes — and a restart redoes the abandoned step from the same data and the same random
state (the Trainer skips the completed steps' batches only). Under a launcher
(torchrun, accelerate) the launcher's own exit code is lost (it exits 1 after a signal), so `rlt launch` runs it
and turns a stop that the ranks reported into STOPPED too.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from rlt.contract.env import RANK, STOP_MARKER, TRACE

if TYPE_CHECKING:
    import torch
    from transformers import Trainer, TrainerCallback, TrainerControl, TrainerState, TrainingArguments

log = logging.getLogger(__name__)

# The file `rlt launch` asks the ranks to write once the gang has saved and stopped (it then exits STOPPED).
STOP_MARKER_ENV = STOP_MARKER.name


class Stopped(Exception):
    """The gang stopped on a signal after saving `checkpoint` at `step` (what `rlt stage` turns into STOPPED)."""

    def __init__(
        self, stage: str, step: int, checkpoint: str | None, gang_agreed: bool = True, message: str | None = None
    ):
        # gang_agreed False: this rank left on an error after the signal; the others may still be in a collective
        self.stage, self.step, self.checkpoint, self.gang_agreed = stage, step, checkpoint, gang_agreed
        super().__init__(
            message
            or f"stage {stage} stopped on SIGTERM after step {step}"
            + (f"; checkpoint {checkpoint} saved, a restart resumes from it" if checkpoint else "")
        )


class Abandoned(Exception):
    """The gang agreed to stop inside a step: raised out of `train()` at the same micro-batch boundary on every rank;
    `save_abandoned` then saves the last completed step."""


# SIGTERMs a stage's handler took after its last stop point: the stage finished anyway, and `rlt run` stops before
# its next stage (rlt.run.runner) rather than forget them.
LATE_SIGNALS: list[float] = []


class StopRequest:
    """A SIGTERM handler that only raises a flag (read at the next micro-batch boundary); installed for the training
    loop."""

    def __init__(self) -> None:
        self.asked_at: float | None = None  # this process got the signal
        self.agreed = False  # the gang decided to stop (this rank or another was asked)
        self.updating = False  # between a step's optimizer step and its end: the weights may be half-updated
        self.step_rng: dict[str, Any] | None = None  # the random state the current step started from
        self._previous: Any = None

    def install(self) -> StopRequest:
        self._previous = signal.signal(signal.SIGTERM, self._handle)
        return self

    def uninstall(self) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None
            if self.asked_at is not None and not self.agreed:  # taken after the stage's last stop point
                LATE_SIGNALS.append(self.asked_at)

    def _handle(self, signum: int, _frame: Any) -> None:
        if self.asked_at is None:
            self.asked_at = time.monotonic()
            # one write, no logging machinery: this runs between two bytecodes of whatever the rank was doing
            os.write(
                2,
                f"rlt: SIGTERM on rank {os.environ.get(RANK.name, '0')}: stopping at the next micro-batch, then saving\n".encode(),
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


def stop_point(stop: StopRequest, state: TrainerState, where: str) -> None:
    """A boundary inside a step before its first backward (after the rollout, the reference and old-policy passes,
    the scoring): the gang abandons the step here when any rank was asked to stop. Every rank calls it at the same
    points of every step."""
    if stop.gang_agrees():
        raise Abandoned(f"{where} of step {state.global_step + 1}")


def rng_state() -> dict[str, Any]:
    """What the Trainer's checkpoint keeps of the random state (transformers' _save_rng_state)."""
    import random

    import numpy as np
    import torch

    out = {"python": random.getstate(), "numpy": np.random.get_state(), "cpu": torch.random.get_rng_state()}
    if torch.cuda.is_available():
        out["cuda"] = torch.cuda.random.get_rng_state_all()
    return out


def set_rng_state(state: dict[str, Any]) -> None:
    import random

    import numpy as np
    import torch

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.random.set_rng_state(state["cpu"])
    if "cuda" in state:
        torch.cuda.random.set_rng_state_all(state["cuda"])


def stop_callback(stop: StopRequest) -> TrainerCallback:
    """A transformers TrainerCallback: the gang agrees on a stop at every micro-batch boundary. After an optimizer
    step it saves that step and leaves; before a step's rollout or between its micro-batches it abandons the step."""
    from transformers import TrainerCallback

    class StopOnSignal(TrainerCallback):
        def on_step_begin(  # before the rollout (GRPO generates in the 1st micro)
            self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
        ) -> None:
            # the state after the last completed step: a step abandoned from here on is saved with it, so the
            # restart redoes it alike (taken before the check: a stop here saves that same completed step)
            stop.step_rng = rng_state()
            if stop.gang_agrees():
                raise Abandoned(f"before step {state.global_step + 1}")

        def on_pre_optimizer_step(
            self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
        ) -> None:
            stop.updating = True

        def on_substep_end(
            self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
        ) -> None:
            if os.environ.get(TRACE.name) == "1":  # the preemption tests stop the gang mid-accumulation by it
                os.write(1, f"rlt-micro rank={os.environ.get(RANK.name, '0')} step={state.global_step + 1}\n".encode())
            if stop.gang_agrees():
                raise Abandoned(f"inside step {state.global_step + 1}")

        def on_step_end(
            self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
        ) -> TrainerControl:
            stop.updating = False
            if stop.gang_agrees():
                control.should_save = True
                control.should_training_stop = True
            return control

    return StopOnSignal()


def save_abandoned(trainer: Trainer, step_rng: dict[str, Any] | None = None) -> str | None:
    """After `Abandoned`, on every rank: drop the step's partial gradients and save the state after the last
    completed optimizer step (the model and optimizer are untouched until the step's optimizer.step()), unless a
    complete checkpoint of that step exists (a periodic save, or the one this run resumed from: never rewritten) or
    no step completed. `step_rng`, the random state the abandoned step started from, is what the checkpoint keeps
    (the state after the last completed step), not the one the abandoned rollout left. Returns that checkpoint. A
    collective under DeepSpeed, like the Trainer's own saves."""
    from rlt.contract.layout import checkpoint_path, is_complete

    # a Trainer that trained has both: its model, and output_dir (TrainingArguments fills in a default)
    model = cast("torch.nn.Module", trainer.model)
    model.zero_grad(set_to_none=True)
    step = trainer.state.global_step
    path = checkpoint_path(cast(str, trainer.args.output_dir), step)
    if step == 0:
        return None
    if not is_complete(path):
        if step_rng is not None:
            set_rng_state(step_rng)
        trainer._save_checkpoint(trainer.model_wrapped, trial=None)
        trainer.control = trainer.callback_handler.on_save(trainer.args, trainer.state, trainer.control)
    return str(path)


STOP_AGREED, STOP_AFTER_ERROR = "agreed", "after-error"  # the last word of a rank's line in the stop marker


def report_stop(stopped: Stopped) -> None:
    """Tell `rlt launch` (when it runs this rank) that this rank stopped after a signal: one line per rank, ending
    STOP_AGREED when the gang agreed on the stop, STOP_AFTER_ERROR when this rank left on an error after it (a peer
    gone: which `rlt launch` counts as a stop only if its own pod was signalled)."""
    marker = os.environ.get(STOP_MARKER_ENV)
    if marker:
        how = STOP_AGREED if stopped.gang_agreed else STOP_AFTER_ERROR
        with Path(marker).open("a") as f:  # every rank of the pod appends its line
            f.write(f"{stopped.stage} {stopped.step} {stopped.checkpoint or '-'} {how}\n")
