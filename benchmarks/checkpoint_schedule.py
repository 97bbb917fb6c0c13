"""Gradient checkpointing per micro-batch (issue 51, rlt.checks.checkpoint_layers.LayerSchedule and the trainer's
rlt.stages.checkpoint_layers.PerMicroBatch) against one layer count for every micro-batch, on a real model
(SmolLM2-135M, fp32, CPU), both arms in one process on the same micro-batches: rows spread evenly in length up to
`--longest` tokens, one per micro-batch, as the plan assumes of sft's rows.

The fixed arm keeps the last `--kept` of the model's 30 decoder layers for every micro-batch: the count a GPU's room
allows the longest micro-batch (the room here is what the longest micro-batch saves with that count). The schedule
arm keeps, per micro-batch, the most layers whose activations (the plan's bytes per token,
rlt.checks.plan_terms.activations) fit the same room. Reported per arm: the seconds of the forwards and backwards
(arms run A B B A), the decoder layers recomputed, and the most bytes autograd held for one micro-batch's backward
(counted by storage through saved_tensors_hooks; the LM head's logits included), which must not pass the fixed
arm's: the schedule buys time with room the longest micro-batch leaves unused, never with more memory. The losses'
gradients must agree.

    PYTHONPATH=training python benchmarks/checkpoint_schedule.py      # about 2 minutes on one loaded core

Measured (2026-11-29, one core beside a training run): the schedule kept 28, 13, 8 and 6 layers for rows of 96..384
tokens; 65 layers recomputed against 96, the most bytes held 192.9 MiB in both arms, the gradients equal; time 1.04x
the fixed arm's with glibc's default allocator and 0.98x with MALLOC_MMAP_THRESHOLD_=4294967296
MALLOC_TRIM_THRESHOLD_=68719476736 MALLOC_TOP_PAD_=1073741824 (the kept activations are fresh memory, page-faulted
on every micro-batch on a CPU; SmolLM2's 49k-token head, which nothing recomputes, is a fifth of its parameters).
On a GPU the caching allocator reuses the blocks and the step is bound by its FLOPs: the plan charges the FLOPs.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time


def parse(argv: list[str] | None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="builtin:smollm2-135m-instruct")
    ap.add_argument("--rows", type=int, default=4, help="micro-batches (one row each), lengths spread evenly")
    ap.add_argument("--longest", type=int, default=384, help="tokens of the longest row")
    ap.add_argument("--kept", type=int, default=6, help="layers the longest micro-batch keeps (the fixed arm's)")
    ap.add_argument("--threads", type=int, default=1)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    opts = parse(argv)
    import torch
    from transformers import AutoModelForCausalLM

    from rlt.checks.checkpoint_layers import LayerChoice, schedule
    from rlt.checks.plan_terms import activations
    from rlt.checks.shapes import shape_of_config
    from rlt.data.models import resolve_model_path
    from rlt.stages.checkpoint_layers import PerMicroBatch, decoder_layers, keep_activations

    torch.set_num_threads(opts.threads)
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(resolve_model_path(opts.model), dtype=torch.float32).train()
    base.config.use_cache = False
    shape = shape_of_config(base.config, opts.model)
    layers = shape.layers
    room = activations(shape, 1, opts.longest, opts.kept, 4)
    choice = LayerChoice("bench", layers, opts.kept, f"--kept {opts.kept}")
    plan = schedule(choice, lambda k, share: activations(shape, 1, max(1, round(opts.longest * share)), k, 4) <= room)
    lengths = [round(opts.longest * (i + 1) / opts.rows) for i in range(opts.rows)]
    g = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, base.config.vocab_size, (1, n), generator=g) for n in lengths]

    arms = {}
    for name in ("fixed", "schedule"):
        model = copy.deepcopy(base)
        model.activation_checkpointing_enable()
        keep_activations(model, opts.kept, "bench")
        hook = None
        if name == "schedule":
            hook = PerMicroBatch(decoder_layers(model), plan, opts.longest, "cpu")
            model.register_forward_pre_hook(hook, with_kwargs=True)
        calls = [0]
        for layer in decoder_layers(model):
            layer.mlp.register_forward_pre_hook(lambda *_, calls=calls: calls.__setitem__(0, calls[0] + 1))
        arms[name] = {"model": model, "hook": hook, "calls": calls, "seconds": [], "held": 0, "grads": None}

    def measure(arm: dict) -> None:
        """One untimed pass: the bytes autograd holds per micro-batch, the layers recomputed, the gradients."""
        model, start = arm["model"], arm["calls"][0]
        model.zero_grad()
        params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        for ids in batches:
            saved: dict[int, int] = {}

            def pack(t, saved=saved):
                saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
                return t

            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                loss = model(input_ids=ids, labels=ids).loss
            arm["held"] = max(arm["held"], sum(n for ptr, n in saved.items() if ptr not in params))
            loss.backward()
        arm["recomputed"] = arm["calls"][0] - start - layers * len(batches)
        arm["grads"] = [p.grad.clone() for p in model.parameters()]
        if arm["hook"] is not None:
            arm["hook"].counts.clear()

    def run(arm: dict) -> None:
        model = arm["model"]
        model.zero_grad()
        t0 = time.perf_counter()
        for ids in batches:
            model(input_ids=ids, labels=ids).loss.backward()
        arm["seconds"].append(time.perf_counter() - t0)
        print(f"{'fixed' if arm is arms['fixed'] else 'schedule'}: {arm['seconds'][-1]:.1f} s", flush=True)

    for arm in arms.values():
        measure(arm)
    for name in ["fixed", "schedule", "schedule", "fixed"]:
        run(arms[name])
    fixed, sched = arms["fixed"], arms["schedule"]
    agree = all(torch.allclose(a, b, atol=1e-5) for a, b in zip(fixed["grads"], sched["grads"], strict=True))
    secs = {n: sum(a["seconds"]) / len(a["seconds"]) for n, a in arms.items()}
    print(
        f"\n{opts.model} ({layers} decoder layers, fp32, {opts.threads} threads): {opts.rows} micro-batches of one row, "
        f"{lengths[0]}..{opts.longest} tokens; the longest keeps {opts.kept} layers"
    )
    print(plan.line("schedule", opts.longest))
    kept = sorted(sched["hook"].counts.items(), reverse=True)
    print(
        "| arm | layers kept per micro-batch | layers recomputed | seconds (A B B A mean) | most bytes held for a backward |"
    )
    print("|---|---|---:|---:|---:|")
    print(
        f"| fixed | {opts.kept} each | {fixed['recomputed']} | {secs['fixed']:.2f} | {fixed['held'] / 2**20:.1f} MiB |"
    )
    shown = ", ".join(f"{k} × {n // 2}" for k, n in kept)  # the hook counted both timed schedule runs
    print(f"| schedule | {shown} | {sched['recomputed']} | {secs['schedule']:.2f} | {sched['held'] / 2**20:.1f} MiB |")
    ratio = secs["schedule"] / secs["fixed"]
    ok = agree and sched["held"] <= fixed["held"] and sched["recomputed"] < fixed["recomputed"]
    print(
        f"schedule / fixed: time {ratio:.2f}x, recomputed layers {sched['recomputed']} / {fixed['recomputed']}, "
        f"most held {sched['held'] / fixed['held']:.2f}x (must be <= 1); gradients agree: {agree} -> "
        f"{'PASS' if ok else 'FAIL'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
