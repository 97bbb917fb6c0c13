"""Ranks balanced by tokens: ZeRO-3 gathers every layer's parameters across the ranks, so each micro-step lasts as
long as its slowest rank, and TRL's GRPOTrainer shuffles each rank's own rows at random (`shuffle_sequence_dict`).
Here, once a generation batch is scored (its group-wise advantages computed by TRL in the original group order),
the rows of all ranks are dealt again: sorted by tokens, cut into the step's micro-steps (the longest rows together),
and within a micro-step given to the rank with the fewest tokens so far (each rank gets its per-device batch).

The step's gradient is the same sum: with one generation round per optimizer step (rlt's steps_per_generation =
gradient_accumulation_steps), every row still contributes once, and the loss types allowed here weight a row the
same in whichever micro-batch it lands (grpo: 1/rows per micro-batch, dr_grpo: 1/(rows × max length), dapo: the
step's token count). bnpo divides by the micro-batch's own tokens, so a row's weight depends on its neighbours:
there the rows stay where TRL puts them, and the imbalance is still measured.

Per step it reports the imbalance, tokens and seconds: the sum over micro-steps of the largest rank's figure over
the sum of the ranks' mean, i.e. how much longer synchronised micro-steps last than balanced ones would. Tokens are
those the model computes (rows × attended width, rlt.stages.padding); seconds are each rank's own micro-step time,
which under ZeRO-3 already holds the waits for the slowest rank (every layer's gather), so there it reads near 1 and
the tokens figure is the one that shows the loss; where ranks meet only at the step's end it shows it directly.

The reference and old-policy forwards TRL runs while it scores a batch (before the deal above) are dealt the same way
(`dealt_pass`): the rows go to the ranks of the deal, the forward runs on them, and the log-probs go back to the rows'
own ranks, so TRL's scoring goes on as before. A forward's result does not depend on the row's neighbours, so this
holds for every loss type. Their imbalance is reported as `passes_tokens` / `passes_seconds`.

sft and student deal their rows before the step (rlt.stages.sft_balance), and report their imbalance the same way."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from functools import cache
from typing import TYPE_CHECKING, Any, Protocol

from rlt.spec.stages import DEALABLE_LOSSES

if TYPE_CHECKING:
    import torch
    from accelerate import Accelerator
    from trl.trainer.grpo_config import GRPOConfig

    from rlt.stages.padding import LogpsOut

log = logging.getLogger(__name__)

# TRL's per-row keys of a scored generation batch, by how they are padded: prompt columns on the left, completion
# columns on the right, one value per row. Any other key is refused (a row would arrive without it).
PROMPT_KEYS = ("prompt_ids", "prompt_mask")
COMPLETION_KEYS = (
    "completion_ids",
    "completion_mask",
    "old_per_token_logps",
    "sampling_per_token_logps",
    "ref_per_token_logps",
    "tool_mask",
)
ROW_KEYS = ("advantages",)
RATIO_KEY = "importance_sampling_ratio"  # per completion token (TRL's token modes) or one per row (sequence modes)
SHARED_KEYS = ("num_items_in_batch",)  # the same on every rank


class BalanceFigures(Protocol):
    """What `rank_balanced` adds to a trainer: the last optimizer step's imbalance."""

    def balance_figures(self) -> dict[str, float]: ...


def deal(lengths: list[int], world: int, steps: int, per_step: int) -> list[list[int]]:
    """Rows (their global index) for each rank, micro-step after micro-step: `steps` micro-steps of `per_step` rows
    on each of `world` ranks. The rows sorted by tokens (longest first) are cut into micro-steps, so a micro-step's
    slowest rank holds the shortest possible longest row; within one, each row (longest first) goes to the rank
    with the fewest tokens that still has room (ties: the lower rank). Deterministic: every rank computes the
    same plan from the same lengths."""
    if len(lengths) != world * steps * per_step:
        raise ValueError(
            f"{len(lengths)} rows cannot be dealt as {steps} micro-steps × {per_step} rows × {world} ranks"
        )
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    plan: list[list[int]] = [[] for _ in range(world)]
    chunk = world * per_step
    for s in range(steps):
        load, room = [0] * world, [per_step] * world
        step_rows: list[list[int]] = [[] for _ in range(world)]
        for i in order[s * chunk : (s + 1) * chunk]:
            r = min((r for r in range(world) if room[r]), key=lambda r: (load[r], r))
            step_rows[r].append(i)
            load[r] += lengths[i]
            room[r] -= 1
        for r in range(world):
            plan[r].extend(step_rows[r])
    return plan


