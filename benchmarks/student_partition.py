"""Per-rank memory of the frozen reward student under ZeRO-3, world of N against a world of 1.

Each world is a real gloo process group on CPU (torch.distributed.run), with accelerate's DeepSpeed plugin at ZeRO
stage 3. Every rank loads the student the way stage rl does (rlt.data.models.load_model), scores a batch whole, then
prepares it with rlt.stages.rl.partition_frozen (TRL's prepare_deepspeed) and scores the same batch again through the
gather. Rank r scores 2r + 1 requests one at a time, so ranks run different numbers of micro-batches, as in GRPO.

Reported per rank: bytes of the student's parameters the rank holds (the local ZeRO partition of each parameter, or
the whole tensor when it is not partitioned), the RSS after loading and after preparing, and the largest score
difference against the unpartitioned scores.

    PYTHONPATH=training .venv/bin/python benchmarks/student_partition.py --model builtin:smollm2-135m-instruct --world 4
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

TEXTS = [
    "Question: what is 7 times 6? Explanation: seven sixes are forty-two. Solution: 42",
    "Question: what is 12 plus 30? Explanation: ten and thirty make forty, plus two. Solution: 42",
    "Question: name the colour of the clear daytime sky. Explanation: sunlight scatters. Solution: blue",
    "Question: how many legs has a spider? Explanation: arachnids have four pairs. Solution: eight",
]


def rss_bytes() -> int:
    with Path("/proc/self/statm").open() as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def held_bytes(model) -> int:
    """Bytes of parameters this rank holds: a ZeRO-3 parameter's local partition (ds_tensor), else the tensor."""
    total = 0
    for p in model.parameters():
        t = getattr(p, "ds_tensor", None)
        total += (t.numel() if t is not None else p.numel()) * p.element_size()
    return total


def requests_for(rank: int, tokenizer):
    from rlt.method.prompts import Span
    from rlt.method.scoring import ScoreRequest

    out = []
    for i in range(2 * rank + 1):
        text = TEXTS[i % len(TEXTS)]
        cut = text.index("Solution:")
        out.append(ScoreRequest(text, [Span(text.index("Explanation:"), cut), Span(cut, len(text))], group=i % 2))
    return out


def worker(model_name: str, out: Path, skip_prepare: bool) -> None:
    import torch
    from accelerate import Accelerator
    from accelerate.utils import DeepSpeedPlugin

    from rlt.data.models import load_model, load_tokenizer
    from rlt.method.scoring import SpanScorer
    from rlt.spec.inputs import ModelRef
    from rlt.stages.rl import partition_frozen

    world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    # What the HF Trainer leaves in the plugin once it has filled rlt's "auto" values (stages.trainer.deepspeed_config)
    ds = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "train_batch_size": world,
        "zero_optimization": {"stage": 3, "overlap_comm": True},
    }
    import deepspeed  # noqa: F401  # imported before the first RSS reading, so the deltas count the model only

    ref = ModelRef(model=model_name)
    rss0 = rss_bytes()
    torch.manual_seed(0)  # builtin:tiny-qwen2 is built from random weights: the same ones on every rank
    # loaded before the DeepSpeed config is live, as stage rl loads it (outside zero.Init: whole on every rank)
    student, tok = load_model(ref, "cpu"), load_tokenizer(ref, padding_side="right")
    scorer = SpanScorer(student, tok, temperature=0.7, batch_size=1)  # one micro-batch per request
    reqs = requests_for(rank, tok)
    whole = scorer.score(reqs)
    loaded = held_bytes(student)
    rss_loaded = rss_bytes()
    acc = Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=ds))
    partitioned = False if skip_prepare else partition_frozen(scorer, acc)
    prepared = held_bytes(student)
    rss_prepared = rss_bytes()
    again = scorer.score(reqs)
    diff = max(
        float((a.logprobs - b.logprobs).abs().max()) if len(a) else 0.0
        for ra, rb in zip(whole, again, strict=True)
        for a, b in zip(ra, rb, strict=True)
    )
    row = {
        "world": world,
        "rank": rank,
        "partitioned": partitioned,
        "param_bytes_loaded": loaded,
        "param_bytes_prepared": prepared,
        "rss_before_load": rss0,
        "rss_loaded": rss_loaded,
        "rss_prepared": rss_prepared,
        "held_after_score": held_bytes(student),
        "max_score_diff": diff,
    }
    with Path(out).open("a") as f:
        f.write(json.dumps(row) + "\n")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_world(model: str, world: int, out_dir: Path, skip_prepare: bool = False, timeout: float = 600) -> list[dict]:
    """Launch a gloo world of `world` CPU ranks; one result row per rank."""
    out = out_dir / f"world{world}.jsonl"
    out.unlink(missing_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc_per_node={world}",
        f"--master_port={free_port()}",
        __file__,
        "--worker",
        "--model",
        model,
        "--out",
        str(out),
    ] + (["--skip-prepare"] if skip_prepare else [])
    training = str(Path(__file__).resolve().parent.parent / "training")  # this tree's rlt in every rank
    path = os.pathsep.join(p for p in (training, os.environ.get("PYTHONPATH")) if p)
    # ACCELERATE_USE_DEEPSPEED: as `accelerate launch --use_deepspeed` sets it
    env = dict(os.environ, OMP_NUM_THREADS="1", ACCELERATE_USE_DEEPSPEED="true", PYTHONPATH=path)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"world {world} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    return sorted(rows, key=lambda r: r["rank"])


def compare(model: str, world: int, out_dir: Path, skip_prepare: bool = False) -> dict:
    one, many = run_world(model, 1, out_dir, skip_prepare), run_world(model, world, out_dir, skip_prepare)
    base = one[0]["param_bytes_prepared"]
    worst = max(r["param_bytes_prepared"] for r in many)
    return {
        "one": one,
        "many": many,
        "ratio": worst / base,
        "max_score_diff": max(r["max_score_diff"] for r in one + many),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="builtin:smollm2-135m-instruct")
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--target", type=float, default=0.35, help="largest per-rank ratio world N / world 1 that passes")
    ap.add_argument("--skip-prepare", action="store_true", help="leave the student whole (the defect, for contrast)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, default=Path("results/student_partition"))
    a = ap.parse_args(argv)
    if a.worker:
        worker(a.model, a.out, a.skip_prepare)
        return 0
    a.out.mkdir(parents=True, exist_ok=True)
    res = compare(a.model, a.world, a.out, a.skip_prepare)
    mib = 1 << 20
    print(
        f"{'world':>5} {'rank':>4} {'params loaded MiB':>18} {'params held MiB':>16} {'RSS loaded MiB':>15} "
        f"{'RSS prepared MiB':>17} {'score diff':>10}"
    )
    for r in res["one"] + res["many"]:
        print(
            f"{r['world']:>5} {r['rank']:>4} {r['param_bytes_loaded'] / mib:>18.1f} "
            f"{r['param_bytes_prepared'] / mib:>16.1f} {(r['rss_loaded'] - r['rss_before_load']) / mib:>15.1f} "
            f"{(r['rss_prepared'] - r['rss_before_load']) / mib:>17.1f} {r['max_score_diff']:>10.2e}"
        )
    ok = res["ratio"] <= a.target and res["max_score_diff"] == 0.0
    print(
        f"per-rank parameter bytes, world {a.world} / world 1: {res['ratio']:.3f} (target <= {a.target}); "
        f"largest score difference {res['max_score_diff']:.2e} -> {'PASS' if ok else 'FAIL'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
