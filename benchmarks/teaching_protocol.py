"""The pre-registered comparison of docs/experiments.md ("Does RL teach better than SFT?"): held-out measures per
teacher and question, the two-way paired bootstrap over seeds and questions, and the verdict rule.

Used by benchmarks/learning.py; the statistics are pure functions (tested in tests/training/test_learning_benchmark.py).
"""

from __future__ import annotations

import math
import re
import statistics

import numpy as np

DELTA = 0.1  # smallest effect of interest, nats per solution token (pre-registered)
BOOTSTRAP = 10_000

_SUMS = re.compile(r"^What is (\d+) \+ (\d+)\?$")

_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131)
_T975 += (2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


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


def t_interval(xs: list[float]) -> tuple[float, float]:
    """Mean and 95 % t half-width."""
    n = len(xs)
    if n < 2:
        return (xs[0] if xs else float("nan")), float("nan")
    return statistics.fmean(xs), t_quantile(n - 1) * statistics.stdev(xs) / math.sqrt(n)


def two_way_bootstrap(d: list[list[float]], resamples: int = BOOTSTRAP, seed: int = 0) -> tuple[float, float, float]:
    """Mean of d[seed][question] and its 95 % percentile interval, resampling seeds and questions with replacement
    (the same question draw for every seed: the pairing of questions across seeds is kept)."""
    arr = np.asarray(d, dtype=float)
    if arr.ndim != 2 or arr.size == 0:
        raise ValueError("d must be a non-empty seeds × questions table")
    rng = np.random.default_rng(seed)
    n_s, n_q = arr.shape
    si = rng.integers(0, n_s, size=(resamples, n_s))
    qi = rng.integers(0, n_q, size=(resamples, n_q))
    # mean over the resampled seeds × questions grid of each resample
    means = np.array([arr[np.ix_(si[b], qi[b])].mean() for b in range(resamples)])
    lo, hi = np.percentile(means, [2.5, 97.5])
    return float(arr.mean()), float(lo), float(hi)


def verdict(lo: float, hi: float, delta: float = DELTA) -> str:
    """The pre-registered reading of the primary interval."""
    if lo > 0:
        return "RL teaches better"
    if hi < 0:
        return "RL teaches worse"
    if -delta <= lo and hi <= delta:
        return "no difference"
    return "inconclusive"


def mentions(text: str, number: str) -> bool:
    """Whether `number` appears in `text` as a whole number (not inside a longer one)."""
    return re.search(rf"(?<!\d){re.escape(number)}(?!\d)", text) is not None


def partial_sums(question: str) -> tuple[str, str] | None:
    """The two partial results of a `sums` question (tens sum, ones sum); None for other questions."""
    m = _SUMS.match(question.strip())
    if m is None:
        return None
    a, b = int(m.group(1)), int(m.group(2))
    return str(a // 10 * 10 + b // 10 * 10), str(a % 10 + b % 10)


def bare_leak(question: str, explanation: str, solution: str) -> float:
    """1 when the explanation states the answer but neither correct partial sum, 0 when not; NaN off `sums`."""
    parts = partial_sums(question)
    if parts is None:
        return float("nan")
    return float(mentions(explanation, solution) and not any(mentions(explanation, p) for p in parts))


def sample_explanations(
    model,
    tokenizer,
    formatter,
    rows: list[dict],
    k: int,
    max_new_tokens: int,
    seed: int,
    temperature: float = 0.7,
    batch_size: int = 16,
):
    """K teacher completions per row, sampled at τ (0.7: the protocol's; the rl stage's τ: the objective), with their token ids and sampling
    log-probs (so the reward needs no second teacher forward): (texts, ids, logprobs), each [row][k]. The same
    sampling seed for every teacher gives common random numbers, which narrows the paired differences."""
    import torch

    from rlt.method.generation import sample_with_logprobs

    torch.manual_seed(seed)
    prompts = [formatter.teacher_prompt(tokenizer, r["question"], r["solution"]) for r in rows for _ in range(k)]
    ids = [tokenizer(p, add_special_tokens=False).input_ids for p in prompts]
    out = sample_with_logprobs(
        model, tokenizer, ids, temperature=temperature, top_p=1.0, max_new_tokens=max_new_tokens, batch_size=batch_size
    )
    texts = tokenizer.batch_decode(out.completion_ids, skip_special_tokens=True)

    def per_row(xs: list) -> list[list]:
        return [xs[i * k : (i + 1) * k] for i in range(len(rows))]

    return per_row(texts), per_row(out.completion_ids), per_row(out.logprobs)


def score_sampled(reward, rows: list[dict], sampled):
    """The reward's parts (RewardBatch) for every explanation of sample_explanations' output `sampled`, flat in its
    order (row by row, its K explanations together); the teacher's log-probs are the sampling's."""
    texts, ids, logprobs = sampled
    k = len(texts[0])
    flat_rows = [r for r in rows for _ in range(k)]
    return reward.score(
        [r["question"] for r in flat_rows],
        [r["solution"] for r in flat_rows],
        [t for ts in texts for t in ts],
        [x for xs in logprobs for x in xs],
        [x for xs in ids for x in xs],
    )


def measure(student, s_tok_left, formatter, rows: list[dict], sampled, reward) -> dict:
    """Per question (mean over its K explanations): the student's solution log-prob, accuracy when shown the
    explanation, states-answer, bare-leak, closed, r_KL, reward, tokens. `sampled` is sample_explanations' output;
    `reward` an RLTReward with the frozen student (the teacher's log-probs come from the sampling)."""
    from task_calibration import answer_explained, graded

    completions = sampled[0]
    k = len(completions[0])
    flat_rows = [r for r in rows for _ in range(k)]
    flat = [c for cs in completions for c in cs]
    qs, sols = [r["question"] for r in flat_rows], [r["solution"] for r in flat_rows]
    br = score_sampled(reward, rows, sampled)
    expl = [formatter.split_explanation(c)[0] for c in flat]
    ok = graded(qs, answer_explained(student, s_tok_left, formatter, qs, expl), formatter)
    per = {
        "solution_logprob": br.solution_logprob_mean,
        "accuracy": [float(x) for x in ok],
        "states_answer": [float(mentions(e, s)) for e, s in zip(expl, sols, strict=True)],
        "bare_leak": [bare_leak(q, e, s) for q, e, s in zip(qs, expl, sols, strict=True)],
        "closed": [float(p == 0) for p in br.format_penalty],
        "r_kl": br.r_kl,
        "reward": br.total,
        "tokens": [float(t) for t in br.explanation_tokens],
    }
    out = {key: [statistics.fmean(v[i * k : (i + 1) * k]) for i in range(len(rows))] for key, v in per.items()}
    out["examples"] = expl[: 3 * k : k]
    return out


def compare(sft: dict, rl: dict[int, dict], keys: tuple[str, ...]) -> dict:
    """RL − SFT per key: the two-way bootstrap mean and interval, and per seed the mean with its t half-width."""
    out = {}
    for key in keys:
        d = [[a - b for a, b in zip(rl[s][key], sft[key], strict=True)] for s in sorted(rl)]
        if any(math.isnan(x) for row in d for x in row):
            continue
        mean, lo, hi = two_way_bootstrap(d)
        seed_means = [statistics.fmean(row) for row in d]
        out[key] = {
            "mean": mean,
            "ci95": [lo, hi],
            # the seed as the unit (issue 36): t interval over the per-seed means, and the seeds 80 % power needs
            "seed_t": list(one_sample_interval(seed_means)) if len(seed_means) >= 2 else None,
            "power": power_lines(statistics.stdev(seed_means), [0.1, 0.25, 0.5]) if len(seed_means) >= 2 else [],
            "per_seed": {s: t_interval(row) for s, row in zip(sorted(rl), d, strict=True)},
            "sft": statistics.fmean(sft[key]),
            "rl": {s: statistics.fmean(rl[s][key]) for s in sorted(rl)},
        }
    return out


# ---- seed-level statistics (issue 36: the seed is the unit of every later run)


def t_ppf(p: float, df: float) -> float:
    """Student-t quantile at probability p: the table for the two-sided 95 % point at integer df, else the
    Cornish–Fisher expansion around the normal quantile (good to ~1 % from 3 degrees of freedom)."""
    z = statistics.NormalDist().inv_cdf(p)
    if df <= 0:
        return math.copysign(float("inf"), z)
    if abs(p - 0.975) < 1e-12 and float(df).is_integer():
        return t_quantile(int(df))
    return (
        z
        + (z**3 + z) / (4 * df)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * df**3)
    )


def welch_interval(a: list[float], b: list[float]) -> tuple[float, float, float]:
    """Mean(a) − mean(b) and its 95 % Welch t interval, one value per seed on each side (seeds are the unit).
    The Welch–Satterthwaite degrees of freedom are rounded down (conservative)."""
    if len(a) < 2 or len(b) < 2:
        raise ValueError(f"a seed-level interval needs ≥ 2 seeds per side (got {len(a)} and {len(b)})")
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    d = statistics.fmean(a) - statistics.fmean(b)
    se = math.sqrt(va + vb)
    if se == 0:
        return d, d, d
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    half = t_quantile(max(1, math.floor(df))) * se
    return d, d - half, d + half


def one_sample_interval(xs: list[float], ref: float = 0.0) -> tuple[float, float, float]:
    """Mean(xs) − ref and its 95 % t interval over the seeds."""
    m, half = t_interval(xs)
    return m - ref, m - ref - half, m - ref + half


def detectable_effect(sd: float, n: int, power: float = 0.8, two_arms: bool = True) -> float:
    """Smallest true difference a two-sided 5 % t test detects with `power`, for n units per arm of spread sd
    (two_arms: a difference of two independent arm means, df 2n − 2; else a one-sample mean, df n − 1)."""
    df = 2 * n - 2 if two_arms else n - 1
    se = sd * math.sqrt(2 / n if two_arms else 1 / n)
    return (t_ppf(0.975, df) + t_ppf(power, df)) * se


def seeds_needed(sd: float, effect: float, power: float = 0.8, two_arms: bool = True, cap: int = 10_000) -> int:
    """Seeds per arm for `power` at `effect` given the seed-level spread sd (the t-test power approximation above);
    at least 2 (an interval needs them); `cap` when even that many would not do."""
    if effect <= 0 or not math.isfinite(sd):
        return cap
    for n in range(2, cap):
        if detectable_effect(sd, n, power, two_arms) <= effect:
            return n
    return cap


def power_lines(sd: float, effects: list[float], power: float = 0.8) -> list[str]:
    """The printed power calculation: seeds per arm needed for each effect at the measured seed spread."""
    return [
        f"seed-level sd {sd:.3f}: {seeds_needed(sd, e, power)} seeds per arm for {power:.0%} power at a difference "
        f"of {e:g} (two-sided 5 %, Welch)"
        for e in effects
    ]


def sanity_verdict(vs_start: tuple[float, float, float], vs_shuffled: tuple[float, float, float]) -> str:
    """The sanity experiment's pre-registered rule (docs/experiments.md, "Sanity experiment"). Each argument is
    (difference, low, high) of the real-reward arm against the start model / the shuffled-reward arm.
    PASS: real beats both with the interval above 0; FAIL: real ≤ shuffled; else inconclusive."""
    if vs_shuffled[0] <= 0:
        return "FAIL"
    if vs_start[1] > 0 and vs_shuffled[1] > 0:
        return "PASS"
    return "inconclusive"
