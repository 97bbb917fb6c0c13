"""Is there room to teach on `builtin:sums-detour`? The student's accuracy with the dataset's raw (correct,
unfriendly) trace against the friendly rewrite, per shape and overall, and how often the RLT reward ranks the
friendly rewrite above the raw trace (issue 46: raw 0.5–0.7 and friendly ≥ 0.9 wanted; ranking ≥ 90 %).

The student (default SmolLM2-135M-Instruct, untrained) reads the trace as its thought, the answer tag opened, and
answers greedily; the task's own checker grades it (as benchmarks/task_calibration.py's "explained" column). The
reward is rlt's RLTReward with the untrained model as both teacher and student (the start of RL), τ 0.7.

  nice -n 10 python benchmarks/headroom_calibration.py [--n 96] [--shapes check-last,detour]
--shapes calibrates candidate shapes on the seed's questions instead of the dataset's mix. The last column is the
mean difference, friendly minus raw, of the reward's two terms (R = r_SS − λ·r_KL): why the reward ranks as it does.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


def ranking(model, model_name: str, formatter, rows: list[dict], friendly: list[str]) -> tuple:
    """Per question, the RLT reward (its breakdown) of the raw trace and of the friendly rewrite."""
    from rlt.data.models import load_tokenizer
    from rlt.method.reward import RLTReward
    from rlt.spec.inputs import ModelRef

    tok = load_tokenizer(ModelRef(model=model_name), padding_side="right")
    reward = RLTReward(model, tok, formatter, teacher=model, teacher_tokenizer=tok, temperature=0.7)
    qs, sols = [r["question"] for r in rows], [r["solution"] for r in rows]
    raw = reward.score(qs, sols, [formatter.teacher_completion(r["reasoning_trace"], "") for r in rows])
    nice = reward.score(qs, sols, [formatter.teacher_completion(f, "") for f in friendly])
    return raw, nice


def reshaped(rows: list[dict], shapes: list[str]) -> list[dict]:
    """The seed's questions with raw traces of the given shapes in turn (to calibrate candidate shapes)."""
    from rlt.data import headroom

    out = []
    for i, r in enumerate(rows):
        a, b = headroom.operands(r["question"])
        out.append({**r, "reasoning_trace": headroom.raw_trace(a, b, shapes[i % len(shapes)])})
    return out


def main() -> None:
    from task_calibration import answer_explained, graded, wilson

    from rlt.data import headroom, tasks
    from rlt.data.models import load_model, load_tokenizer
    from rlt.method.prompts import Formatter, resolve_format
    from rlt.spec.inputs import FormatSpec, ModelRef

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="builtin:smollm2-135m-instruct")
    p.add_argument("--n", type=int, default=96, help="questions (generator seed --seed)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-reward", action="store_true")
    p.add_argument(
        "--shapes",
        help="comma-separated shapes to calibrate instead of the dataset's mix: question i of the seed gets the i-th "
        f"shape in turn (choose from {', '.join(headroom.SHAPES)})",
    )
    args = p.parse_args()

    t0 = time.perf_counter()
    ref = ModelRef(model=args.model)
    tok, model = load_tokenizer(ref, padding_side="left"), load_model(ref)
    formatter = Formatter(resolve_format(FormatSpec()))
    rows = tasks.generate("sums-detour", args.n, args.seed)
    if args.shapes:
        rows = reshaped(rows, args.shapes.split(","))
    qs = [r["question"] for r in rows]
    friendly = [headroom.friendly_trace(*headroom.operands(q)) for q in qs]
    ok_raw = graded(qs, answer_explained(model, tok, formatter, qs, [r["reasoning_trace"] for r in rows]), formatter)
    ok_nice = graded(qs, answer_explained(model, tok, formatter, qs, friendly), formatter)
    shapes = [headroom.shape_of(r["question"], r["reasoning_trace"]) for r in rows]
    wins, gaps = None, {}
    if not args.no_reward:
        raw, nice = ranking(model, args.model, formatter, rows, friendly)
        wins = [n > r for r, n in zip(raw.total, nice.total, strict=True)]
        gaps = {k: [n - r for r, n in zip(getattr(raw, k), getattr(nice, k), strict=True)] for k in ("r_ss", "r_kl")}
    print(f"student {args.model}, builtin:sums-detour seed {args.seed}, {args.n} questions, greedy")
    print(
        "| shape | questions | raw trace | 95 % CI | friendly rewrite | 95 % CI | reward ranks friendly above raw "
        "| mean gap friendly − raw: r_SS, r_KL |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for shape in (*[s for s in headroom.SHAPES if s in shapes], "all"):
        idx = [i for i, s in enumerate(shapes) if shape in ("all", s)]
        cells = []
        for ok in (ok_raw, ok_nice):
            k = sum(ok[i] for i in idx)
            lo, hi = wilson(k, len(idx))
            cells.append(f"{k / len(idx):.2f} | [{lo:.2f}, {hi:.2f}]")
        rank = "—" if wins is None else f"{sum(wins[i] for i in idx)}/{len(idx)}"
        gap = ", ".join(f"{sum(g[i] for i in idx) / len(idx):+.2f}" for g in gaps.values()) or "—"
        print(f"| {shape} | {len(idx)} | {' | '.join(cells)} | {rank} | {gap} |")
    print(f"{time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
