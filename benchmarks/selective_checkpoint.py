"""Selective gradient checkpointing (issue 51, rlt.checks.checkpoint_layers.choose_selective and the trainer's
rlt.stages.checkpoint_layers.checkpoint_selectively) against full checkpointing and none, on a real model
(SmolLM2-135M, fp32, CPU, one thread), the three arms in one process on the same rows.

Every decoder layer is checkpointed fully (the recompute runs the layer's whole forward again), selectively (torch's
selective activation checkpointing with rlt's policy: the matmuls' and the attention's outputs are kept, the ops
between them recomputed) or not at all. Reported per arm:
- the bytes the process holds between the forward and the backward (glibc's mallinfo2: allocated arena chunks plus
  mmapped blocks, after the forward less before it; one thread, so one arena), the logits and the loss included;
- the matmul FLOPs of the backward pass (2·m·n·k of every mm/addmm, counted by a dispatch mode): the gradients' own
  plus what a recompute runs again;
- seconds of forward + backward (arms run A B C C B A);
- whether the gradients agree with no checkpointing's.
The plan's prediction of the bytes beside it: a selective layer holds selective_bytes_per_token, a full checkpoint
the layer's input, no checkpointing layer_bytes_per_token (rlt.checks.plan_terms), so (selective - full) /
(none - full) is the share of the activations a selective layer keeps.

    PYTHONPATH=training python benchmarks/selective_checkpoint.py      # about 3 minutes on one core

Measured (2026-11-29, one thread beside a training run): held between forward and backward 276.3 MiB (full),
944.5 (selective), 1507.4 (none): selective keeps 0.54 of what none keeps beyond full (the plan: 0.55); backward
matmuls 713.9 GFLOP (full), 550.8 (selective and none: nothing recomputed); time 16.2, 14.2, 14.1 s: selective 0.88x
full checkpointing's; the gradients of all three agree (2.5 minutes).

On a GPU the recomputed ops are memory-bound elementwise kernels (the plan charges them at their bytes over the
bandwidth: 0.17 of a Qwen2.5-7B layer's forward on an H100); a CPU runs them relatively slower, so its time ratio
is not the GPU's: the FLOPs and the bytes are the measured claim.
"""

from __future__ import annotations

import argparse
import copy
import ctypes
import sys
import time


class MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in [
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        ]
    ]


def heap_bytes() -> int:
    """Bytes the process's heap has handed out (glibc's main arena in use plus its mmapped blocks)."""
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = MallInfo2
    info = libc.mallinfo2()
    return int(info.uordblks + info.hblkhd)


def parse(argv: list[str] | None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="builtin:smollm2-135m-instruct")
    ap.add_argument("--tokens", type=int, default=1024, help="tokens of the one row")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    opts = parse(argv)
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from transformers import AutoModelForCausalLM

    from rlt.checks.plan_terms import layer_bytes_per_token, selective_bytes_per_token
    from rlt.checks.shapes import shape_of_config
    from rlt.data.models import resolve_model_path
    from rlt.stages.checkpoint_layers import checkpoint_selectively

    torch.set_num_threads(1)  # one thread: one malloc arena, so mallinfo2 sees every allocation
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(resolve_model_path(opts.model), dtype=torch.float32).train()
    base.config.use_cache = False
    shape = shape_of_config(base.config, opts.model)
    ids = torch.randint(0, base.config.vocab_size, (1, opts.tokens), generator=torch.Generator().manual_seed(1))

    class MatmulFlops(TorchDispatchMode):
        flops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default):
                a, b = args[-2], args[-1]
                MatmulFlops.flops += 2 * a.shape[0] * a.shape[1] * b.shape[1]
            return out

    arms: dict[str, dict] = {}
    for name in ("full", "selective", "none"):
        model = copy.deepcopy(base)
        if name != "none":
            model.activation_checkpointing_enable()
        if name == "selective":
            checkpoint_selectively(model, 0, shape.layers, "bench")
        arms[name] = {"model": model, "seconds": []}

    for arm in arms.values():  # one untimed pass each: the bytes held, the backward's matmuls, the gradients
        model = arm["model"]
        model.zero_grad()
        before = heap_bytes()
        loss = model(input_ids=ids, labels=ids).loss
        arm["held"] = heap_bytes() - before
        MatmulFlops.flops = 0
        with MatmulFlops():
            loss.backward()
        arm["flops"] = MatmulFlops.flops
        arm["grads"] = [p.grad.clone() for p in model.parameters()]
        del loss

    for name in ["full", "selective", "none", "none", "selective", "full"]:
        model = arms[name]["model"]
        model.zero_grad()
        t0 = time.perf_counter()
        model(input_ids=ids, labels=ids).loss.backward()
        arms[name]["seconds"].append(time.perf_counter() - t0)
        print(f"{name}: {arms[name]['seconds'][-1]:.1f} s", flush=True)

    none, full, sel = arms["none"], arms["full"], arms["selective"]
    for arm in arms.values():
        arm["agree"] = all(torch.allclose(a, b, atol=1e-5) for a, b in zip(arm["grads"], none["grads"], strict=True))
        arm["mean"] = sum(arm["seconds"]) / len(arm["seconds"])
    print(
        f"\n{opts.model} ({shape.layers} decoder layers, fp32, one thread): one row of {opts.tokens} tokens, every "
        "layer checkpointed fully, selectively or not at all"
    )
    print(
        "| arm | bytes held for the backward | backward matmul GFLOP | seconds (A B C C B A mean) | gradients = none's |"
    )
    print("|---|---:|---:|---:|---|")
    for name, arm in arms.items():
        print(
            f"| {name} | {arm['held'] / 2**20:.1f} MiB | {arm['flops'] / 1e9:.2f} | {arm['mean']:.2f} | "
            f"{arm['agree']} |"
        )
    kept = (sel["held"] - full["held"]) / max(1, none["held"] - full["held"])
    b = 4
    planned = (selective_bytes_per_token(shape, b) - shape.hidden * b) / (
        layer_bytes_per_token(shape, b) - shape.hidden * b
    )
    extra = lambda arm: (arm["flops"] - none["flops"]) / max(1, full["flops"] - none["flops"])  # noqa: E731
    print(
        f"selective: keeps {kept:.2f} of the activations no checkpointing keeps beyond full checkpointing's (the "
        f"plan: {planned:.2f}); recomputes {extra(sel):.2f} of full checkpointing's matmul FLOPs; time "
        f"{sel['mean'] / full['mean']:.2f}x full checkpointing's, {sel['mean'] / none['mean']:.2f}x none's"
    )
    ok = (
        all(arm["agree"] for arm in arms.values())
        and extra(sel) < 0.05
        and full["held"] < sel["held"] < none["held"]
        and abs(kept - planned) < 0.15
    )
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
