"""Does RL teach better than SFT? The pre-registered protocol of docs/experiments.md, on `builtin:sums`.

One SFT warm-up of the teacher on the task's worked reasoning (the "SFT teacher"), then, per seed, an RL run from it
with rlt's own stages (the same code `rlt run` uses). Prints per seed the reward, r_SS and r_KL at the start and end
of RL and their slope per step with a 95 % interval. Then on held-out questions (never seen in training) each teacher
writes K explanations per question (sampled at τ = 0.7, the same sampling seed for every teacher) and the frozen
student is measured with them (teaching_protocol.measure). The primary measure is the paired difference RL − SFT of
the student's mean solution log-prob, with a two-way bootstrap interval over seeds and questions and the
pre-registered verdict. Writes learning.png and learning.json into --out.

  OMP_NUM_THREADS=2 python benchmarks/learning.py            # the default run (3 seeds, sized for 2 shared cores)
  python benchmarks/learning.py --full     # 8 seeds, 125 steps of 4 x G=8 at lr 1e-5, 128 held out x K=4 (GPU)
  python benchmarks/learning.py --quick --model builtin:tiny-qwen2  # seconds: checks that it runs
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import teaching_protocol as protocol
from task_calibration import answer_explained, graded
from teaching_protocol import t_quantile

PRIMARY = "solution_logprob"
SECONDARY = ("accuracy", "states_answer", "bare_leak", "closed", "r_kl", "reward", "tokens")


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


# RL settings fixed before the seeds ran (docs/experiments.md, "Protocol").
# Second run (docs/learning-search.md chose these on search seed 0 before seeds 1-3 ran): warm-up 8 steps, 16 RL
# steps of 1 question x G = 8 at lr 1e-5 and tau 1.0. The first run was 24 / 4 x 1 x G 4 at 5e-5, tau 0.7.
SFT_STEPS, STEPS, LR, QUESTIONS, GENERATIONS, TEMPERATURE = 8, 16, 1e-5, 1, 8, 1.0


def run_spec(args, seed: int, teacher: str, sft: bool, rl: bool) -> dict:
    """The RLTRun the benchmark trains: small batches, short explanations, no reference-KL (beta 0)."""
    return {
        "apiVersion": "rlt.dev/v1alpha1",
        "kind": "RLTRun",
        "metadata": {"name": f"learning-seed{seed}{args.tag}"},
        "spec": {
            "method": "rlt",
            "seed": seed,
            "teacher": {"model": teacher},
            "student": {"model": args.model},
            "dataset": {"source": f"builtin:{args.task}", "size": args.train_size, "seed": 0},
            # one trainer process: the batch sizes below are per run, and `rlt validate` checks them against the world
            "resources": {"trainer": {"gpus": 1}},
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
                    "temperature": args.temperature,
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
        if subprocess.run([sys.executable, "-u", __file__, *argv, "--sft-only"], check=False).returncode:
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
        steps = rl_steps(out, run.name)
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


def rl_steps(out: Path, run_name: str) -> list[dict]:
    """The rl stage's step records of a run under `out`, one per step (a resumed run may log a step twice)."""
    from rlt.contract.layout import RunLayout
    from rlt.run.plots import latest_per_step, read_metrics

    return latest_per_step(read_metrics(RunLayout.for_run(out, run_name).metrics_file), "rl")


def search_row(args, name: str, steps: list[dict]) -> dict | None:
    """One settings-search record of an RL run: its settings, reward start/end and slope, the share of groups with
    zero advantage (all G rewards equal: GRPO learns nothing from them), the mean policy entropy, the RL seconds."""
    f = curve_figures(steps, args.k).get("reward")
    if not f:
        return None
    keys = ("sft_steps", "steps", "lr", "questions", "generations", "temperature", "completion_length")
    return {
        "run": name,
        "seed": args.rl_seed,
        **{k: getattr(args, k) for k in keys},
        "reward_start": f["start"],
        "reward_end": f["end"],
        "k": f["k"],
        "slope": f["slope"],
        "slope_ci95": f["slope_ci95"],
        "zero_advantage": statistics.fmean(
            r.get("frac_reward_zero_std", float(r.get("reward_std", 0.0) == 0.0)) for r in steps
        ),
        "entropy": statistics.fmean(r.get("entropy", float("nan")) for r in steps),
        "seconds": sum(r.get("step_seconds", 0.0) for r in steps),
    }


