"""Padding compute in a GRPO step, TRL's GRPOTrainer as it is vs with rlt's trimmed log-prob calls
(rlt.stages.padding), SmolLM2-135M on this CPU, both in the same process on the same rollout.

The rollout is fixed (no generation): a skewed length mix, a few long completions among many short, the shape a
rank's generation batch has when one explanation runs long. One row per micro-batch (the paper's
perDeviceBatchSize 1), β = 0.04 so the reference forward runs too. Every forward of the policy and of the reference
is counted: tokens processed (the width it ran at) against real tokens (the ones its attention mask keeps).

    python benchmarks/padding.py                         # 16 rows: 1 of 384 completion tokens, 15 of 8-40
    python benchmarks/padding.py --rows 8 --long 256 --steps 1
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

SMOL = "builtin:smollm2-135m-instruct"


def skewed_lengths(rows: int, long: int, longs: int, seed: int) -> list[int]:
    """`longs` completions of `long` tokens, the rest 8-40 tokens."""
    import random

    rnd = random.Random(seed)
    return [long] * longs + [rnd.randint(8, 40) for _ in range(rows - longs)]


def counter(model, seen: dict[str, int]):
    def hook(module, args, kwargs):
        seen["processed"] += kwargs["input_ids"].numel()
        seen["real"] += int(kwargs["attention_mask"].sum())

    return model.register_forward_pre_hook(hook, with_kwargs=True)


def run_arm(name: str, trimmed: bool, args, rows: list[dict], lengths: list[int], steps: int) -> dict:
    import torch
    from datasets import Dataset
    from trl import GRPOTrainer

    from rlt.data.models import load_model, load_tokenizer
    from rlt.spec.inputs import ModelRef
    from rlt.stages.padding import padding_trimmed

    ref = ModelRef(model=SMOL)
    tok = load_tokenizer(ref)
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    queue = list(lengths)

    def rollout(prompts, trainer):  # the same completions for both arms, in the same order
        prompt_ids = [tok(p, add_special_tokens=False).input_ids for p in prompts]
        out = []
        for _ in prompts:
            n = queue.pop(0)
            queue.append(n)
            out.append(torch.randint(100, 40000, (n,), generator=gen).tolist())
        return {"prompt_ids": prompt_ids, "completion_ids": out, "logprobs": None}

    def reward(completions, **kw):
        return [float(len(c) % 3) for c in completions]  # varied, so advantages (and the loss) are not zero

    cls = padding_trimmed(GRPOTrainer) if trimmed else GRPOTrainer
    trainer = cls(
        model=load_model(ref, "cpu", trainable=True),
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tok,
        reward_funcs=[reward],
        rollout_func=rollout,
    )
    seen = {"processed": 0, "real": 0}
    hooks = [counter(trainer.model, seen)] + ([counter(trainer.ref_model, seen)] if trainer.ref_model else [])
    start = time.perf_counter()
    out = trainer.train()
    seconds = time.perf_counter() - start
    for h in hooks:
        h.remove()
    return {"arm": name, **seen, "seconds": seconds, "loss": out.training_loss}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=16, help="completions per optimizer step (one per micro-batch)")
    ap.add_argument("--long", type=int, default=384, help="tokens of a long completion")
    ap.add_argument("--longs", type=int, default=1, help="long completions among the rows")
    ap.add_argument("--steps", type=int, default=1)
    opts = ap.parse_args()
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    import torch
    from trl import GRPOConfig

    from rlt.data.dataset import load_data
    from rlt.method.prompts import Formatter, resolve_format
    from rlt.spec.inputs import DatasetSpec, FormatSpec

    torch.set_num_threads(max(1, (os.cpu_count() or 2) // 2))
    fmt = Formatter(resolve_format(FormatSpec()))
    data = load_data(DatasetSpec(source="builtin:arithmetic", size=opts.rows), fmt.fmt).train
    prompts = [{"prompt": f"Question: {r['question']}\nAnswer:"} for r in data]
    lengths = skewed_lengths(opts.rows, opts.long, opts.longs, seed=0)
    with tempfile.TemporaryDirectory() as tmp:
        args = GRPOConfig(
            output_dir=tmp,
            max_steps=opts.steps,
            per_device_train_batch_size=1,
            gradient_accumulation_steps=opts.rows,
            steps_per_generation=opts.rows,
            num_generations=4,
            max_completion_length=opts.long,
            beta=0.04,
            learning_rate=1e-6,
            use_cpu=True,
            bf16=False,
            report_to=[],
            disable_tqdm=True,
            save_strategy="no",
            logging_steps=1,
        )
        arms = [run_arm(n, t, args, prompts, lengths, opts.steps) for n, t in (("TRL", False), ("trimmed", True))]
    print(
        f"\n{opts.rows} rows per step, one per micro-batch, completion lengths {sorted(lengths)}; {opts.steps} step(s)"
    )
    print("| arm | tokens processed | real tokens | processed / real | training seconds | loss |")
    print("|---|---:|---:|---:|---:|---:|")
    for a in arms:
        ratio = a["processed"] / max(1, a["real"])
        print(f"| {a['arm']} | {a['processed']} | {a['real']} | {ratio:.3f} | {a['seconds']:.1f} | {a['loss']:.6f} |")
    print(f"speed-up {arms[0]['seconds'] / arms[1]['seconds']:.2f}x")


if __name__ == "__main__":
    main()
