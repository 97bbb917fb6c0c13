"""Does the teacher learn? The RLT recipe (SFT warm-up, then GRPO on the RLT reward) on the built-in `basic` task.

One SFT warm-up of the teacher on the task's worked reasoning (the "SFT-only teacher"), then, per seed, an RL run
from it with rlt's own stages (the same code `rlt run` uses). Prints per seed: the reward at the start and end of
RL (mean of the first/last k steps), the least-squares slope of reward per step with a 95 % interval, and r_SS and
r_KL the same way. Then on held-out questions (never seen in training), each teacher writes one explanation per
question (greedy) and the frozen student is measured with it: the mean log-prob of the solution tokens (the paper's
measure of teaching, r_SS's mean part), the student's accuracy when shown the explanation, and how often the
explanation states the answer. Writes learning.png and learning.json into --out.

  OMP_NUM_THREADS=1 python benchmarks/learning.py --parallel      # the full run (SmolLM2-135M, 2 seeds)
  python benchmarks/learning.py --quick --model builtin:tiny-qwen2  # seconds: checks that it runs
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from task_calibration import answer_alone, answer_explained, graded, wilson

_T975 = (
    12.706,
    4.303,
    3.182,
    2.776,
    2.571,
    2.447,
    2.365,
    2.306,
    2.262,
    2.228,
    2.201,
    2.179,
    2.160,
    2.145,
    2.131,
    2.120,
    2.110,
    2.101,
    2.093,
    2.086,
    2.080,
    2.074,
    2.069,
    2.064,
    2.060,
    2.056,
    2.052,
    2.048,
    2.045,
    2.042,
)


def t_quantile(df: int) -> float:
    """Two-sided 95 % Student-t quantile: the table up to 30 degrees of freedom, then the Cornish–Fisher
    expansion around the normal (within 0.01 % there; no scipy in the environment)."""
    z = 1.959964
    if df <= 0:
        return float("inf")
    if df <= len(_T975):
        return _T975[df - 1]
    return (
        z
        + (z**3 + z) / (4 * df)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * df**3)
    )


def slope_ci(ys: list[float]) -> tuple[float, float]:
    """Least-squares slope of ys against 0..n-1 and its 95 % half-width (t with n-2 degrees of freedom)."""
    n = len(ys)
    if n < 3:
        return float("nan"), float("nan")
    xs = list(range(n))
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    resid = sum((y - my - b * (x - mx)) ** 2 for x, y in zip(xs, ys, strict=True))
    se = math.sqrt(resid / (n - 2) / sxx)
    return b, t_quantile(n - 2) * se


def run_spec(args, seed: int, teacher: str, sft: bool, rl: bool) -> dict:
    """The RLTRun the benchmark trains: small batches, short explanations, no reference-KL (beta 0)."""
    return {
        "apiVersion": "rlt.dev/v1alpha1",
        "kind": "RLTRun",
        "metadata": {"name": f"learning-seed{seed}"},
        "spec": {
            "method": "rlt",
            "seed": seed,
            "teacher": {"model": teacher},
            "student": {"model": args.model},
            "dataset": {"source": f"builtin:{args.task}", "size": args.train_size, "seed": 0},
            "stages": {
                "sft": {
                    "enabled": sft,
                    "maxSteps": args.sft_steps,
                    "batchSize": 8,
                    "perDeviceBatchSize": 8,
                    "learningRate": args.sft_lr,
                    "maxLength": 384,
                    "gradientCheckpointing": False,
                },
                "rl": {
                    "enabled": rl,
                    "steps": args.steps,
                    "batchSize": args.questions * args.generations,
                    "numGenerations": args.generations,
                    "perDeviceBatchSize": args.questions * args.generations,
                    "learningRate": args.lr,
                    "beta": 0.0,
                    "maxCompletionLength": args.completion_length,
                    "maxPromptLength": 512,
                    "saveSteps": 10_000,
                    "gradientCheckpointing": False,
                    "reward": {"batchSize": 8},
                },
                "distill": {"enabled": False},
            },
        },
    }


def run_sft(args, out: Path) -> None:
    """The SFT warm-up of the teacher, shared by every seed (skipped when already done)."""
    from rlt.run.runner import run_local
    from rlt.spec.loading import parse_run

    sft_run = parse_run(run_spec(args, args.seeds[0], args.model, sft=True, rl=False))
    sft_run.metadata.name = "learning-sft"
    run_local(sft_run, out, metrics_port=None, show_progress=False)


def train(args, out: Path) -> tuple[str, dict[int, dict]]:
    """SFT once, then RL per seed; returns the SFT model path and, per seed, the RL model and metrics rows."""
    from rlt.run.runner import run_local
    from rlt.spec.loading import parse_run

    sft_model = str(out / "learning-sft" / "sft" / "model")
    if args.parallel and len(args.seeds) > 1:
        argv = [a for a in sys.argv[1:] if a != "--parallel"]
        # The SFT warm-up in a child too: a parent that trained keeps ~3 GB, next to ~4.5 GB per RL child
        # (on a 24 GB machine shared with other work that got one seed OOM-killed).
        if subprocess.run([sys.executable, "-u", __file__, *argv, "--sft-only"]).returncode:
            raise SystemExit("the SFT warm-up failed (see its output above)")
        # One process per seed: on a shared machine each process gets its own share of the CPU.
        procs = [subprocess.Popen([sys.executable, "-u", __file__, *argv, "--rl-seed", str(s)]) for s in args.seeds]
        if any(p.wait() for p in procs):
            raise SystemExit("an RL seed failed (see its output above)")
    else:
        run_sft(args, out)
    runs = {}
    for seed in args.seeds:
        run = parse_run(run_spec(args, seed, sft_model, sft=False, rl=True))
        run_local(run, out, metrics_port=None, show_progress=not args.quiet)  # skipped when already done
        rows = [json.loads(x) for x in (out / run.name / "metrics.jsonl").read_text().splitlines() if x.strip()]
        by_step = {r["step"]: r for r in rows if r["stage"] == "rl"}
        steps = [by_step[k] for k in sorted(by_step)]
        # RL time from the step records: in --parallel mode the training happened in a child process
        runs[seed] = {
            "model": str(out / run.name / "rl" / "model"),
            "rows": steps,
            "seconds": sum(r.get("step_seconds", 0.0) for r in steps),
        }
    return sft_model, runs


def curve_figures(rows: list[dict], k: int) -> dict:
    figs = {}
    for key in ("reward", "r_ss", "r_kl"):
        ys = [r[key] for r in rows if key in r and math.isfinite(r[key])]
        if not ys:
            continue
        kk = max(1, min(k, len(ys) // 2))
        b, half = slope_ci(ys)
        figs[key] = {
            "start": statistics.fmean(ys[:kk]),
            "end": statistics.fmean(ys[-kk:]),
            "k": kk,
            "slope": b,
            "slope_ci95": half,
            "per_step": ys,
        }
    return figs


def mentions(text: str, number: str) -> bool:
    """Whether `number` appears in `text` as a whole number (not inside a longer one)."""
    return re.search(rf"(?<!\d){re.escape(number)}(?!\d)", text) is not None


def explain(model, tokenizer, formatter, rows: list[dict], max_new_tokens: int, batch_size: int = 16) -> list[str]:
    """One greedy teacher completion per held-out question (the text after the opening explanation tag)."""
    from rlt.stages.evaluate import _greedy

    prompts = [formatter.teacher_prompt(tokenizer, r["question"], r["solution"]) for r in rows]
    out = []
    for i in range(0, len(prompts), batch_size):
        ids = [tokenizer(p, add_special_tokens=False).input_ids for p in prompts[i : i + batch_size]]
        out += [tokenizer.decode(c, skip_special_tokens=True) for c in _greedy(model, tokenizer, ids, max_new_tokens)]
    return out


def teaching_figures(args, teacher_paths: dict[str, str], rows: list[dict]) -> dict:
    """Per teacher: the student's solution log-prob, r_SS, r_KL and accuracy with its explanations; and baselines."""
    from rlt.method.prompts import Formatter, resolve_format
    from rlt.method.reward import RLTReward
    from rlt.run.models import load_model, load_tokenizer
    from rlt.spec.inputs import FormatSpec, ModelRef

    formatter = Formatter(resolve_format(FormatSpec()))
    sref = ModelRef(model=args.model)
    student, s_tok_left = load_model(sref, "cpu"), load_tokenizer(sref, padding_side="left")
    s_tok = load_tokenizer(sref, padding_side="right")
    qs, sols = [r["question"] for r in rows], [r["solution"] for r in rows]
    results = {}
    alone = graded(qs, answer_alone(student, s_tok_left, formatter, qs), formatter)
    results["no explanation"] = {"accuracy": sum(alone) / len(alone), "correct": sum(alone), "n": len(alone)}
    traces = [r["reasoning_trace"] for r in rows]
    with_traces = graded(qs, answer_explained(student, s_tok_left, formatter, qs, traces), formatter)
    results["dataset trace"] = {"accuracy": sum(with_traces) / len(rows), "correct": sum(with_traces), "n": len(rows)}
    for name, path in teacher_paths.items():
        tref = ModelRef(model=path)
        t_tok = load_tokenizer(tref, padding_side="left")
        teacher = load_model(tref, "cpu")
        completions = explain(teacher, t_tok, formatter, rows, args.completion_length)
        reward = RLTReward(
            student,
            s_tok,
            formatter,
            teacher=teacher,
            teacher_tokenizer=load_tokenizer(tref, "right"),
            temperature=0.7,
            batch_size=8,
        )
        br = reward.score(qs, sols, completions)
        expl = [formatter.split_explanation(c)[0] for c in completions]
        ok = graded(qs, answer_explained(student, s_tok_left, formatter, qs, expl), formatter)
        # "states the answer": the solution's number appears in the explanation. Only counted where the question
        # does not contain that number itself (in a comparison the answer is one of the question's numbers).
        leaks = [mentions(e, s) for e, s, q in zip(expl, sols, qs, strict=True) if not mentions(q, s)]
        results[name] = {
            "accuracy": sum(ok) / len(ok),
            "correct": sum(ok),
            "n": len(ok),
            "solution_logprob_mean": statistics.fmean(br.solution_logprob_mean),
            "r_ss": statistics.fmean(br.r_ss),
            "r_kl": statistics.fmean(br.r_kl),
            "reward": statistics.fmean(br.total),
            "closed": sum(p == 0 for p in br.format_penalty) / len(rows),
            "states_answer": sum(leaks) / len(leaks) if leaks else float("nan"),
            "explanation_tokens": statistics.fmean(br.explanation_tokens),
            "examples": expl[:3],
        }
        del teacher
    return results


