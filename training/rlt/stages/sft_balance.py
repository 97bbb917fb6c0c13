"""sft and student rows dealt across ranks by tokens before each step (issue 51).

Under ZeRO a micro-step lasts as long as its slowest rank; with transformers' random sampler each rank's micro-batch
is any row, so a long row on one rank holds the others. transformers' own token-balancing sampler
(train_sampling_strategy "batch_rebalance", BatchRebalanceSampler) deals one optimizer step's rows only: with the
paper's one row per micro-batch and 16 rows a step on 4 ranks, each micro-step then holds 4 consecutive rows of the
step's sorted 16, and a lone long row still waits alone (1.38 on benchmarks/rank_balance.py's length mix).

`StepDeal` keeps transformers' sampler (rank-aware, shuffled by seed and epoch, the same plan on every rank, the
trailing partial step as transformers deals it) and widens the deal to a window of steps (WINDOW_ROWS rows): the
window's rows sorted by tokens are cut into micro-steps of world × per-device rows, those rows dealt over the ranks
by rl's `deal` (rlt.stages.balance), and the window's micro-steps shuffled into its steps. Each micro-step's rows are
then of near-equal length; which rows share a step changes, as with any sampler (transformers' group_by_length
groups 50 batches the same way). Within a step the loss is summed over its tokens and divided by their count over
all ranks (num_items_in_batch), so where a row lands within the step does not change its gradient.

`sft_measured` puts it on TRL's SFTTrainer and measures each step's imbalance (rlt_rank_imbalance_ratio)."""

from __future__ import annotations

import math
import time
from functools import cache
from typing import TYPE_CHECKING, Any

from rlt.stages.balance import deal, window_figures

if TYPE_CHECKING:
    from collections.abc import Iterator

    import torch

# Rows a deal spans: enough that each micro-step's rows come from a dense stretch of the sorted lengths (1.02 at 4
# ranks, 1.05 at 8 on the benchmark's skewed mix, one row per micro-batch); 32 steps of the paper's 16 rows.
WINDOW_ROWS = 512


def step_deal_class() -> type:
    """StepDeal, built on transformers' BatchRebalanceSampler on first use (transformers is imported lazily)."""
    import torch
    from transformers.trainer_pt_utils import BatchRebalanceSampler

    class StepDeal(BatchRebalanceSampler):
        """Each rank's micro-batches of per_device rows, the rows of a window of steps dealt by tokens."""

        def __init__(
            self,
            lengths: list[int],
            per_device: int,
            world: int,
            grad_accum: int,
            rank: int,
            seed: int,
            drop_last: bool = False,
            window_rows: int = WINDOW_ROWS,
        ) -> None:
            step = per_device * grad_accum * world
            super().__init__(lengths, step, world, grad_accum, shuffle=True, seed=seed, rank=rank, drop_last=drop_last)
            self.per_device = per_device
            self.window = max(1, window_rows // step)  # whole steps

        def __iter__(self) -> Iterator[list[int]]:
            g = torch.Generator()
            g.manual_seed(self.seed + self.epoch)
            order: list[int] = torch.randperm(len(self.lengths), generator=g).tolist()
            step = self.effective_batch_size
            full = self.num_full_batches * step
            for start in range(0, full, self.window * step):
                yield from self.dealt(order[start : min(start + self.window * step, full)], g)
            if self.has_tail:  # the epoch's partial step, as transformers deals it (padded to every rank's slots)
                tail = order[full:]
                short = self.dp_size * self.grad_accum - len(tail)
                if short > 0:
                    tail += (order * math.ceil(short / len(order)))[:short]
                yield from self._yield_global_batch(tail)  # type: ignore[no-untyped-call]  # transformers' is untyped

        def dealt(self, rows: list[int], g: torch.Generator) -> Iterator[list[int]]:
            """This rank's micro-batches of a window of whole steps."""
            size = self.dp_size * self.per_device  # one micro-step's rows on all ranks
            ranked = sorted(rows, key=lambda i: (-self.lengths[i], i))
            groups = [ranked[k : k + size] for k in range(0, len(ranked), size)]
            for k in torch.randperm(len(groups), generator=g).tolist():
                group = groups[k]
                plan = deal([self.lengths[i] for i in group], self.dp_size, 1, self.per_device)
                yield [group[j] for j in plan[self.rank]]

    return StepDeal


@cache
def sft_measured(trainer_cls: type) -> type:
    """`trainer_cls` (TRL's SFTTrainer) with its rows dealt by `StepDeal` where transformers would deal them with
    its token-balancing sampler (train_sampling_strategy "batch_rebalance", which rlt.stages.sft sets), shuffled
    with the run's seed, and each optimizer step's rank imbalance measured (`balance_figures`): the tokens each
    rank's model computed per micro-step (rows × padded width) and its micro-step seconds."""
    from transformers.trainer_pt_utils import BatchRebalanceSampler

    step_deal = step_deal_class()

    class SftMeasured(trainer_cls):  # type: ignore[misc]  # a base known only at run time
        def __init__(self, *a: Any, **kw: Any) -> None:
            super().__init__(*a, **kw)
            self._balance_seen: list[tuple[float, float]] = []
            self._balance_figures: dict[str, float] = {}
            self._step_deal: Any = None  # the deal _get_train_sampler made (None: transformers' own sampler)

        def _get_train_sampler(self, train_dataset: Any = None) -> Any:
            sampler = super()._get_train_sampler(train_dataset)
            if not isinstance(sampler, BatchRebalanceSampler):
                return sampler  # another strategy asked for (the benchmark's baseline), or no length
            self._step_deal = step_deal(
                sampler.lengths,
                self.args.train_batch_size,
                sampler.dp_size,
                sampler.grad_accum,
                sampler.rank,
                self.args.seed if self.args.data_seed is None else self.args.data_seed,
                sampler.drop_last,
            )
            return self._step_deal

        def _run_epoch(self, model: torch.nn.Module, epoch: int, *rest: Any, **kw: Any) -> Any:
            # The deal's shuffle is seeded by the epoch. On a resume mid-epoch with several processes, transformers
            # wraps the loader to skip the trained batches and its set_epoch no longer reaches the deal (accelerate's
            # skip wrapper hides it behind the shard wrapper): the rest of the epoch would be cut from epoch 0's
            # order, training some rows twice and others never. Set it here, before the epoch's loader is iterated.
            if self._step_deal is not None:
                self._step_deal.set_epoch(epoch)
            return super()._run_epoch(model, epoch, *rest, **kw)

        def training_step(
            self, model: torch.nn.Module, inputs: dict[str, Any], num_items_in_batch: torch.Tensor | int | None = None
        ) -> torch.Tensor:
            start = time.perf_counter()
            out: torch.Tensor = super().training_step(model, inputs, num_items_in_batch)
            self._balance_seen.append((float(inputs["input_ids"].numel()), time.perf_counter() - start))
            if self.accelerator.sync_gradients:  # the optimizer step's last micro-step, on every rank
                self._balance_figures = window_figures(self.accelerator, self._balance_seen)
                self._balance_seen = []
            return out

        def balance_figures(self) -> dict[str, float]:
            """The last optimizer step's imbalance (metrics.jsonl keys), once."""
            out, self._balance_figures = self._balance_figures, {}
            return out

    SftMeasured.__name__ = SftMeasured.__qualname__ = f"SftMeasured{trainer_cls.__name__}"
    return SftMeasured