def search_table(paths: list[str]) -> str:
    """The settings-search rows of the given search.jsonl files as a markdown table (every row, in file order)."""
    from rlt.data.jsonl import read_jsonl

    head = "| run | SFT steps | RL steps | lr | q × G | τ | reward first k → last k | slope ± 95 % | zero-adv. | entropy | s |"
    lines = [head, "|---|---|---|---|---|---|---|---|---|---|---|"]
    for path in paths:
        for r in read_jsonl(path):
            lines.append(
                f"| {r['run']} | {r['sft_steps']} | {r['steps']} | {r['lr']:g} | {r['questions']} × {r['generations']} | "
                f"{r['temperature']:g} | {r['reward_start']:.2f} → {r['reward_end']:.2f} (k {r['k']}) | "
                f"{r['slope']:+.3f} ± {r['slope_ci95']:.3f} | {r['zero_advantage']:.2f} | {r['entropy']:.4f} | "
                f"{r['seconds']:.0f} |"
            )
    return "\n".join(lines)


def teaching_figures(args, teacher_paths: dict[str, str], rows: list[dict]) -> dict:
    """Per teacher and held-out question: the pre-registered measures (teaching_protocol.measure) of K sampled
    explanations; and the student alone and with the dataset's trace, for scale."""
    from rlt.data.models import load_model, load_tokenizer
    from rlt.method.prompts import Formatter, resolve_format
    from rlt.method.reward import RLTReward
    from rlt.spec.inputs import FormatSpec, ModelRef

    formatter = Formatter(resolve_format(FormatSpec()))
    sref = ModelRef(model=args.model)  # teachers and student share the tokenizer (one vocabulary)
    student, s_tok_left = load_model(sref), load_tokenizer(sref, padding_side="left")  # the GPU when there is one
    s_tok = load_tokenizer(sref, padding_side="right")
    qs = [r["question"] for r in rows]
    # the student alone = empty thought, answer tag opened (calibration's "direct"; a free answer costs 6x more)
    alone = graded(qs, answer_explained(student, s_tok_left, formatter, qs, [""] * len(qs)), formatter)
    traces = [r["reasoning_trace"] for r in rows]
    with_traces = graded(qs, answer_explained(student, s_tok_left, formatter, qs, traces), formatter)
    results: dict[str, dict] = {
        "no explanation": {"accuracy": [float(x) for x in alone]},
        "dataset trace": {"accuracy": [float(x) for x in with_traces]},
    }
    reward = RLTReward(student, s_tok, formatter, temperature=0.7, batch_size=8)
    for name, path in teacher_paths.items():
        t0 = time.perf_counter()
        tref = ModelRef(model=path)
        teacher = load_model(tref)
        t_tok = load_tokenizer(tref, padding_side="left")
        sampled = protocol.sample_explanations(
            teacher, t_tok, formatter, rows, args.samples, args.completion_length, seed=1000
        )
        results[name] = protocol.measure(student, s_tok_left, formatter, rows, sampled, reward)
        results[name]["seconds"] = round(time.perf_counter() - t0, 1)
        print(f"[held-out] {name}: {results[name]['seconds']:.0f} s", flush=True)
        del teacher
    return results