def plot(runs: dict[int, dict], figures: dict[int, dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for ax, key, title in zip(
        axes,
        ("reward", "r_ss", "r_kl"),
        (
            "reward R = r_SS − λ·r_KL − penalty",
            "r_SS (student log-prob of solution)",
            "r_KL (teacher − student on explanation)",
        ),
        strict=False,
    ):
        for seed, f in figures.items():
            if key not in f:
                continue
            ys = f[key]["per_step"]
            (line,) = ax.plot(range(1, len(ys) + 1), ys, alpha=0.35)
            w = max(1, len(ys) // 10)
            smooth = [statistics.fmean(ys[max(0, i - w + 1) : i + 1]) for i in range(len(ys))]
            ax.plot(
                range(1, len(ys) + 1),
                smooth,
                color=line.get_color(),
                label=f"seed {seed}: slope {f[key]['slope']:+.4f} ± {f[key]['slope_ci95']:.4f}",
            )
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("RL step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="builtin:smollm2-135m-instruct", help="teacher start and frozen student")
    p.add_argument("--task", default="basic")
    p.add_argument("--seeds", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2])
    p.add_argument("--steps", type=int, default=24, help="RL steps per seed")
    p.add_argument("--lr", type=float, default=2e-5, help="RL learning rate (full fine-tune, constant)")
    p.add_argument("--questions", type=int, default=2, help="questions per RL step")
    p.add_argument("--generations", type=int, default=4, help="G: explanations per question")
    p.add_argument("--completion-length", type=int, default=24)
    p.add_argument("--sft-steps", type=int, default=6)
    p.add_argument("--sft-lr", type=float, default=5e-5)
    p.add_argument("--train-size", type=int, default=512)
    p.add_argument("--heldout", type=int, default=48)
    p.add_argument("--k", type=int, default=5, help="steps averaged for the start/end reward")
    p.add_argument("--out", default="results/learning")
    p.add_argument("--quick", action="store_true", help="tiny settings that only check the script runs")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--parallel", action="store_true", help="train the seeds in parallel processes")
    p.add_argument("--rl-seed", type=int, help=argparse.SUPPRESS)
    p.add_argument("--sft-only", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.steps, args.sft_steps, args.heldout, args.questions, args.generations = 3, 2, 4, 2, 2
        args.completion_length, args.train_size, args.k = 16, 16, 1

    from rlt.data import tasks
    from rlt.run.runner import quiet_libraries, run_local
    from rlt.spec.loading import parse_run

    quiet_libraries()
    out = Path(args.out)
    if args.sft_only:  # a child of --parallel: the SFT warm-up only
        run_sft(args, out)
        return {}
    if args.rl_seed is not None:  # a child of --parallel: this seed's RL run only
        sft_model = str(out / "learning-sft" / "sft" / "model")
        run_local(
            parse_run(run_spec(args, args.rl_seed, sft_model, sft=False, rl=True)),
            out,
            metrics_port=None,
            show_progress=not args.quiet,
        )
        return {}
    started = time.perf_counter()
    sft_model, runs = train(args, out)
    seen = {r["question"] for r in tasks.generate(args.task, args.train_size, 0)}
    heldout = [r for r in tasks.generate(args.task, 20 * args.heldout, 1000) if r["question"] not in seen]
    heldout = list({r["question"]: r for r in heldout}.values())[: args.heldout]

    figures = {seed: curve_figures(r["rows"], args.k) for seed, r in runs.items()}
    teachers = {"SFT-only teacher": sft_model} | {f"RL teacher seed {s}": r["model"] for s, r in runs.items()}
    teaching = teaching_figures(args, teachers, heldout)
    plot(runs, figures, out / "learning.png")
    report = {
        "settings": {k: v for k, v in vars(args).items()},
        "seconds": round(time.perf_counter() - started, 1),
        "rl_seconds": {s: round(r["seconds"], 1) for s, r in runs.items()},
        "curves": figures,
        "heldout_questions": len(heldout),
        "teaching": teaching,
        "plot": str(out / "learning.png"),
    }
    (out / "learning.json").write_text(json.dumps(report, indent=1))

    print(
        f"\nRLT learning on builtin:{args.task}: {args.model} teacher and student, {args.steps} RL steps × "
        f"{args.questions} questions × G={args.generations}, lr {args.lr}, explanations ≤ {args.completion_length} "
        f"tokens; wall {report['seconds']:.0f} s"
    )
    print("| seed | term | start (first k) | end (last k) | slope per step ± 95 % CI | RL step seconds (sum) |")
    print("|---|---|---|---|---|---|")
    for seed, f in figures.items():
        for key in ("reward", "r_ss", "r_kl"):
            if key in f:
                c = f[key]
                print(
                    f"| {seed} | {key} | {c['start']:.4f} | {c['end']:.4f} | {c['slope']:+.5f} ± {c['slope_ci95']:.5f}"
                    f" | {report['rl_seconds'][seed]:.0f} |"
                )
    print(f"\nheld-out: {len(heldout)} unseen questions, one greedy explanation per teacher and question")
    print(
        "| explanation | student accuracy | 95 % CI | solution log-prob (mean) | r_SS | r_KL | reward | "
        "states answer (answer not in question) | closed | tokens |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, t in teaching.items():
        lo, hi = wilson(t["correct"], t["n"])
        extra = (
            f"{t['solution_logprob_mean']:.4f} | {t['r_ss']:.4f} | {t['r_kl']:.4f} | {t['reward']:.4f} | "
            f"{t['states_answer']:.2f} | {t['closed']:.2f} | {t['explanation_tokens']:.1f}"
            if "r_ss" in t
            else "— | — | — | — | — | — | —"
        )
        print(f"| {name} | {t['accuracy']:.3f} | [{lo:.2f}, {hi:.2f}] | {extra} |")
    for name, t in teaching.items():
        for e in t.get("examples", [])[:2]:
            print(f"  {name}: {e!r}")
    print(f"plot: {out / 'learning.png'}\nfigures: {out / 'learning.json'}")
    return report


if __name__ == "__main__":
    main()
