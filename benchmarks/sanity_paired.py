"""The paired sanity experiment (issue 46; protocol in docs/experiments.md, "The sanity question settled with
paired seeds"): does GRPO with the RLT reward raise its own objective, settled with new seeds, each a pair of real-
and shuffled-reward units run back to back with the same seed (common random numbers), from the start model and
questions of the first sanity experiment (benchmarks/sanity.py --select).

  python benchmarks/sanity_paired.py --simulate                       # the rule's error rates (seconds)
  flock -n /tmp/rlt-heavy.lock true && \\
  python benchmarks/sanity_paired.py --out results/sanity-paired --deadline 23:18   # pairs, one unit at a time
  python benchmarks/sanity_paired.py --analyse --plot docs/images/sanity-paired.png   # intervals, verdict, plot

Each finished pair is appended to benchmarks/sanity-paired.jsonl (committed, small); a re-run skips the seeds in it.
The runner takes the heavy lock per unit, runs at nice 19 (its units' autogroups too), and never starts a unit that the longest of the recent
units says cannot finish before the deadline; a unit still running at the deadline is stopped.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import teaching_protocol as protocol
from unit_runner import append_row, deadline_ts, heavy_lock, lower_priority, read_rows, run_until, unit_estimate

# ---- pre-registered (docs/experiments.md, "settled with paired seeds"); never edited after the first pair ran
SEEDS = list(range(4, 28))  # 24 new seeds; 1–3 ran in the first experiment and are only pooled as secondary
FULL = 24  # pairs for the final look
INTERIM = 12  # one interim look, PASS only, at 99 %
MARGIN = 0.8  # nats of objective: about half the observed real − shuffled (+1.60); below it GRPO is useless here
LEVEL, INTERIM_LEVEL = 0.95, 0.99
# the first experiment (docs/experiments.md): per seed real, shuffled; the start model's objective
FIRST = {"start": -6.483, "pairs": [(1, -5.110, -7.948), (2, -6.093, -7.221), (3, -4.874, -5.700)]}
# simulation inputs, measured in the first experiment
SEED_SD = 0.90  # seed-to-seed sd of one arm's objective (measurement noise included)
MEAS_SE = 0.23  # measurement s.e. of one teacher's objective (per-sample sd 1.58 / sqrt(48))
OBSERVED = {"real_vs_start": 1.12, "real_vs_shuffled": 1.60}
# the start's objective measured once: s.e. from its per-sample sd (1.58 over 48 samples), 47 degrees of freedom
START_SE = (MEAS_SE, 47.0)

COURTESY = 20.0  # seconds between units without the lock
PAIRS_FILE = Path(__file__).parent / "sanity-paired.jsonl"
CODES = ("PASS", "FAIL", "inconclusive")


# ---- the decision rule, vectorised so that the simulation runs the very code the analysis runs


def bounds(x: np.ndarray, level: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean and the two-sided `level` t interval over the last axis (pairs = seeds are the unit)."""
    n = x.shape[-1]
    if n < 2:
        raise ValueError(f"a paired interval needs ≥ 2 pairs (got {n})")
    m = x.mean(axis=-1)
    half = protocol.t_ppf((1 + level) / 2, n - 1) * x.std(axis=-1, ddof=1) / np.sqrt(n)
    return m, m - half, m + half


def t_ppf_array(p: float, df: np.ndarray) -> np.ndarray:
    """Student-t quantile at p for an array of (possibly fractional) degrees of freedom: the Cornish–Fisher
    expansion of teaching_protocol.t_ppf, elementwise (within ~1 % from 3 degrees of freedom)."""
    import statistics

    z = statistics.NormalDist().inv_cdf(p)
    df = np.asarray(df, dtype=float)
    return (
        z
        + (z**3 + z) / (4 * df)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * df**3)
    )


