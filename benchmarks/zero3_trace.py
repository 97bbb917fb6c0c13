"""Why the layers kept per micro-batch stay one count under ZeRO-3 (issue 51, docs/goodput.md): DeepSpeed's ZeRO-3
prefetches each module's parameters along the order it recorded over one forward and backward
(PartitionedParameterCoordinator's trace); a checkpointed layer runs its forward again in the backward pass, so a
count that changes between micro-batches changes that order, and DeepSpeed drops the trace ("Invalidate trace
cache"), its prefetch off for that pass and the next while it records again.

Every arm in each rank of a gloo world (--ranks, 2 by default: one process each, one thread each), DeepSpeed ZeRO-3
on a tiny random Qwen2 (LAYERS, 12), each rank its own micro-batches of alternating lengths, the same in every arm: arm "one count" keeps the last 2 layers for every micro-batch
(keep_activations); arm "per micro-batch" runs the trainer's own hook (rlt.stages.checkpoint_layers.PerMicroBatch)
with a schedule that keeps 2 layers for the short micro-batches and none for the long; arm "one count, selective"
keeps the last layer and makes the two before it selective (rlt.stages.checkpoint_layers.checkpoint_selectively:
what the plan does under ZeRO-3), so their recompute finds the matmuls' outputs cached but runs the same modules;
the q/k/v biases are random, not zero, so DeepSpeed's linear (zero3_linear_wrap, which adds the bias in place to a
kept output) would show in the losses if the recompute added them twice.
Arm "none checkpointed" runs without gradient checkpointing: the gathers a backward needs anyway.
Reported per arm: the trace invalidations DeepSpeed printed (log_trace_cache_warnings), the layers kept per
micro-batch, the largest difference of its 12 losses from the one-count arm's (the same seeds: the same training,
up to float rounding), and the parameters DeepSpeed gathered per micro-batch (its coordinator's all-gathers,
counted): a recompute, selective or not, should gather nothing the backward right after it does not use, as the
plan assumes (it charges a selective layer's recompute its memory-bound ops only). The losses are compared on every
rank; the table is rank 0's. Last, the collectives (gathers) the selective layers' checkpoints ran inside: recorded
in the forwards, run in the recomputes. With more than one rank they differ, as DeepSpeed's prefetch falls; torch's
own recompute mode raises where the recompute runs more of one kind than the forward recorded, rlt's runs them
(rlt.stages.checkpoint_layers.lenient_recompute).

    PYTHONPATH=training python benchmarks/zero3_trace.py      # about 4 minutes on 2 cores

Measured (2026-11-29, 4 layers): one count 0 invalidations in 12 micro-batches, per micro-batch 6; one count
with 2 selective layers 0, its 12 losses exactly those of one count (1.9e-2 apart when the recompute adds the
in-place bias a second time: the policy's defect a review found, fixed in rlt.stages.checkpoint_layers
.selective_policy). Again with 12 layers (2026-11-29, 3.8 min beside a teaching unit): the same invalidations and
losses; parameters gathered per micro-batch 1.68 × the model's in one count, one count selective and none
checkpointed alike, 2.67 × per micro-batch. On 2 ranks (2026-11-29, 4 min beside a teaching unit): the same table
on rank 0, every arm's losses equal to one count's on both ranks, and the collectives inside the selective
checkpoints 18 in the forwards and 16 in the recomputes on each rank (of 24 checkpoints: most layers' parameters
arrive by prefetch before their checkpoint starts).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import multiprocessing
import os
import socket
import sys
from typing import Any

LAYERS = 12  # more than the 4.3 layers DeepSpeed keeps gathered (below): a layer's parameters are released
# The benchmark's tiny Qwen2: a decoder layer's parameters and the whole model's (tied embeddings).
LAYER_PARAMS = 2 * 64 * 64 + 2 * 64 * 32 + 64 + 2 * 32 + 3 * 64 * 128 + 2 * 64
MODEL_PARAMS = LAYERS * LAYER_PARAMS + 97 * 64 + 64


def one_rank(rank: int, world: int, port: int, answers: Any) -> None:
    """Every arm on this rank of a `world`-rank gloo world; its results on `answers`."""
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    import deepspeed
    import torch
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus
    from deepspeed.runtime.zero.partitioned_param_coordinator import PartitionedParameterCoordinator as Coordinator
    from torch.utils.checkpoint import _CachingTorchDispatchMode
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rlt.checks.checkpoint_layers import LayerSchedule
    from rlt.stages.checkpoint_layers import (
        PerMicroBatch,
        checkpoint_selectively,
        decoder_layers,
        keep_activations,
        lenient_recompute_mode,
    )

    torch.set_num_threads(1)
    deepspeed.init_distributed(dist_backend="gloo")
    # the collectives run inside selective checkpoints: recorded by the forward (torch's caching mode), run by the
    # recompute (rlt's lenient mode); torch's own cached mode raises where the recompute runs more of them
    collectives = {"forward": 0, "recompute": 0}
    for phase, mode in (("forward", _CachingTorchDispatchMode), ("recompute", lenient_recompute_mode())):

        def counting(self, func, types, args=(), kwargs=None, _inner=mode.__torch_dispatch__, _phase=phase):  # type: ignore[no-untyped-def]
            collectives[_phase] += "c10d" in str(func)
            return _inner(self, func, types, args, kwargs)

        mode.__torch_dispatch__ = counting
    gathered = [0]  # parameters DeepSpeed gathers (all-gathers from their partitions), counted as they are fetched
    fetch = Coordinator._PartitionedParameterCoordinator__all_gather_params  # type: ignore[attr-defined]

    def counted(self, params, forward):  # type: ignore[no-untyped-def]
        gathered[0] += sum(p.ds_numel for p in params if p.ds_status == ZeroParamStatus.NOT_AVAILABLE)
        return fetch(self, params, forward)

    Coordinator._PartitionedParameterCoordinator__all_gather_params = counted  # type: ignore[attr-defined]
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-4}},
        # rlt leaves stage3_max_live_parameters and stage3_max_reuse_distance at DeepSpeed's 1e9: 4.3 of a 7B's
        # decoder layers (233 M parameters each). The same 4.3 layers of this model (LAYER_PARAMS), so a layer's
        # parameters are released between its forward and its backward, and kept between a recompute and the
        # backward right after it, as on a 7B.
        "zero_optimization": {
            "stage": 3,
            "log_trace_cache_warnings": True,
            "stage3_param_persistence_threshold": 0,
            "stage3_max_live_parameters": int(4.3 * LAYER_PARAMS),
            "stage3_max_reuse_distance": int(4.3 * LAYER_PARAMS),
        },
        "zero_allow_untested_optimizer": True,
    }
    lengths = [8, 32] * 6
    results = {}
    for arm in ("one count", "per micro-batch", "one count, selective", "none checkpointed"):
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(
            Qwen2Config(
                vocab_size=97,
                hidden_size=64,
                intermediate_size=128,
                num_hidden_layers=LAYERS,
                num_attention_heads=4,
                num_key_value_heads=2,
            )  # fmt: skip
        )
        with torch.no_grad():  # trained Qwen2 q/k/v biases are far from a fresh model's zeros: DeepSpeed's linear
            for name, p in model.named_parameters():  # adds them in place to a selective layer's kept matmul output
                if name.endswith("proj.bias"):
                    p.normal_(0, 1.0, generator=torch.Generator().manual_seed(2))
        assert sum(p.numel() for p in model.model.layers[0].parameters()) == LAYER_PARAMS
        if arm != "none checkpointed":
            model.activation_checkpointing_enable()
        if arm == "one count, selective":
            keep_activations(model, 1, "bench")
            checkpoint_selectively(model, 1, 2, "bench")
        elif arm != "none checkpointed":
            keep_activations(model, 2, "bench")
        hook = None
        if arm == "per micro-batch":
            hook = PerMicroBatch(decoder_layers(model), LayerSchedule(LAYERS, 0, ((0.5, 2),)), max(lengths), "cpu")
            model.register_forward_pre_hook(hook, with_kwargs=True)
        engine, *_ = deepspeed.initialize(model=model, config=config, model_parameters=model.parameters())
        printed = io.StringIO()
        g = torch.Generator().manual_seed(1 + rank)  # each rank its own rows
        losses, gathers = [], []
        collectives.update(forward=0, recompute=0)
        with contextlib.redirect_stdout(printed):
            for n in lengths:
                ids = torch.randint(0, 97, (1, n), generator=g)
                gathered[0] = 0
                loss = engine(input_ids=ids, labels=ids).loss
                losses.append(loss.item())
                engine.backward(loss)
                engine.step()
                gathers.append(gathered[0])
        kept = dict(hook.counts) if hook else {0 if arm == "none checkpointed" else 1 if "selective" in arm else 2: 12}
        # the first two micro-batches record DeepSpeed's trace (no prefetch yet); the median of the rest
        results[arm] = (
            printed.getvalue().count("Invalidate trace cache"),
            kept,
            losses,
            sorted(gathers[2:])[5],
            dict(collectives),
        )
    answers.put((rank, results))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=2, help="gloo ranks (processes), each a CPU thread")
    args = p.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = multiprocessing.get_context("spawn")
    answers = ctx.Queue()
    ranks = [ctx.Process(target=one_rank, args=(r, args.ranks, port, answers)) for r in range(args.ranks)]
    for proc in ranks:
        proc.start()
    by_rank = dict(answers.get(timeout=3600) for _ in ranks)
    for proc in ranks:
        proc.join()
    results = by_rank[0]
    print(
        f"\nDeepSpeed ZeRO-3, {args.ranks} gloo rank(s), tiny Qwen2 of {LAYERS} layers; 12 micro-batches of 8 and 32 "
        "tokens alternating; rank 0's figures"
    )
    print(
        "| arm | layers kept per micro-batch | trace invalidations | losses' largest difference from one count's "
        "| parameters gathered per micro-batch (median after the first two), × the model's |"
    )
    print("|---|---|---:|---:|---:|")
    drift = {
        arm: max(abs(a - b) for rs in by_rank.values() for a, b in zip(rs[arm][2], rs["one count"][2], strict=True))
        for arm in results
    }
    for arm, (count, kept, _, gathers, _) in results.items():
        shown = ", ".join(f"{k} × {n}" for k, n in sorted(kept.items(), reverse=True))
        print(f"| {arm} | {shown} | {count} | {drift[arm]:.1e} | {gathers / MODEL_PARAMS:.2f} |")
    inside = {r: rs["one count, selective"][4] for r, rs in sorted(by_rank.items())}
    print(
        "collectives inside the selective checkpoints (forwards recorded, recomputes run), per rank: "
        + ", ".join(f"rank {r}: {c['forward']}, {c['recompute']}" for r, c in inside.items())
    )
    selective = results["one count, selective"][0] == 0 and drift["one count, selective"] < 1e-5
    # a selective layer's recompute gathers nothing the backward would not: the same parameters as no checkpointing
    same_gathers = results["one count, selective"][3] == results["none checkpointed"][3]
    return 0 if results["one count"][0] == 0 < results["per micro-batch"][0] and selective and same_gathers else 1


if __name__ == "__main__":
    sys.exit(main())
