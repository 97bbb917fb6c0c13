"""No compute on padding: TRL's GRPOTrainer pads a rank's whole generation batch to its longest prompt (left) and
longest completion (right) and then runs every micro-batch — the policy's forward/backward and the reference's and
old policy's forwards — at that width. With one row per micro-batch and a few long completions among many short,
most of those tokens are padding. Here each chunk TRL hands the model is cut to the columns some row of the chunk
attends, and the log-probs are padded back to TRL's width (the cut columns are masked out of every loss term).

Equal to the untrimmed computation: attention is causal, so the cut right-hand columns never reach a kept token;
the cut left-hand columns are masked keys; RoPE depends only on relative positions, so a row's shifted start
position changes nothing but rounding."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    # TRL's per-token log-probs, entropies and auxiliary loss of a batch
    LogpsOut = tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]


def attended_columns(attention_mask: torch.Tensor, logits_to_keep: int) -> tuple[int, int]:
    """[first, end) of the columns some row of `attention_mask` attends, never cutting into the last
    `logits_to_keep` columns (the completion) from the left and keeping at least one completion column."""
    width = attention_mask.size(1)
    completion_start = width - logits_to_keep
    used = attention_mask.any(dim=0).nonzero()
    if used.numel() == 0:
        return 0, width
    first = min(int(used[0]), completion_start)
    end = max(int(used[-1]) + 1, completion_start + 1)
    return first, end


@cache
def padding_trimmed(trainer_cls: type) -> type:
    """`trainer_cls` (TRL's GRPOTrainer) with each model call of `_get_per_token_logps_and_entropies` run on its
    chunk's attended columns only. Multimodal inputs (per-image tensors TRL slices by row) keep TRL's own path."""
    import torch.nn.functional as F

    class PaddingTrimmed(trainer_cls):  # type: ignore[misc]  # a base known only at run time
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
            whole: Callable[..., LogpsOut] = super()._get_per_token_logps_and_entropies  # TRL's is untyped
            if any(v is not None for v in extra.values()):
                return whole(
                    model,
                    input_ids,
                    attention_mask,
                    logits_to_keep,
                    batch_size=batch_size,
                    compute_entropy=compute_entropy,
                    compute_aux_loss=compute_aux_loss,
                    **extra,
                )
            import torch

            batch_size = batch_size or input_ids.size(0)
            width = input_ids.size(1)
            logps, entropies, aux = [], [], []
            for start in range(0, input_ids.size(0), batch_size):
                ids, mask = input_ids[start : start + batch_size], attention_mask[start : start + batch_size]
                first, end = attended_columns(mask, logits_to_keep)
                cut = width - end  # completion columns no row of the chunk attends
                lp, ent, ax = whole(
                    model,
                    ids[:, first:end],
                    mask[:, first:end],
                    logits_to_keep - cut,
                    compute_entropy=compute_entropy,
                    compute_aux_loss=compute_aux_loss,
                )
                logps.append(F.pad(lp, (0, cut)))
                if ent is not None:
                    entropies.append(F.pad(ent, (0, cut)))
                if ax is not None:
                    aux.append(ax)
            return (
                torch.cat(logps, dim=0),
                torch.cat(entropies, dim=0) if compute_entropy else None,
                torch.stack(aux).mean() if compute_aux_loss else None,
            )

    PaddingTrimmed.__name__ = PaddingTrimmed.__qualname__ = f"PaddingTrimmed{trainer_cls.__name__}"
    return PaddingTrimmed
