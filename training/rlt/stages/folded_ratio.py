"""TRL's vLLM importance-sampling ratio from the update's own forward, without TRL's separate old-policy pass.

With vLLM and its importance sampling on, TRL runs one more no-grad forward of the policy over every scored row
(`old_per_token_logps`) and weighs each token's loss by exp(log π_θ − log μ), μ the sampler's log-prob, truncated or
masked at the cap (vllm_importance_sampling_mode). rlt generates once per optimizer step and updates once on it
(num_iterations 1, steps_per_generation dividing the gradient accumulation): the weights do not change between that
pass and the update's micro-batches, so the update's forward computes the same log-probs. Here the pass is skipped
(TRL's flag is off while it scores) and the ratio is made from the update's log-probs, detached, before TRL's loss
reads it: the loss, its gradient and the ratio are those of TRL's two passes (tests/training/test_folded_ratio.py),
one forward of the policy per row fewer (docs/goodput.md: 1.05 of a 2x8 step's 6.9 min).

The ratio's four modes are TRL's (grpo_trainer._generate_and_score_completions, which does not expose them as a
function); the test holds this copy to TRL's own output."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

    LogpsOut = tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]
    RatioSeen = Callable[[torch.Tensor, torch.Tensor], None]  # (ratio, completion mask) of each micro-batch


class FoldedTrainer(Protocol):
    fold_ratio: bool  # whether this trainer folds (foldable)
    ratio_seen: RatioSeen | None


def importance_ratio(
    policy: torch.Tensor,
    sampling: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    clip_min: float | None,
    clip_max: float | None,
) -> torch.Tensor:
    """TRL's vLLM importance-sampling ratio: exp(policy − sampling) per token ([B, T]) or per sequence ([B, 1],
    the masked sum), truncated to [clip_min, clip_max] or set to 0 outside it. Tokens vLLM could not score (NaN)
    weigh 1."""
    import torch

    diff = torch.nan_to_num((policy - sampling) * mask, nan=0.0)
    if mode.startswith("sequence"):
        diff = diff.sum(dim=-1, keepdim=True)
    ratio = torch.exp(diff)
    if mode.endswith("truncate"):
        return torch.clamp(ratio, min=clip_min, max=clip_max)
    if mode.endswith("mask"):
        low = -math.inf if clip_min is None else clip_min
        high = math.inf if clip_max is None else clip_max
        return ratio.masked_fill((ratio < low) | (ratio > high), 0.0)
    raise ValueError(f"vllm_importance_sampling_mode: {mode!r} is not one of TRL's four")


def foldable(trainer: Any) -> bool:
    """The old-policy pass equals the update's forward: TRL's vLLM importance sampling on, one update per generation
    batch, the generation batch within one optimizer step (a GRPOTrainer's own attributes, as TRL reads them)."""
    args = trainer.args
    return bool(
        trainer.use_vllm
        and trainer.vllm_importance_sampling_correction
        and trainer.num_iterations == 1
        and args.gradient_accumulation_steps % args.steps_per_generation == 0
    )


class SamplingStats:
    """TRL's sampling metrics (sampling/importance_sampling_ratio/{min,mean,max}, sampling/sampling_logp_difference/
    {mean,max}) of one generation batch, gathered micro-batch by micro-batch on this rank: TRL computes them on the
    whole batch while it scores, which folded happens in the update's micro-batches instead. `log` reduces them
    across ranks as TRL does (a rank's means, averaged; the extremes of the ranks'; 0 for a rank with no token).
    With rank balancing (rlt.stages.balance) a rank's rows are those dealt to it, not those it sampled: the extremes
    are TRL's still, the means (a mean of the ranks' means) may differ a little."""

    def __init__(self) -> None:
        self.ratio: list[torch.Tensor] = []
        self.delta: list[torch.Tensor] = []

    def add(self, ratio: torch.Tensor, delta: torch.Tensor) -> None:
        self.ratio.append(ratio.detach().float())
        self.delta.append(delta.detach().float())

    def log(self, gather: Callable[[torch.Tensor], torch.Tensor], metrics: dict[str, list[float]]) -> None:
        import torch

        ratio, delta = torch.cat(self.ratio), torch.cat(self.delta)

        def rank(values: torch.Tensor) -> list[torch.Tensor]:
            if not values.numel():
                return [values.new_zeros(())] * 3
            return [values.min(), values.mean(), values.max()]

        r_min, r_mean, r_max = rank(ratio)
        _, d_mean, d_max = rank(delta)
        ranks = gather(torch.stack([r_min, r_mean, r_max, d_mean, d_max])).view(-1, 5)
        metrics["sampling/sampling_logp_difference/mean"].append(ranks[:, 3].mean().item())
        metrics["sampling/sampling_logp_difference/max"].append(ranks[:, 4].max().item())
        metrics["sampling/importance_sampling_ratio/min"].append(ranks[:, 0].min().item())  # the ratio has no NaN
        metrics["sampling/importance_sampling_ratio/mean"].append(ranks[:, 1].mean().item())
        metrics["sampling/importance_sampling_ratio/max"].append(ranks[:, 2].max().item())


def folded_ratio(trainer_cls: type) -> type:
    """`trainer_cls` (TRL's GRPOTrainer) that, when `foldable`, scores without the old-policy pass and weighs each
    micro-batch's loss by the ratio of its own forward (the module's docstring). `ratio_seen`, when set, gets each
    micro-batch's ratio and completion mask (rlt counts the share truncated or masked)."""

    class FoldedRatio(trainer_cls):  # type: ignore[misc]  # a base known only at run time
        ratio_seen: RatioSeen | None = None

        def __init__(self, *a: Any, **kw: Any) -> None:
            super().__init__(*a, **kw)
            self.fold_ratio = foldable(self)
            self._loss_inputs: dict[str, Any] | None = None  # the micro-batch whose forward makes the ratio
            self._sampling: dict[str, SamplingStats] = {}  # the generation batch's so far, per mode

        def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
            if not self.fold_ratio:
                out: dict[str, Any] = super()._generate_and_score_completions(inputs)
                return out
            self.vllm_importance_sampling_correction = False  # TRL: no old-policy pass, no ratio yet
            try:
                out = super()._generate_and_score_completions(inputs)
            finally:
                self.vllm_importance_sampling_correction = True
            if out.get("sampling_per_token_logps") is None:
                raise RuntimeError("importance sampling: the rollout returned no sampled log-probs to weigh by")
            return out

        def _compute_loss(self, model: torch.nn.Module, inputs: dict[str, Any]) -> torch.Tensor:
            if self.fold_ratio and inputs.get("old_per_token_logps") is not None:
                # GRPO's clip would then weigh π_θ/old and the ratio weigh π_θ/μ again: a correction counted twice
                raise RuntimeError(
                    "folded importance ratio: the batch carries old_per_token_logps; TRL's importance sampling and "
                    "a behaviour policy's log-probs as old-policy log-probs would both correct the same lag"
                )
            self._loss_inputs = inputs if self.fold_ratio else None
            try:
                loss: torch.Tensor = super()._compute_loss(model, inputs)
            finally:
                self._loss_inputs = None
            return loss

        def _get_per_token_logps_and_entropies(self, model: torch.nn.Module, *a: Any, **kw: Any) -> LogpsOut:
            out: LogpsOut = super()._get_per_token_logps_and_entropies(model, *a, **kw)
            inputs, self._loss_inputs = self._loss_inputs, None  # the loss's own forward is its first call
            if inputs is not None:
                self._weigh(inputs, out[0].detach())
            return out

        def _weigh(self, inputs: dict[str, Any], policy: torch.Tensor) -> None:
            mask = inputs["completion_mask"]
            if "tool_mask" in inputs:
                mask = mask * inputs["tool_mask"]
            sampling = inputs["sampling_per_token_logps"]
            ratio = importance_ratio(
                policy,
                sampling,
                mask,
                self.vllm_importance_sampling_mode,
                self.vllm_importance_sampling_clip_min,
                self.vllm_importance_sampling_clip_max,
            )
            inputs["importance_sampling_ratio"] = ratio
            if self.ratio_seen is not None and self.model.training:
                self.ratio_seen(ratio, inputs["completion_mask"])
            valid = mask.bool()
            delta = (policy - sampling).abs()[valid]
            # TRL's sampling metrics are over a generation batch: in training the steps_per_generation micro-batches
            # that TRL's own counter (_step, this micro-batch's index) cuts from one rollout, in evaluation one; every
            # rank runs as many, so the gather meets on all of them
            spg, training = self.args.steps_per_generation, self.model.training
            mode = "train" if training else "eval"
            if not training or self._step % spg == 0:  # a generation batch's first: whatever an error left goes
                self._sampling[mode] = SamplingStats()
            stats = self._sampling[mode]
            stats.add(ratio.flatten() if ratio.shape[-1] == 1 else ratio[valid], delta[~delta.isnan()])
            if not training or (self._step + 1) % spg == 0:
                stats.log(self.accelerator.gather, self._metrics[mode])
                del self._sampling[mode]

    FoldedRatio.__name__ = FoldedRatio.__qualname__ = f"FoldedRatio{trainer_cls.__name__}"
    return FoldedRatio