def imbalance(per_step: list[list[float]]) -> float:
    """Sum over micro-steps of the largest rank's figure over the sum of the ranks' mean (`per_step[s][rank]`): the
    time synchronised micro-steps take against balanced ones. 1.0 when there is nothing to compare."""
    slowest = sum(max(ranks) for ranks in per_step if ranks)
    mean = sum(sum(ranks) / len(ranks) for ranks in per_step if ranks)
    return slowest / mean if mean > 0 else 1.0


def micro_step_tokens(lengths: list[int], plan: list[list[int]], per_step: int) -> list[list[float]]:
    """Tokens of each micro-step on each rank under `plan` ([micro-step][rank])."""
    steps = len(plan[0]) // per_step
    return [
        [float(sum(lengths[i] for i in rows[s * per_step : (s + 1) * per_step])) for rows in plan] for s in range(steps)
    ]


def window_figures(accelerator: Accelerator, seen: list[tuple[float, float]], prefix: str = "") -> dict[str, float]:
    """The imbalance of a window of micro-steps ((tokens, seconds) each, as many on every rank), as metrics.jsonl
    keys `rank_imbalance_{prefix}tokens|seconds`; a collective."""
    import torch

    mine = torch.tensor(seen, dtype=torch.float64, device=accelerator.device).view(len(seen), 2)
    every = accelerator.gather(mine).view(accelerator.num_processes, len(seen), 2)
    per_step = every.permute(1, 0, 2).tolist()  # [micro-step][rank][tokens, seconds]
    return {
        f"rank_imbalance_{prefix}tokens": imbalance([[r[0] for r in ranks] for ranks in per_step]),
        f"rank_imbalance_{prefix}seconds": imbalance([[r[1] for r in ranks] for ranks in per_step]),
    }


def row_tokens(batch: dict[str, Any]) -> torch.Tensor:
    """Attended tokens of each row (prompt + completion)."""
    prompt: torch.Tensor = batch["prompt_mask"]
    completion: torch.Tensor = batch["completion_mask"]
    return prompt.sum(dim=1) + completion.sum(dim=1)


def processed_tokens(batch: dict[str, Any]) -> int:
    """Tokens the model computes for a micro-batch: its rows × the columns some row attends (prompt from its first
    attended column, completion up to its last), the width rlt.stages.padding runs the model calls at."""
    prompt = batch["prompt_mask"].any(dim=0).nonzero()
    completion = batch["completion_mask"].any(dim=0).nonzero()
    width = (batch["prompt_mask"].size(1) - int(prompt[0]) if prompt.numel() else 0) + (
        int(completion[-1]) + 1 if completion.numel() else 0
    )
    rows: int = batch["prompt_mask"].size(0)
    return rows * width


def refuse_unknown_keys(batch: dict[str, Any]) -> None:
    known = set(PROMPT_KEYS + COMPLETION_KEYS + ROW_KEYS + SHARED_KEYS + (RATIO_KEY,))
    unknown = sorted(k for k, v in batch.items() if v is not None and k not in known)
    if unknown:
        raise ValueError(
            f"rank balancing: the scored batch has per-row fields it does not know how to move between ranks: "
            f"{unknown} (multimodal or tool inputs are not supported by rlt's rl stage)"
        )


def exchanged(
    batch: dict[str, Any], accelerator: Accelerator, steps: int, per_step: int, token_ratio: bool = False
) -> dict[str, Any]:
    """This rank's rows of the balanced deal (`deal`), taken from every rank's scored batch: each per-row tensor is
    padded to the ranks' widest and gathered (accelerate), then this rank keeps its rows, micro-step by micro-step,
    cut back to the columns they attend. `token_ratio`: the importance-sampling ratio is per completion token."""
    refuse_unknown_keys(batch)
    columns = COMPLETION_KEYS + ((RATIO_KEY,) if token_ratio else ())
    lengths = [int(n) for n in accelerator.gather(row_tokens(batch)).tolist()]
    plan = deal(lengths, accelerator.num_processes, steps, per_step)
    mine = plan[accelerator.process_index]
    out: dict[str, Any] = {}
    for key, value in batch.items():
        if value is None or key in SHARED_KEYS:
            out[key] = value
            continue
        if key in PROMPT_KEYS + columns:  # to the widest rank's width: prompts on the left, completions right
            padded = accelerator.pad_across_processes(value, dim=1, pad_index=0, pad_first=key in PROMPT_KEYS)
        else:
            padded = value
        out[key] = accelerator.gather(padded)[mine]
    return trimmed_to_attended(out, columns)


