"""The distilled students' sft-convergence arm of the teaching comparison (benchmarks/teaching_comparison.py): rlt's
sft stage with a held-out loss at each epoch's end, stopping once it has not improved for `patience` evaluations and
putting the best epoch's weights back (a callback added to the stage's trainer; the stage itself unchanged)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any


def stop_epoch(losses: list[float], patience: int) -> tuple[int, bool]:
    """(best epoch, 1-based; whether to stop now): stop once the loss has not improved for `patience` evaluations."""
    best = min(range(len(losses)), key=lambda i: (losses[i], i)) + 1
    return best, len(losses) - best >= patience


def heldout_loss(model: Any, rows: list[dict[str, list[int]]]) -> float:
    """Mean token loss on the completions of tokenised sft rows (the completion-only loss SFT trains on)."""
    import torch

    was_training = model.training
    model.eval()
    total, tokens = 0.0, 0
    with torch.no_grad():
        for r in rows:
            ids = torch.tensor([r["input_ids"]], device=model.device)
            mask = torch.tensor(r["completion_mask"][1:], device=model.device, dtype=torch.float32)
            logits = model(ids).logits[0, :-1].float()
            nll = torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="none")
            total += float((nll * mask).sum())
            tokens += int(mask.sum())
    model.train(was_training)
    return total / tokens


def convergence_callback(
    rows: list[dict[str, list[int]]],
    patience: int,
    record: Path,
    evaluate: Callable[[Any], float] | None = None,
) -> Any:
    """A transformers TrainerCallback: the held-out loss at each epoch's end; training stops once it has not
    improved for `patience` evaluations, and the best epoch's weights are put back before the stage saves its final
    model (early stopping with the best model restored, as the protocol says). The losses go to `record`.
    `evaluate(model)` replaces the held-out loss on `rows` (the tests script the losses with it)."""
    from transformers import TrainerCallback

    score = evaluate or (lambda model: heldout_loss(model, rows))

    class ConvergenceStop(TrainerCallback):  # type: ignore[misc]
        def __init__(self) -> None:
            self.losses: list[float] = []
            self.best_state: dict[str, Any] | None = None

        def on_epoch_end(self, args: Any, state: Any, control: Any, **kw: Any) -> Any:
            model = kw["model"]
            self.losses.append(score(model))
            best, stop = stop_epoch(self.losses, patience)
            if best == len(self.losses):
                self.best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
            control.should_training_stop = control.should_training_stop or stop
            record.write_text(json.dumps({"losses": self.losses, "best_epoch": best, "stopped": stop}))
            return control

        def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> Any:
            if self.best_state is not None:
                kw["model"].load_state_dict(self.best_state)
            return control

    return ConvergenceStop()


@contextlib.contextmanager
def convergence_stop(loss_rows: list[dict[str, Any]], patience: int, record: Path) -> Iterator[None]:
    """Within it, the trainer of the sft stage gets ConvergenceStop on `loss_rows` (training-split rows not
    distilled); the stage itself is rlt's, unchanged."""
    from rlt.method.prompts import Formatter, resolve_format
    from rlt.spec.inputs import FormatSpec
    from rlt.stages import trainer as stage_trainer
    from rlt.stages.sft import sft_rows

    original = stage_trainer.TrainerRun.trainer
    formatter = Formatter(resolve_format(FormatSpec()))

    def trainer(self: Any, trainer_cls: Any, args: Any, rows: Any, *more: Any, **kw: Any) -> Any:
        built = original(self, trainer_cls, args, rows, *more, **kw)
        if self.stage == "sft":
            tokenised = sft_rows(loss_rows, formatter, self.tokenizer, "reject", 384)
            built.add_callback(convergence_callback(tokenised, patience, record))
        return built

    stage_trainer.TrainerRun.trainer = trainer  # type: ignore[method-assign]
    try:
        yield
    finally:
        stage_trainer.TrainerRun.trainer = original  # type: ignore[method-assign]
