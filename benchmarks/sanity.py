"""Does GRPO with the RLT reward raise its own objective at all? The pre-registered CPU sanity experiment of
docs/experiments.md ("Sanity experiment"), on `builtin:sums`.

From the short SFT teacher (benchmarks/learning.py --sft-only), pick training questions the start model gets wrong
30–70 % of the time; then per seed three arms with equal optimizer steps, each from the start model, each with rlt's
own stages: GRPO with the real reward, GRPO with the rewards permuted within each group (no signal, same reward
distribution and step sizes), SFT continued on the same questions' worked traces. Each trained teacher is measured
at once (the objective = the RLT reward at the training τ, K samples per question, the same sampling seed for every
teacher; τ 0.7 and held-out questions as secondary) and its row appended to units.jsonl, so whatever finishes before
the deadline is kept. `--analyse` prints the table, the intervals (seed = unit) and the verdict, and plots.

  nice -n 5 python benchmarks/sanity.py --out results/sanity --deadline 13:40     # the pre-registered run
  python benchmarks/sanity.py --quick --model builtin:tiny-qwen2 --out /tmp/s   # seconds: checks that it runs
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import teaching_protocol as protocol
from unit_runner import deadline_ts

ARMS = ("real", "shuffled", "sft")
ARM_NAMES = {"real": "GRPO, real reward", "shuffled": "GRPO, rewards permuted in group", "sft": "SFT continued"}

# Fixed before any result (docs/experiments.md, "Sanity experiment"); --quick shrinks them.
SIZES = dict(
    candidates=16,  # training questions screened with the start model
    screen_k=6,  # samples per screened question (τ = train τ)
    questions=3,  # chosen questions (wrong 30–70 % of the time): 6 steps = each twice
    steps=6,  # optimizer steps per arm
    per_step=1,  # questions per GRPO step (SFT: all chosen questions' traces each step)
    generations=8,  # G
    lr=1e-5,
    temperature=1.0,
    k=16,  # objective: samples per chosen question at τ 1.0
    k07=4,  # samples per chosen question at τ 0.7
    heldout=8,
    heldout_k=4,
    cap=64,
)
QUICK = dict(candidates=4, screen_k=2, questions=2, steps=2, per_step=1, generations=4, k=2, k07=2, heldout=2)
QUICK.update(heldout_k=1, cap=16)
SEED_SAMPLING = 4242  # the common random numbers of every measurement


def last_number(text: str) -> str | None:
    nums = re.findall(r"-?\d+", text)
    return nums[-1] if nums else None


def wrong(explanation: str, solution: str) -> bool:
    """An explanation is wrong when its last number is not the solution (the worked trace ends on the total)."""
    return last_number(explanation) != solution.strip()


def choose(wrong_rates: list[float], n: int, band: tuple[float, float] = (0.3, 0.7)) -> list[int]:
    """Indices of the n questions to train on: inside the band first, nearest to 0.5 first (ties: earlier row);
    when fewer than n are inside, the nearest to the band fill up (and the result says so)."""

    def distance(i: int) -> float:
        r = wrong_rates[i]
        return 0.0 if band[0] <= r <= band[1] else min(abs(r - band[0]), abs(r - band[1]))

    order = sorted(range(len(wrong_rates)), key=lambda i: (distance(i), abs(wrong_rates[i] - 0.5), i))
    return sorted(order[:n])


def permute_within_groups(values: list[float], g: int, rng) -> list[float]:
    """The shuffled arm's rewards: each consecutive group of g (TRL's layout: a prompt's G completions are
    adjacent) permuted, so the group's mean, spread and thus GRPO's step sizes are unchanged, its direction random."""
    if len(values) % g:
        raise ValueError(f"{len(values)} rewards are not whole groups of {g}")
    out: list[float] = []
    for i in range(0, len(values), g):
        group = values[i : i + g]
        out.extend(group[j] for j in rng.permutation(g))
    return out


def spec(args, arm: str, seed: int, start: str, data: str) -> dict:
    sz = args.sizes
    rows_per_step = sz["per_step"] * sz["generations"]
    stages: dict = {"distill": {"enabled": False}}
    if arm == "sft":
        stages["sft"] = {
            "enabled": True,
            "maxSteps": sz["steps"],
            "batchSize": sz["questions"],
            "perDeviceBatchSize": sz["questions"],
            "learningRate": sz["lr"],
            "lrScheduler": "constant",
            "warmupRatio": 0.0,
            "maxLength": 384,
            "gradientCheckpointing": False,
        }
        stages["rl"] = {"enabled": False}
    else:
        stages["sft"] = {"enabled": False}
        stages["rl"] = {
            "enabled": True,
            "steps": sz["steps"],
            "batchSize": rows_per_step,
            "numGenerations": sz["generations"],
            "perDeviceBatchSize": rows_per_step,
            "learningRate": sz["lr"],
            "temperature": sz["temperature"],
            "beta": 0.0,
            "maxCompletionLength": sz["cap"],
            "maxPromptLength": 512,
            "saveSteps": 10_000,
            "gradientCheckpointing": False,
            "reward": {"batchSize": 8},
        }
    return {
        "apiVersion": "rlt.dev/v1alpha1",
        "kind": "RLTRun",
        "metadata": {"name": f"sanity-{arm}-seed{seed}"},
        "spec": {
            "method": "rlt",
            "seed": seed,
            "teacher": {"model": start},
            "student": {"model": args.model},
            "dataset": {"source": data},
            "resources": {"trainer": {"gpus": 1}},  # one process: the batch sizes above are the run's
            "stages": stages,
        },
    }


def measure(args, teacher_path: str, chosen: list[dict], heldout: list[dict], sampling: int = SEED_SAMPLING) -> dict:
    """The objective and the secondary measures of one teacher (explanations sampled from seed `sampling`: the
    common random numbers by default); per-sample rewards kept for the spread."""
    from rlt.data.models import load_model, load_tokenizer
    from rlt.method.prompts import Formatter, resolve_format
    from rlt.method.reward import RLTReward
    from rlt.spec.inputs import FormatSpec, ModelRef

    sz = args.sizes
    formatter = Formatter(resolve_format(FormatSpec()))
    sref = ModelRef(model=args.model)
    student, s_tok = load_model(sref, "cpu"), load_tokenizer(sref, padding_side="right")
    tref = ModelRef(model=teacher_path)
    teacher, t_tok = load_model(tref, "cpu"), load_tokenizer(tref, padding_side="left")
    out: dict = {}
    for name, rows, k, tau in (
        ("objective", chosen, sz["k"], sz["temperature"]),
        ("tau07", chosen, sz["k07"], 0.7),
        ("heldout", heldout, sz["heldout_k"], sz["temperature"]),
    ):
        sampled = protocol.sample_explanations(
            teacher, t_tok, formatter, rows, k, sz["cap"], seed=sampling, temperature=tau
        )
        texts = sampled[0]
        reward = RLTReward(student, s_tok, formatter, temperature=tau, batch_size=8)
        flat_rows = [r for r in rows for _ in range(k)]
        br = protocol.score_sampled(reward, rows, sampled)
        expl = [formatter.split_explanation(t)[0] for ts in texts for t in ts]
        out[name] = {
            "tau": tau,
            "k": k,
            "reward": br.total,
            "r_ss": br.r_ss,
            "r_kl": br.r_kl,
            "wrong": [float(wrong(e, r["solution"])) for e, r in zip(expl, flat_rows, strict=True)],
            "example": expl[0],
        }
    return out


def summary(m: dict) -> dict:
    return {
        f"{name}_{key}": statistics.fmean(v[key])
        for name, v in m.items()
        for key in ("reward", "r_ss", "r_kl", "wrong")
    }


def questions(args) -> tuple[list[dict], list[dict]]:
    from rlt.data import tasks

    sys.path.insert(0, str(Path(__file__).parent))
    from learning import heldout_rows

    train = tasks.generate("sums", 512, 0)[: args.sizes["candidates"]]
    return train, heldout_rows("sums", 512, args.sizes["heldout"])


def select(args, out: Path) -> None:
    """Screen the candidates with the start model only, choose, measure the start model, and write the
    detectable effect, all before any arm trains (start.json)."""
    from rlt.data.jsonl import write_jsonl
    from rlt.data.models import load_model, load_tokenizer
    from rlt.method.prompts import Formatter, resolve_format
    from rlt.spec.inputs import FormatSpec, ModelRef

    t0 = time.perf_counter()
    sz = args.sizes
    cands, heldout = questions(args)
    formatter = Formatter(resolve_format(FormatSpec()))
    tref = ModelRef(model=args.start)
    teacher, t_tok = load_model(tref, "cpu"), load_tokenizer(tref, padding_side="left")
    texts, _, _ = protocol.sample_explanations(
        teacher,
        t_tok,
        formatter,
        cands,
        sz["screen_k"],
        sz["cap"],
        seed=SEED_SAMPLING + 1,
        temperature=sz["temperature"],
    )
    rates = [
        statistics.fmean(float(wrong(formatter.split_explanation(t)[0], r["solution"])) for t in ts)
        for ts, r in zip(texts, cands, strict=True)
    ]
    del teacher
    idx = choose(rates, sz["questions"])
    chosen = [cands[i] for i in idx]
    write_jsonl(out / "chosen.jsonl", chosen)
    m = measure(args, args.start, chosen, heldout)
    # per-sample spread within a question (pooled), the floor of any teacher's measurement noise
    k = sz["k"]
    per_q = [m["objective"]["reward"][i * k : (i + 1) * k] for i in range(len(chosen))]
    sd_w = math.sqrt(statistics.fmean(statistics.variance(q) for q in per_q)) if k > 1 else float("nan")
    se_teacher = sd_w / math.sqrt(len(chosen) * k)
    n = len(args.seeds)
    report = {
        "wrong_rates": rates,
        "chosen_rows": idx,
        "chosen_in_band": sum(0.3 <= rates[i] <= 0.7 for i in idx),
        "start": m,
        "summary": summary(m),
        "sd_per_sample": sd_w,
        "se_teacher_mean": se_teacher,
        # seed spread unknown before running: this is the floor (seed spread = measurement noise alone)
        "detectable_effect_floor": protocol.detectable_effect(se_teacher, n),
        "seeds": n,
        "seconds": round(time.perf_counter() - t0, 1),
    }
    (out / "start.json").write_text(json.dumps(report, indent=1))
    print(
        f"[select] wrong rates {[round(r, 2) for r in rates]}; chosen rows {idx} ({report['chosen_in_band']} in "
        f"30–70 %); start objective {report['summary']['objective_reward']:+.3f}; per-sample sd {sd_w:.3f}; "
        f"detectable effect (80 % power, {n} seeds per arm, measurement noise only) "
        f"{report['detectable_effect_floor']:.3f}; {report['seconds']:.0f} s",
        flush=True,
    )


def measure_start(args, out: Path, n: int) -> None:
    """The start model measured with n sampling seeds (the first the common one, so it reproduces start.json):
    its objective's mean and standard error over them, written to start-seeds.json (issue 52: a start measured once
    puts an error shared by every pair into real − start that no number of pairs averages out)."""
    from rlt.data.jsonl import read_jsonl

    chosen, (_, heldout) = list(read_jsonl(out / "chosen.jsonl")), questions(args)
    seeds = [SEED_SAMPLING + 1000 * j for j in range(n)]
    runs = [summary(measure(args, args.start, chosen, heldout, s)) for s in seeds]
    obj = [r["objective_reward"] for r in runs]
    se = statistics.stdev(obj) / math.sqrt(n) if n > 1 else float("nan")
    report = {"sampling_seeds": seeds, "objectives": obj, "mean": statistics.fmean(obj), "se": se, "summaries": runs}
    (out / "start-seeds.json").write_text(json.dumps(report, indent=1))
    print(f"[start] objective over {n} sampling seeds: {obj}; mean {report['mean']:+.3f}, s.e. {se:.3f}", flush=True)


def unit(args, out: Path, arm: str, seed: int) -> None:
    """Train one arm for one seed from the start model, measure it, append its row to units.jsonl."""
    import numpy as np

    import rlt.stages.rl as rl_stage
    from rlt.data.jsonl import append_jsonl, read_jsonl
    from rlt.run.runner import run_local
    from rlt.spec.loading import parse_run

    t0 = time.perf_counter()
    chosen = list(read_jsonl(out / "chosen.jsonl"))
    _, heldout = questions(args)
    if arm == "shuffled":
        make = rl_stage.reward_from_spec
        rng = np.random.default_rng(seed)
        g = args.sizes["generations"]

        def shuffled_reward(*a, **kw):
            reward = make(*a, **kw)
            real = reward.reward

            def permuted(call):  # the logged reward parts stay the real ones; only GRPO's input is permuted
                return permute_within_groups(real(call), g, rng)

            reward.reward = permuted
            return reward

        rl_stage.reward_from_spec = shuffled_reward
    run = parse_run(spec(args, arm, seed, args.start, str(out / "chosen.jsonl")))
    run_local(run, out, metrics_port=None, show_progress=False)
    stage = "sft" if arm == "sft" else "rl"
    model = out / run.name / stage / "model"
    trained = time.perf_counter() - t0
    m = measure(args, str(model), chosen, heldout)
    row = {"arm": arm, "seed": seed, "train_seconds": round(trained, 1), "seconds": round(time.perf_counter() - t0, 1)}
    append_jsonl(out / "units.jsonl", row | {"summary": summary(m), "measures": m})
    print(
        f"[unit] {arm} seed {seed}: objective {summary(m)['objective_reward']:+.3f}; {row['seconds']:.0f} s", flush=True
    )


def analyse(args, out: Path) -> dict:
    from rlt.data.jsonl import read_jsonl

    start = json.loads((out / "start.json").read_text())
    rows = list(read_jsonl(out / "units.jsonl")) if (out / "units.jsonl").exists() else []
    per_arm = {a: {r["seed"]: r["summary"] for r in rows if r["arm"] == a} for a in ARMS}
    keys = [k for k in start["summary"]]
    table = {"start": {k: start["summary"][k] for k in keys}}
    for a in ARMS:
        if per_arm[a]:
            table[a] = {k: statistics.fmean(s[k] for s in per_arm[a].values()) for k in keys}
    obj = {a: [s["objective_reward"] for s in per_arm[a].values()] for a in ARMS}
    res: dict = {"table": table, "seeds": {a: sorted(per_arm[a]) for a in ARMS}, "start": start["summary"]}
    try:
        vs_start = protocol.one_sample_interval(obj["real"], start["summary"]["objective_reward"])
        vs_shuffled = protocol.welch_interval(obj["real"], obj["shuffled"])
        res["real_vs_start"], res["real_vs_shuffled"] = vs_start, vs_shuffled
        if len(obj["sft"]) >= 2:
            res["real_vs_sft"] = protocol.welch_interval(obj["real"], obj["sft"])
        res["verdict"] = protocol.sanity_verdict(vs_start, vs_shuffled)
        sd = statistics.fmean(statistics.stdev(obj[a]) for a in ("real", "shuffled"))
        res["seed_sd"] = sd
        res["detectable_effect_measured"] = protocol.detectable_effect(sd, min(len(obj["real"]), len(obj["shuffled"])))
        res["power"] = protocol.power_lines(sd, [0.25, 0.5, 1.0])
    except ValueError as e:
        res["verdict"] = f"not in: {e}"
    res["detectable_effect_floor"] = start["detectable_effect_floor"]
    (out / "sanity.json").write_text(json.dumps(res, indent=1))
    print_report(res, obj)
    plot(res, obj, out / "sanity.png")
    return res


def print_report(res: dict, obj: dict) -> None:
    cols = ("objective_reward", "objective_r_ss", "objective_r_kl", "objective_wrong", "tau07_reward", "heldout_reward")
    print("| teacher | seeds | " + " | ".join(cols) + " |")
    print("|---|---|" + "---|" * len(cols))
    for name, t in res["table"].items():
        n = len(res["seeds"].get(name, [])) if name != "start" else "—"
        print(f"| {ARM_NAMES.get(name, name)} | {n} | " + " | ".join(f"{t[c]:+.3f}" for c in cols) + " |")
    for a in ARMS:
        print(f"  {a} per seed: " + ", ".join(f"{x:+.3f}" for x in obj[a]))
    for key in ("real_vs_start", "real_vs_shuffled", "real_vs_sft"):
        if key in res:
            d, lo, hi = res[key]
            print(f"{key}: {d:+.3f} [{lo:+.3f}, {hi:+.3f}] (95 % t, seeds as the unit)")
    print(f"detectable effect before running (measurement noise only): {res['detectable_effect_floor']:.3f}")
    if "detectable_effect_measured" in res:
        print(f"detectable effect at the measured seed spread: {res['detectable_effect_measured']:.3f}")
        for line in res["power"]:
            print("  " + line)
    print(f"verdict (pre-registered rule): {res['verdict']}")


def plot(res: dict, obj: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6))
    ax.axhline(res["start"]["objective_reward"], color="k", lw=1, ls="--", label="start model")
    for i, a in enumerate(ARMS):
        ys = obj[a]
        if not ys:
            continue
        ax.plot([i] * len(ys), ys, "o", alpha=0.5)
        if len(ys) >= 2:
            m, half = protocol.t_interval(ys)
            ax.errorbar([i + 0.15], [m], yerr=[[half], [half]], fmt="s", color="k", capsize=4)
    ax.set_xticks(range(len(ARMS)), [ARM_NAMES[a] for a in ARMS], fontsize=8)
    ax.set_ylabel("objective: mean RLT reward at τ 1.0")
    ax.set_title(f"sanity experiment: per seed, mean ± 95 % t; verdict {res['verdict']}", fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def unit_order(seeds: list[int]) -> list[tuple[str, int]]:
    """The pre-registered order: the verdict's two arms for the first two seeds, then their SFT arms, then the
    remaining seeds arm by arm, so that a deadline cuts what the verdict needs last."""
    first, rest = seeds[:2], seeds[2:]
    order = [(a, s) for s in first for a in ("real", "shuffled")] + [("sft", s) for s in first]
    return order + [(a, s) for s in rest for a in ARMS]


def orchestrate(args, out: Path) -> None:
    """select, then each unit in a child process in `unit_order`, never starting a unit that its arm's last duration says cannot finish before the deadline."""
    deadline = args.deadline_ts
    base = [sys.executable, "-u", __file__, *args.passthrough]
    if not (out / "start.json").exists():
        subprocess.run([*base, "--select"], check=True, timeout=max(1, deadline - time.time()))
    done = set()
    if (out / "units.jsonl").exists():
        from rlt.data.jsonl import read_jsonl

        done = {(r["arm"], r["seed"]) for r in read_jsonl(out / "units.jsonl")}
    last: dict[str, float] = {}
    for arm, seed in unit_order(args.seeds):
        if True:
            if (arm, seed) in done:
                continue
            left = deadline - time.time()
            if arm in last and last[arm] > left:
                print(
                    f"[deadline] {arm} seed {seed} not started: took {last[arm]:.0f} s, {left:.0f} s left", flush=True
                )
                continue
            t0 = time.time()
            try:
                subprocess.run([*base, "--unit", arm, "--seed", str(seed)], check=True, timeout=max(1, left))
            except subprocess.TimeoutExpired:
                print(f"[deadline] {arm} seed {seed} stopped at the deadline", flush=True)
                break
            last[arm] = time.time() - t0
    analyse(args, out)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="builtin:smollm2-135m-instruct", help="frozen student (and the SFT's base)")
    p.add_argument("--start", help="the start teacher (default: <out>/learning-sft/sft/model)")
    p.add_argument("--seeds", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 3])
    p.add_argument("--out", default="results/sanity")
    p.add_argument("--deadline", help="HH:MM UTC: no unit runs past it")
    p.add_argument("--quick", action="store_true", help="tiny sizes that only check the script runs")
    p.add_argument("--select", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--unit", choices=ARMS, help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, help=argparse.SUPPRESS)
    p.add_argument("--analyse", action="store_true", help="print the table and verdict of what has finished")
    p.add_argument("--start-seeds", type=int, help="after --select: measure the start with this many sampling seeds")
    args = p.parse_args(argv)
    args.passthrough = [a for a in (argv if argv is not None else sys.argv[1:])]
    args.sizes = SIZES | (QUICK if args.quick else {})
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    args.start = args.start or str(out / "learning-sft" / "sft" / "model")
    from rlt.data.models import quiet_libraries

    quiet_libraries()
    if args.select:
        return select(args, out)
    if args.unit:
        if argv is None:  # the unit's own process: its runs report to no tracker
            from rlt.stages.tracking import hide_tracking_libraries

            hide_tracking_libraries()
        return unit(args, out, args.unit, args.seed)
    if args.start_seeds:
        return measure_start(args, out, args.start_seeds)
    if args.analyse:
        analyse(args, out)
        return None
    if args.deadline:
        args.deadline_ts = deadline_ts(args.deadline, None, dt.datetime.now(dt.UTC))
    else:
        args.deadline_ts = time.time() + 24 * 3600
    (out / "sizes.json").write_text(json.dumps({"sizes": args.sizes, "seeds": args.seeds}, indent=1))
    orchestrate(args, out)
    return None


if __name__ == "__main__":
    main()