def trimmed_to_attended(batch: dict[str, Any], columns: tuple[str, ...] = COMPLETION_KEYS) -> dict[str, Any]:
    """`batch` without the prompt columns (left) and completion columns (right) none of its rows attends."""
    used = batch["prompt_mask"].any(dim=0).nonzero()
    first = int(used[0]) if used.numel() else 0
    used = batch["completion_mask"].any(dim=0).nonzero()
    end = int(used[-1]) + 1 if used.numel() else 1
    out: dict[str, Any] = {}
    for key, value in batch.items():
        if value is not None and key in PROMPT_KEYS:
            out[key] = value[:, first:]
        elif value is not None and key in columns:
            out[key] = value[:, :end]
        else:
            out[key] = value
    return out


def chunk_tokens(attention_mask: torch.Tensor, logits_to_keep: int, per_step: int) -> list[float]:
    """Tokens the model computes for each chunk of `per_step` rows of a pass (rlt.stages.padding cuts each chunk
    to the columns its rows attend)."""
    from rlt.stages.padding import attended_columns

    out = []
    for start in range(0, attention_mask.size(0), per_step):
        chunk = attention_mask[start : start + per_step]
        first, end = attended_columns(chunk, logits_to_keep)
        out.append(float(chunk.size(0) * (end - first)))
    return out