def bounds_with_start(
    r: np.ndarray, start_se: np.ndarray | float, start_df: float, level: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean of r = real − start over the pairs and its `level` interval with the start's own measurement error
    added: the start is one measurement shared by every pair, so its error (s.e. start_se, start_df degrees of
    freedom) does not average out over the pairs; Welch–Satterthwaite degrees of freedom (issue 52)."""
    n = r.shape[-1]
    m = r.mean(axis=-1)
    a = r.var(axis=-1, ddof=1) / n
    b = np.broadcast_to(np.asarray(start_se, dtype=float) ** 2, np.shape(a))
    df = (a + b) ** 2 / (a**2 / (n - 1) + b**2 / start_df + 1e-300)
    half = t_ppf_array((1 + level) / 2, np.maximum(df, 1.0)) * np.sqrt(a + b)
    return m, m - half, m + half


def decide_arrays(
    d: np.ndarray, r: np.ndarray, start_se: np.ndarray | None = None, start_df: float = 1.0
) -> tuple[np.ndarray, np.ndarray]:
    """The rule on complete experiments: d = real − shuffled and r = real − start per pair, shape (..., FULL) in
    seed order. Returns (code, pairs used): code 0 PASS, 1 FAIL, 2 inconclusive. `start_se` (shape (...,)):
    r's intervals carry the start's measurement error (the corrected rule of issue 52; None: the registered one)."""
    if d.shape[-1] < FULL or r.shape != d.shape:
        raise ValueError(f"the final look needs {FULL} pairs in both arrays (got {d.shape}, {r.shape})")
    d, r = d[..., :FULL], r[..., :FULL]

    def r_lower(x: np.ndarray, level: float) -> np.ndarray:
        if start_se is None:
            return bounds(x, level)[1]
        return bounds_with_start(x, start_se, start_df, level)[1]

    early = (bounds(d[..., :INTERIM], INTERIM_LEVEL)[1] > 0) & (r_lower(r[..., :INTERIM], INTERIM_LEVEL) > 0)
    _, d_lo, d_hi = bounds(d, LEVEL)
    r_lo = r_lower(r, LEVEL)
    code = np.where((d_lo > 0) & (r_lo > 0), 0, np.where(d_hi < MARGIN, 1, 2))
    code = np.where(early, 0, code)
    return code, np.where(early, INTERIM, FULL)


def decide(d: list[float], r: list[float]) -> dict:
    """The verdict of the pairs done so far (seed order). Before FULL pairs only the interim PASS can end it;
    otherwise the verdict is "not in" and the intervals are descriptive."""
    n = len(d)
    out: dict = {"pairs": n}
    if n >= 2:
        out["d"] = [float(v) for v in bounds(np.asarray(d), LEVEL)]
        out["real_vs_start"] = [float(v) for v in bounds(np.asarray(r), LEVEL)]
    if n >= INTERIM:
        d12, r12 = np.asarray(d[:INTERIM]), np.asarray(r[:INTERIM])
        out["interim_lower_99"] = [float(bounds(d12, INTERIM_LEVEL)[1]), float(bounds(r12, INTERIM_LEVEL)[1])]
        if min(out["interim_lower_99"]) > 0:
            out["verdict"] = f"PASS at the interim look ({INTERIM} pairs)"
            return out
    if n >= FULL:
        code, _ = decide_arrays(np.asarray(d[:FULL]), np.asarray(r[:FULL]))
        out["verdict"] = CODES[int(code)]
    else:
        out["verdict"] = f"not in ({n} of {FULL} pairs)"
    return out


# ---- simulation of the rule before any pair runs


def simulate(
    mu_real: float,
    mu_shuffled: float,
    rho: float,
    reps: int = 20_000,
    seed: int = 0,
    sd: float = SEED_SD,
    sd_real: float | None = None,
    start_seeds: int = 1,
) -> dict:
    """Rates of PASS/FAIL/inconclusive and the mean pairs spent. Per pair, each arm's objective = its mean + a seed
    effect (sd² − MEAS_SE² of variance, correlated rho between the arms of a pair: common random numbers) + its own
    measurement noise (MEAS_SE); `sd_real`: the real arm's own sd (default sd). The start model's true objective is
    0. start_seeds 1: it is measured once, with the same noise, and the registered rule reads r as if the start were
    exact; start_seeds M > 1: it is measured with M sampling seeds, their mean is the start, and r's intervals carry
    its standard error (sd of the M / √M, M − 1 degrees of freedom: the corrected rule of issue 52)."""
    rng = np.random.default_rng(seed)
    seed_sd = np.sqrt(sd**2 - MEAS_SE**2)
    real_sd = seed_sd if sd_real is None else np.sqrt(max(sd_real**2 - MEAS_SE**2, 0.0))
    a = rng.standard_normal((reps, FULL))
    b = rho * a + np.sqrt(1 - rho**2) * rng.standard_normal((reps, FULL))
    real = mu_real + real_sd * a + MEAS_SE * rng.standard_normal((reps, FULL))
    shuffled = mu_shuffled + seed_sd * b + MEAS_SE * rng.standard_normal((reps, FULL))
    starts = MEAS_SE * rng.standard_normal((reps, start_seeds))
    start = starts.mean(axis=1, keepdims=True)
    if start_seeds == 1:
        code, used = decide_arrays(real - shuffled, real - start)
    else:
        se = starts.std(axis=1, ddof=1) / np.sqrt(start_seeds)
        code, used = decide_arrays(real - shuffled, real - start, se, start_seeds - 1)
    rates = {name: float(np.mean(code == i)) for i, name in enumerate(CODES)}
    return rates | {"interim_stop": float(np.mean(used == INTERIM)), "mean_pairs": float(used.mean())}


SCENARIOS = (
    ("null: neither arm moves", 0.0, 0.0),
    ("null with drift: real = shuffled = start − 0.48", -0.48, -0.48),
    ("at the margin: real − shuffled 0.8, real − start 0.56", 0.56, -0.24),
    ("observed: real − shuffled 1.60, real − start 1.12", 1.12, -0.48),
)
# issue 52: the null the table above lacked. The real arm does not move (real = start) while the control drifts down
# by what the paired run's shuffled arm did (−0.88 on average), so d passes on the drift alone and only r guards
# PASS; r is real − a start measured once, whose error every pair shares. At the paired run's own real-arm spread
# (sd 0.25 over the pairs) that error decides.
DRIFT = -0.88
START_SEEDS = 4  # the corrected rule: the start measured with this many sampling seeds, its error in r's interval


def simulation_table(reps: int = 20_000) -> list[str]:
    lines = [
        f"| scenario (seed sd {SEED_SD}, measurement s.e. {MEAS_SE}, margin {MARGIN}) | ρ | PASS | FAIL | "
        "inconclusive | stopped at 12 | mean pairs |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, mu_r, mu_s in SCENARIOS:
        for rho in (0.0, 0.5):
            s = simulate(mu_r, mu_s, rho, reps)
            lines.append(
                f"| {name} | {rho:g} | {s['PASS']:.3f} | {s['FAIL']:.3f} | {s['inconclusive']:.3f} | "
                f"{s['interim_stop']:.3f} | {s['mean_pairs']:.1f} |"
            )
    lines += [
        "",
        f"null: real = start, the control drifts {DRIFT:+.2f} (issue 52; ρ 0)",
        "",
        "| real arm's sd | start measured with | rule | PASS | FAIL | inconclusive | stopped at 12 | mean pairs |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for sd_real in (SEED_SD, 0.25):
        for seeds, rule in ((1, "registered: start taken as exact"), (START_SEEDS, "its s.e. in r's interval")):
            s = simulate(0.0, DRIFT, 0.0, reps, sd_real=sd_real, start_seeds=seeds)
            lines.append(
                f"| {sd_real:g} | {seeds} sampling seed{'s' if seeds > 1 else ''} | {rule} | {s['PASS']:.3f} | "
                f"{s['FAIL']:.3f} | {s['inconclusive']:.3f} | {s['interim_stop']:.3f} | {s['mean_pairs']:.1f} |"
            )
    return lines


# ---- the runner: one unit at a time, a deadline guard, pairs appended as they end, resumable


def run_pairs(
    seeds: list[int],
    pairs_path: Path,
    run_unit: Callable[[str, int, float], dict | None],
    start: float,
    deadline: float,
    first_estimate: float,
    clock: Callable[[], float] = time.time,
    log: Callable[[str], None] = print,
) -> list[dict]:
    """Run the missing pairs in seed order. run_unit(arm, seed, seconds left) returns {"objective", "seconds"}, or
    None when it was stopped at the deadline. No unit starts that the estimate says cannot end by the deadline; the
    pair's row is appended when both its units have ended; the interim PASS stops the experiment. run_unit gets
    the unit's estimate, to check again once it holds the machine's lock."""
    rows = read_rows(pairs_path)
    done = {r["seed"] for r in rows}
    durations = [r[f"{a}_seconds"] for r in rows for a in ("real", "shuffled")]
    new: list[dict] = []
    for seed in seeds:
        if seed in done:
            continue
        ordered = [r for r in rows if r["seed"] in seeds]
        if decide([r["d"] for r in ordered], [r["real_vs_start"] for r in ordered])["verdict"].startswith("PASS"):
            log(f"[stop] PASS at the interim look after {len(ordered)} pairs")
            break
        units: dict[str, dict] = {}
        for arm in ("real", "shuffled"):
            need = unit_estimate(durations, first_estimate) * (2 if arm == "real" else 1)
            left = deadline - clock()
            if need > left:
                log(f"[deadline] seed {seed} {arm} not started: needs ~{need:.0f} s, {left:.0f} s left")
                return new
            res = run_unit(arm, seed, need)
            if res is None:
                log(f"[deadline] seed {seed} {arm} not finished by the deadline")
                return new
            durations.append(res["seconds"])
            units[arm] = res
        real, shuffled = units["real"]["objective"], units["shuffled"]["objective"]
        row = {
            "seed": seed,
            "real": real,
            "shuffled": shuffled,
            "start": start,
            "d": real - shuffled,
            "real_vs_start": real - start,
            "real_seconds": units["real"]["seconds"],
            "shuffled_seconds": units["shuffled"]["seconds"],
            # the secondary measures (held-out objective, τ 0.7, r_SS, r_KL, wrong): committed with the pair, not
            # only in the machine's units.jsonl (issue 52: the first 12 pairs' are lost with their machine)
            **{f"{a}_summary": units[a]["summary"] for a in ("real", "shuffled") if "summary" in units[a]},
            "ended": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
        append_row(pairs_path, row)
        rows.append(row)
        new.append(row)
        log(f"[pair] seed {seed}: real {real:+.3f} shuffled {shuffled:+.3f} d {row['d']:+.3f}")
    return new


def unit_runner(out: Path, lock: str | None, deadline: float) -> Callable[[str, int, float], dict | None]:
    """Each unit is benchmarks/sanity.py --unit in its own process group (killed whole at the deadline); a unit
    already in out/units.jsonl (an earlier, interrupted session) is reused, not rerun."""
    sanity = Path(__file__).parent / "sanity.py"

    def measured(arm: str, seed: int) -> dict | None:
        for r in read_rows(out / "units.jsonl"):
            if r["arm"] == arm and r["seed"] == seed:
                return {"objective": r["summary"]["objective_reward"], "seconds": r["seconds"], "summary": r["summary"]}
        return None

    def run(arm: str, seed: int, need: float) -> dict | None:
        if (got := measured(arm, seed)) is not None:
            return got
        with heavy_lock(lock, deadline - need) as held:  # no waiting past the last moment it could start
            if not held or time.time() + need > deadline:  # the wait for the lock may have eaten the time
                return None
            cmd = [sys.executable, "-u", str(sanity), "--out", str(out), "--unit", arm, "--seed", str(seed)]
            status = run_until(cmd, deadline)
            if status is None:
                return None
        time.sleep(COURTESY)  # lets a job blocked on the lock take it before this runner's next unit
        if status:
            raise SystemExit(f"unit {arm} seed {seed} failed (exit {status})")
        return measured(arm, seed)

    return run


def analyse(path: Path, plot: Path | None = None, start_seeds: Path | None = None) -> dict:
    rows = [r for r in read_rows(path) if r["seed"] in SEEDS]
    rows.sort(key=lambda r: SEEDS.index(r["seed"]))
    res = decide([r["d"] for r in rows], [r["real_vs_start"] for r in rows])
    print("| seed | real | shuffled | d = real − shuffled | real − start | seconds (real, shuffled) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['seed']} | {r['real']:+.3f} | {r['shuffled']:+.3f} | {r['d']:+.3f} | {r['real_vs_start']:+.3f} | "
            f"{r['real_seconds']:.0f}, {r['shuffled_seconds']:.0f} |"
        )
    for key in ("d", "real_vs_start"):
        if key in res:
            m, lo, hi = res[key]
            print(f"{key}: {m:+.3f} [{lo:+.3f}, {hi:+.3f}] (95 % paired t, {len(rows)} pairs)")
    if len(rows) >= 2:  # issue 52: the start is one measurement every pair shares; its error, not in the rule
        start, se, df, how = rows[0]["start"], START_SE[0], START_SE[1], "measured once, s.e. from its samples"
        if start_seeds is not None:  # sanity.py --start-seeds: the start's mean and s.e. over its sampling seeds
            got = json.loads(start_seeds.read_text())
            start, se, df = got["mean"], got["se"], len(got["objectives"]) - 1
            how = f"{len(got['objectives'])} sampling seeds"
        r = np.asarray([row["real"] - start for row in rows])
        m, lo, hi = (float(v) for v in bounds_with_start(r, se, df, LEVEL))
        print(
            f"secondary: real − start with the start's error in the interval (start {start:+.3f}, {how}: s.e. "
            f"{se:.3f}, {df:g} df): {m:+.3f} [{lo:+.3f}, {hi:+.3f}]"
        )
        res["real_vs_start_with_start_error"] = [m, lo, hi]
    pooled = [(r - s, r - FIRST["start"]) for _, r, s in FIRST["pairs"]] + [(r["d"], r["real_vs_start"]) for r in rows]
    for i, key in enumerate(("d", "real_vs_start")):
        m, lo, hi = bounds(np.asarray([p[i] for p in pooled]), LEVEL)
        print(f"secondary, pooled with seeds 1–3 ({len(pooled)} pairs): {key} {m:+.3f} [{lo:+.3f}, {hi:+.3f}]")
    print(f"verdict (pre-registered rule): {res['verdict']}")
    if plot is not None and len(rows) >= 2:
        draw(rows, res, plot)
        print(f"plot: {plot}")
    return res


def draw(rows: list[dict], res: dict, path: Path) -> None:
    """Left: each pair's two arms joined, beside the start model. Right: d and real − start per pair, with the
    95 % intervals over the pairs (and the interim look's 99 % lower bounds once there are 12)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.2))
    for r in rows:
        left.plot([0, 1], [r["real"], r["shuffled"]], "o-", color="tab:blue", alpha=0.5)
    left.axhline(rows[0]["start"], color="k", ls="--", lw=0.8, label=f"start model {rows[0]['start']:+.2f}")
    left.set_xticks([0, 1], ["real reward", "shuffled reward"])
    left.set_ylabel("objective (mean reward, 48 samples at τ 1.0)")
    left.set_title(f"each pair, same seed (seeds {rows[0]['seed']}–{rows[-1]['seed']})", fontsize=10)
    left.legend(fontsize=8)
    left.grid(alpha=0.3)
    for i, key in enumerate(("d", "real_vs_start")):
        ys = [r[key] for r in rows]
        right.plot([i - 0.15] * len(ys), ys, "o", alpha=0.5, color="tab:blue")
        m, lo, hi = res[key]
        right.errorbar([i + 0.15], [m], yerr=[[m - lo], [hi - m]], fmt="s", capsize=5, color="k")
        if "interim_lower_99" in res:
            right.plot([i + 0.15], [res["interim_lower_99"][i]], "v", color="tab:red", label="99 % lower, 12 pairs")
    right.axhline(0, color="k", lw=0.8)
    right.axhline(MARGIN, color="grey", ls="--", lw=0.8, label=f"FAIL margin {MARGIN} (d)")
    right.set_xticks([0, 1], ["d = real − shuffled", "real − start"])
    right.set_title(f"per pair (dots), mean and 95 % paired t interval\n{res['verdict']}", fontsize=10)
    handles, labels = right.get_legend_handles_labels()
    right.legend(dict(zip(labels, handles, strict=True)).values(), dict(zip(labels, handles, strict=True)), fontsize=8)
    right.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--simulate", action="store_true", help="print the rule's simulated PASS/FAIL/inconclusive rates")
    p.add_argument("--reps", type=int, default=20_000)
    p.add_argument("--analyse", action="store_true", help="print the pairs, intervals and verdict")
    p.add_argument("--plot", type=Path, help="with --analyse: draw the pairs and intervals here")
    p.add_argument("--start-seeds", type=Path, help="with --analyse: start-seeds.json of sanity.py --start-seeds")
    p.add_argument("--out", default="results/sanity-paired", help="start.json, chosen.jsonl and the start model")
    p.add_argument("--pairs", type=Path, default=PAIRS_FILE)
    p.add_argument("--deadline", help="HH:MM UTC: no unit runs past it")
    p.add_argument("--minutes", type=float, help="or: no unit runs past this many minutes from now")
    p.add_argument("--first-estimate", type=float, default=900.0, help="seconds a unit may take before one ran")
    p.add_argument("--nice", type=int, default=19)
    p.add_argument("--lock", default="/tmp/rlt-heavy.lock", help="taken per unit; '' for none")
    args = p.parse_args(argv)
    if args.simulate:
        print("\n".join(simulation_table(args.reps)))
        return
    if args.analyse:
        analyse(args.pairs, args.plot, args.start_seeds)
        return
    end = deadline_ts(args.deadline, args.minutes, dt.datetime.now(dt.UTC))
    out = Path(args.out)
    start_file = out / "start.json"
    if not start_file.exists():
        raise SystemExit(f"{start_file}: missing; run benchmarks/sanity.py --out {out} --select first")
    start = json.loads(start_file.read_text())["summary"]["objective_reward"]
    lower_priority(args.nice)
    run_pairs(SEEDS, args.pairs, unit_runner(out, args.lock or None, end), start, end, args.first_estimate)
    analyse(args.pairs)


if __name__ == "__main__":
    main()
