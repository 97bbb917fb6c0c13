"""Rows across the ranks of a stage: the process group, each rank's share of the rows, and the shares gathered back."""

from __future__ import annotations

from typing import Any, TypeVar

from rlt.spec.budgets import collective_timeout_seconds
from rlt.stages.context import StageContext, world_size
from rlt.stages.record import announce_world, trace_line

Row = TypeVar("Row")


def join_process_group(device: str, timeout_s: float | None = None) -> tuple[int, int]:
    """(rank, world size) of this process; the one place a stage makes its process group. Under a launcher
    (WORLD_SIZE > 1) it joins it: gloo on CPU, NCCL on GPU (call `rank_device` first so NCCL uses this rank's GPU).
    On CPU accelerate's PartialState is made over the same group, so a Trainer with `use_configured_state` joins it
    too (accelerate alone would make none for DeepSpeed without CUDA). `timeout_s`: how long a collective waits for
    the slowest rank (rlt.spec.budgets.collective_timeout_seconds; torch's 30 minutes when None)."""
    if world_size() <= 1:
        return 0, 1
    from datetime import timedelta

    import torch.distributed as dist

    from rlt.data.models import is_cuda

    cuda = is_cuda(device)
    if not dist.is_initialized():
        dist.init_process_group(
            backend="nccl" if cuda else "gloo",
            timeout=timedelta(seconds=timeout_s) if timeout_s else None,
        )
    if not cuda:
        from accelerate import PartialState

        PartialState(backend="gloo")
    return dist.get_rank(), dist.get_world_size()


def my_share(items: list[Row], rank: int, world: int) -> list[tuple[int, Row]]:
    """This rank's rows with their global index: every `world`-th one from `rank` (shares differ by one at most)."""
    return [(i, item) for i, item in enumerate(items) if i % world == rank]


def shard_rows(ctx: StageContext, stage: str, rows: list[Row]) -> tuple[int, int, list[tuple[int, Row]]]:
    """(rank, world size, this rank's rows with their index) for a stage whose ranks split the rows (distill,
    evaluate): joins the process group, says which world and which rows (the rlt-world and rlt-shard lines)."""
    rank, world = join_process_group(ctx.compute_device, collective_timeout_seconds(ctx.spec, stage))
    announce_world(stage)
    share = my_share(rows, rank, world)
    trace_line(f"rlt-shard stage={stage} rank={rank} rows={','.join(str(i) for i, _ in share)}")
    return rank, world, share


def gather_shares(share: list[tuple[int, Row]], rank: int, world: int, total: int) -> list[Row] | None:
    """Every rank's (index, result) pairs, on rank 0 only, in global index order; None on the other ranks.
    Refuses a duplicate or missing index: the merged output must have each row exactly once."""
    parts: list[list[tuple[int, Row]]]
    if world == 1:
        parts = [share]
    else:
        import torch.distributed as dist

        gathered: list[Any] | None = [None] * world if rank == 0 else None
        dist.gather_object(share, gathered, dst=0)
        if rank != 0 or gathered is None:  # gathered is None exactly when rank != 0
            return None
        parts = gathered
    merged = sorted((pair for part in parts for pair in part), key=lambda p: p[0])
    indices = [i for i, _ in merged]
    if indices != list(range(total)):
        raise RuntimeError(
            f"the ranks returned rows {indices}: duplicates or gaps (expected each of 0..{total - 1} once)"
        )
    return [item for _, item in merged]


def leave_process_group() -> None:
    """Without it a gloo rank aborts at exit (`terminate called without an active exception`)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