def dealt_pass(
    accelerator: Accelerator,
    forward: Callable[[torch.Tensor, torch.Tensor, int], LogpsOut],
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    logits_to_keep: int,
    per_step: int,
) -> tuple[LogpsOut, list[float]]:
    """`forward(ids, mask, logits_to_keep)`, a pass over this rank's rows in chunks of `per_step` (TRL's reference
    or old-policy log-probs), run on this rank's rows of the deal (`deal`: the same plan the update's rows get) in
    place of its own; its per-token results go back to the rows' own ranks at this rank's width. Also the tokens
    of each chunk run here. A collective: every rank calls it with as many rows."""
    rows = input_ids.size(0)
    start = input_ids.size(1) - logits_to_keep
    batch = {
        "prompt_ids": input_ids[:, :start],
        "prompt_mask": attention_mask[:, :start],
        "completion_ids": input_ids[:, start:],
        "completion_mask": attention_mask[:, start:],
    }
    lengths = [int(n) for n in accelerator.gather(attention_mask.sum(dim=1)).tolist()]
    plan = deal(lengths, accelerator.num_processes, rows // per_step, per_step)
    mine = plan[accelerator.process_index]
    moved = {}
    for key, value in batch.items():  # to the widest rank's width: prompts on the left, completions on the right
        padded = accelerator.pad_across_processes(value, dim=1, pad_index=0, pad_first=key in PROMPT_KEYS)
        moved[key] = accelerator.gather(padded)[mine]
    moved = trimmed_to_attended(moved)
    keep = moved["completion_ids"].size(1)
    mask = _cat(moved["prompt_mask"], moved["completion_mask"])
    out = forward(_cat(moved["prompt_ids"], moved["completion_ids"]), mask, keep)
    # every rank's dealt rows, in plan order, gathered; this rank's own rows picked from them
    where = {row: k for k, row in enumerate(i for rank_rows in plan for i in rank_rows)}
    own = [where[accelerator.process_index * rows + j] for j in range(rows)]
    logps = _returned(accelerator, out[0], own, rows, logits_to_keep)
    assert logps is not None  # a pass always has log-probs
    back = (logps, _returned(accelerator, out[1], own, rows, logits_to_keep), out[2])  # out[2]: an auxiliary loss
    return back, chunk_tokens(mask, keep, per_step)


def _cat(left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
    import torch

    return torch.cat([left, right], dim=1)


def _returned(
    accelerator: Accelerator, value: torch.Tensor | None, own: list[int], rows: int, width: int
) -> torch.Tensor | None:
    """A per-token result of the dealt rows (`rows` × columns) back on the rows' own ranks, `width` columns; None as
    it is."""
    import torch.nn.functional as F

    if value is None or value.dim() != 2 or value.size(0) != rows:
        return value
    every: torch.Tensor = accelerator.gather(accelerator.pad_across_processes(value, dim=1, pad_index=0))[own]
    if every.size(1) >= width:
        return every[:, :width]
    return F.pad(every, (0, width - every.size(1)))  # columns none of the rows attends


def deal_refusal(args: GRPOConfig, world: int) -> str | None:
    """Why the rows of this run cannot be dealt across micro-steps without changing the step's gradient; None when
    they can."""
    if world <= 1:
        return "one process"
    if args.loss_type not in DEALABLE_LOSSES:
        return f"loss_type {args.loss_type} weighs a row by its micro-batch's tokens"
    if args.steps_per_generation != args.gradient_accumulation_steps or args.num_iterations != 1:
        return "a generation round spans more than one optimizer step"
    if args.top_entropy_quantile < 1.0 or args.entropy_coef != 0.0 or args.use_adaptive_entropy:
        return "an entropy mask or bonus is computed per micro-batch"
    return None


def measured_pass(
    trainer: Any,
    forward: Callable[[torch.Tensor, torch.Tensor, int], LogpsOut],
    in_scoring: bool,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    logits_to_keep: int,
    batch_size: int | None,
    extra: dict[str, Any],
) -> LogpsOut:
    """One log-prob forward of a `rank_balanced` trainer: a pass of a training batch's scoring (no gradient, on the
    scoring thread, whole micro-steps, no extra inputs) runs on the dealt rows when `trainer.deal_passes`, and each
    chunk's tokens and share of the time go to `trainer._passes_seen`; any other forward is TRL's as it is."""
    import torch

    per_step = batch_size or input_ids.size(0)
    in_pass = in_scoring and not torch.is_grad_enabled()
    if not in_pass or any(v is not None for v in extra.values()) or input_ids.size(0) % per_step:
        return forward(input_ids, attention_mask, logits_to_keep)
    start = time.perf_counter()
    if trainer.deal_passes:
        out, tokens = dealt_pass(trainer.accelerator, forward, input_ids, attention_mask, logits_to_keep, per_step)
    else:
        out = forward(input_ids, attention_mask, logits_to_keep)
        tokens = chunk_tokens(attention_mask, logits_to_keep, per_step)
    seconds = (time.perf_counter() - start) / max(1, len(tokens))  # each chunk's share of the pass
    trainer._passes_seen += [(t, seconds) for t in tokens]
    return out


def dealt_inputs(trainer: Any, generation_batch: list[dict[str, Any]]) -> dict[str, Any]:
    """TRL's training branch of `GRPOTrainer._prepare_inputs`, with `exchanged` where TRL shuffles: a new
    generation round is scored, dealt across the ranks by tokens and split into the round's micro-steps."""
    from trl.trainer.utils import split_tensor_dict

    steps: int = trainer.args.steps_per_generation
    step: int = trainer._step  # TRL's count of micro-steps
    if step % (steps * trainer.num_iterations) == 0 or trainer._buffered_inputs is None:
        batch = trainer._generate_and_score_completions(generation_batch)
        mode = trainer.vllm_importance_sampling_mode if trainer.use_vllm else ""
        batch = exchanged(
            batch,
            trainer.accelerator,
            steps,
            trainer.args.per_device_train_batch_size,
            token_ratio=mode.startswith("token"),
        )
        trainer._buffered_inputs = split_tensor_dict(batch, steps)
    buffered: list[dict[str, Any]] = trainer._buffered_inputs
    return buffered[step % steps]


@cache
def rank_balanced(trainer_cls: type) -> type:
    """`trainer_cls` (TRL's GRPOTrainer, or a subclass) with each scored generation batch dealt across the ranks
    by tokens (`exchanged`) in place of TRL's per-rank shuffle, and the step's imbalance measured
    (`balance_figures`). `deal_rows = False` on an instance keeps TRL's shuffle and measures only (the benchmark's
    baseline); it is set False at construction when `deal_refusal` names a reason. The reference and old-policy
    forwards of the scoring run on the dealt rows (`dealt_pass`) whatever the loss type (`deal_passes = False`: on
    each rank's own rows), their imbalance measured too."""

    class RankBalanced(trainer_cls):  # type: ignore[misc]  # a base known only at run time
        _buffered_inputs: list[dict[str, Any]] | None  # TRL's: the generation round's micro-batches

        def __init__(self, *a: Any, **kw: Any) -> None:
            super().__init__(*a, **kw)
            why = deal_refusal(self.args, self.accelerator.num_processes)
            self.deal_rows = why is None
            if why and self.accelerator.num_processes > 1:
                log.warning("rows are not balanced across ranks (%s); the imbalance is still measured", why)
            self.deal_passes = self.accelerator.num_processes > 1  # the reference/old-policy forwards' rows too
            self._balance_seen: list[tuple[float, float]] = []  # (tokens, seconds) of this window's micro-steps
            self._passes_seen: list[tuple[float, float]] = []  # the same for the passes' chunks
            self._balance_prepare = (0.0, 0.0)  # (tokens, seconds of generation) of the micro-step being prepared
            self._balance_figures: dict[str, float] = {}
            self._scoring_thread: int | None = None  # the thread inside TRL's scoring of a training batch

        def _prepare_inputs(self, generation_batch: list[dict[str, Any]]) -> dict[str, Any]:
            start = time.perf_counter()
            if self.model.training and self.deal_rows:
                inputs = self._dealt_inputs(generation_batch)
            else:
                inputs = super()._prepare_inputs(generation_batch)
            self._balance_prepare = (float(processed_tokens(inputs)), time.perf_counter() - start)
            return inputs

        def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
            self._scoring_thread = threading.get_ident() if self.model.training else None
            try:
                out: dict[str, Any] = super()._generate_and_score_completions(inputs)
            finally:
                self._scoring_thread = None
            return out

        def _get_per_token_logps_and_entropies(
            self,
            model: torch.nn.Module,
            input_ids: torch.Tensor,
            attention_mask: torch.Tensor,
            logits_to_keep: int,
            batch_size: int | None = None,
            compute_entropy: bool = False,
            compute_aux_loss: bool = False,
            **extra: Any,
        ) -> LogpsOut:
            """TRL's, measured, and on the dealt rows (`dealt_pass`) for the passes of a training batch's scoring:
            the reference and old-policy forwards, without gradient."""
            whole: Callable[..., LogpsOut] = super()._get_per_token_logps_and_entropies  # TRL's is untyped

            def forward(ids: torch.Tensor, mask: torch.Tensor, keep: int) -> LogpsOut:
                kw = {
                    "batch_size": batch_size,
                    "compute_entropy": compute_entropy,
                    "compute_aux_loss": compute_aux_loss,
                }
                return whole(model, ids, mask, keep, **kw, **extra)

            in_scoring = self._scoring_thread == threading.get_ident()
            return measured_pass(
                self, forward, in_scoring, input_ids, attention_mask, logits_to_keep, batch_size, extra
            )

        def _dealt_inputs(self, generation_batch: list[dict[str, Any]]) -> dict[str, Any]:
            return dealt_inputs(self, generation_batch)

        def training_step(
            self, model: torch.nn.Module, inputs: dict[str, Any], num_items_in_batch: torch.Tensor | int | None
        ) -> torch.Tensor:
            start = time.perf_counter()
            out: torch.Tensor = super().training_step(model, inputs, num_items_in_batch)
            tokens, preparing = self._balance_prepare
            self._balance_seen.append((tokens, time.perf_counter() - start - preparing))
            if self._step % self.current_gradient_accumulation_steps == 0:
                self._balance_figures = self._measured()
                self._balance_seen = []
            return out

        def _measured(self) -> dict[str, float]:
            """The window's imbalance, the update's and the passes' (when it ran any: then on every rank); a
            collective (every rank ends the window together)."""
            out = window_figures(self.accelerator, self._balance_seen)
            if self._passes_seen:
                out.update(window_figures(self.accelerator, self._passes_seen, "passes_"))
                self._passes_seen = []
            return out

        def balance_figures(self) -> dict[str, float]:
            """The last optimizer step's imbalance (metrics.jsonl keys), once."""
            out, self._balance_figures = self._balance_figures, {}
            return out

    RankBalanced.__name__ = RankBalanced.__qualname__ = f"RankBalanced{trainer_cls.__name__}"
    return RankBalanced