def plot(figures: dict[int, dict], primary: dict | None, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(18, 4))
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
    ax = axes[3]
    if primary is not None:
        labels, ys, errs = [], [], []
        for s, (m, half) in primary["per_seed"].items():
            labels.append(f"seed {s}")
            ys.append(m)
            errs.append([half, half])
        lo, hi = primary["ci95"]
        labels.append("all (bootstrap)")
        ys.append(primary["mean"])
        errs.append([primary["mean"] - lo, hi - primary["mean"]])
        ax.errorbar(range(len(ys)), ys, yerr=list(zip(*errs, strict=True)), fmt="o", capsize=4)
        ax.axhline(0, color="k", lw=0.8)
        for d in (-protocol.DELTA, protocol.DELTA):
            ax.axhline(d, color="grey", ls="--", lw=0.8)
        ax.set_xticks(range(len(ys)), labels, fontsize=8)
    ax.set_title("held-out: RL − SFT teacher, student solution log-prob\n(95 % CI; dashed: ±δ)", fontsize=10)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def heldout_rows(task: str, train_size: int, n: int) -> list[dict]:
    """n questions of the task from generator seed 1000, none seen in training (seed 0, train_size rows)."""
    from rlt.data import tasks

    seen = {r["question"] for r in tasks.generate(task, train_size, 0)}
    fresh = [r for r in tasks.generate(task, 20 * n, 1000) if r["question"] not in seen]
    return list({r["question"]: r for r in fresh}.values())[:n]


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="builtin:smollm2-135m-instruct", help="teacher start and frozen student")
    p.add_argument("--task", default="sums")
    p.add_argument("--seeds", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 3])
    p.add_argument("--steps", type=int, default=STEPS, help="RL steps per seed")
    p.add_argument("--lr", type=float, default=LR, help="RL learning rate (full fine-tune, constant)")
    p.add_argument(
        "--temperature", type=float, default=TEMPERATURE, help="RL sampling τ (the rl stage's temperature: rewards too)"
    )
    p.add_argument("--questions", type=int, default=QUESTIONS, help="questions per RL step")
    p.add_argument("--generations", type=int, default=GENERATIONS, help="G: explanations per question")
    p.add_argument("--completion-length", type=int, default=64, help="explanation cap (tokens), RL and held-out")
    p.add_argument("--sft-steps", type=int, default=SFT_STEPS)
    p.add_argument("--sft-lr", type=float, default=1e-4)
    p.add_argument("--train-size", type=int, default=512)
    p.add_argument("--heldout", type=int, default=64)
    p.add_argument("--samples", type=int, default=4, help="K (≥ 4): sampled explanations per held-out question")
    p.add_argument("--k", type=int, default=3, help="steps averaged for the start/end reward")
    p.add_argument("--out", default="results/learning-sums")
    p.add_argument("--tag", default="", help="suffix of the RL run names (settings search)")
    p.add_argument("--quick", action="store_true", help="tiny settings that only check the script runs")
    p.add_argument("--full", action="store_true", help="8 seeds, 125 RL steps of 4 questions x G=8, 128 held out x K=4")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--parallel", action="store_true", help="train the seeds in parallel processes (~4.5 GB each)")
    p.add_argument("--rl-seed", type=int, help="train this seed's RL only and print its reward curve (search)")
    p.add_argument("--sft-only", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--search-table", nargs="+", metavar="JSONL", help="print these search rows as a table, exit")
    args = p.parse_args(argv)
    if args.search_table:
        print(search_table(args.search_table))
        return {}
    if args.quick:
        args.steps, args.sft_steps, args.heldout, args.questions, args.generations = 3, 2, 4, 2, 2
        args.completion_length, args.train_size, args.k, args.samples = 16, 16, 1, 1
    if args.samples < 4 and not args.quick:  # issue 36: K ≥ 4 samples per question in every arm
        raise SystemExit(f"--samples {args.samples}: at least 4 explanations per held-out question (K ≥ 4)")
    if args.full:
        args.seeds, args.steps, args.heldout, args.samples = list(range(1, 9)), 125, 128, 4
        args.questions, args.generations = 4, 8

    from rlt.data.jsonl import append_jsonl
    from rlt.data.models import quiet_libraries
    from rlt.run.runner import run_local
    from rlt.spec.loading import parse_run

    quiet_libraries()
    out = Path(args.out)
    if args.sft_only:  # a child of --parallel: the SFT warm-up only
        run_sft(args, out)
        return {}
    if args.rl_seed is not None:  # one seed's RL only (a child of --parallel, or a settings-search run)
        run = parse_run(run_spec(args, args.rl_seed, str(out / "learning-sft" / "sft" / "model"), sft=False, rl=True))
        run_local(run, out, metrics_port=None, show_progress=not args.quiet)
        steps = rl_steps(out, run.name)
        row = search_row(args, run.name, steps)
        if row:
            append_jsonl(out / "search.jsonl", row)
            print(
                f"[search] {run.name}: reward first {row['k']} {row['reward_start']:+.3f} last {row['k']} "
                f"{row['reward_end']:+.3f} slope {row['slope']:+.4f} ± {row['slope_ci95']:.4f}; zero-advantage "
                f"groups {row['zero_advantage']:.2f}; entropy {row['entropy']:.4f}; {row['seconds']:.0f} s"
            )
        return {}
    started = time.perf_counter()
    sft_model, runs = train(args, out)
    heldout = heldout_rows(args.task, args.train_size, args.heldout)
    figures = {seed: curve_figures(r["rows"], args.k) for seed, r in runs.items()}
    teachers = {"SFT teacher": sft_model} | {f"RL teacher seed {s}": r["model"] for s, r in runs.items()}
    teaching = teaching_figures(args, teachers, heldout)
    rl = {s: teaching[f"RL teacher seed {s}"] for s in runs}
    comparison = protocol.compare(teaching["SFT teacher"], rl, (PRIMARY, *SECONDARY))
    primary = comparison.get(PRIMARY)
    verdict = protocol.verdict(*primary["ci95"]) if primary else "not measured"
    plot(figures, primary, out / "learning.png")
    report = {
        "settings": {k: v for k, v in vars(args).items()},
        "seconds": round(time.perf_counter() - started, 1),
        "rl_seconds": {s: round(r["seconds"], 1) for s, r in runs.items()},
        "curves": figures,
        "heldout_questions": len(heldout),
        "teaching": teaching,
        "comparison": comparison,
        "verdict": verdict,
        "plot": str(out / "learning.png"),
    }
    (out / "learning.json").write_text(json.dumps(report, indent=1))
    print_report(args, report)
    return report


def print_report(args, report: dict) -> None:
    figures, teaching, comparison = report["curves"], report["teaching"], report["comparison"]
    print(
        f"\nRLT vs SFT teacher on builtin:{args.task}: {args.model} teacher and student, seeds {args.seeds}, "
        f"{args.steps} RL steps × {args.questions} questions × G={args.generations}, lr {args.lr}, explanations ≤ "
        f"{args.completion_length} tokens, SFT warm-up {args.sft_steps} × 8 rows; wall {report['seconds']:.0f} s"
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
    n = report["heldout_questions"]
    print(f"\nheld-out: {n} unseen questions, K = {args.samples} explanations per teacher and question (τ = 0.7)")
    print("| explanation | " + " | ".join(("solution log-prob", *SECONDARY)) + " |")
    print("|---|" + "---|" * (1 + len(SECONDARY)))
    for name, t in teaching.items():
        cells = [f"{statistics.fmean(t[k]):.3f}" if k in t else "—" for k in (PRIMARY, *SECONDARY)]
        print(f"| {name} | {' | '.join(cells)} |")
    print("\nRL − SFT teacher, paired per question (two-way bootstrap over seeds and questions, 95 %)")
    print("| measure | RL − SFT | 95 % CI | per seed: mean ± t half-width |")
    print("|---|---|---|---|")
    for key, c in comparison.items():
        per = "; ".join(f"{s}: {m:+.3f} ± {h:.3f}" for s, (m, h) in c["per_seed"].items())
        label = f"**{key} (primary)**" if key == PRIMARY else key
        print(f"| {label} | {c['mean']:+.4f} | [{c['ci95'][0]:+.4f}, {c['ci95'][1]:+.4f}] | {per} |")
    for key, c in comparison.items():
        if c.get("seed_t"):
            d, lo, hi = c["seed_t"]
            print(f"{key}: seed-level t interval {d:+.4f} [{lo:+.4f}, {hi:+.4f}]; " + "; ".join(c["power"]))
    print(f"\nverdict (pre-registered rule, δ = {protocol.DELTA}): {report['verdict']}")
    for name, t in teaching.items():
        for e in t.get("examples", [])[:2]:
            print(f"  {name}: {e!r}")
    print(f"plot: {report['plot']}")


if __name__ == "__main__":
    main()
