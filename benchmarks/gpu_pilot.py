"""GPU pilot of the RLT teacher on `builtin:sums` (issues 36, 46): does GRPO with the real reward raise the held-out
objective above the same GRPO with the rewards permuted within each group (the sanity experiment's shuffled arm,
benchmarks/sanity.py), and above the start model? Sized for one H100/H200 in ≤ 5 minutes of compute after the
model conversion and the warm-up, and built to bring back data: every trained teacher's explanations.

Runs on a box with torch and transformers but no TRL wheel installed in this command (the check command carries
TRL): the GRPO update is written here on top of rlt's own reward (rlt.method.reward), sampler
(rlt.method.generation) and prompts. The update is TRL's with β = 0, one iteration per generation round (the importance
ratio is 1) and the paper's normalisation, TRL's loss_type "grpo" (each sequence's mean token loss, averaged over
sequences); fp32 master weights, bf16 autocast on CUDA.

Before the clock: the SmolLM2 GGUF → safetensors conversion and the short SFT warm-up (the start model). Then one
process per seed on the one GPU; each holds both arms' teachers and alternates their steps (real k, shuffled k), so
a pair always has the same number of steps when the deadline stops it, the same questions, and the same sampling
seed per step (common random numbers). Each arm's held-out measurement (`--heldout` × K at τ 1.0 and 0.7, the same
sampling seed for every teacher) and its explanations are written as soon as the pair ends. The parent measures the
start model meanwhile; past `--minutes` it stops what still runs. The results come back as at most 5 files in
`--out`: pilot.json (the gates), explanations.jsonl (start and every trained teacher: τ 0.7, K per held-out
question, with their rewards), steps.jsonl (every step of every arm), results.tar.gz (the per-seed JSON).

  python benchmarks/gpu_pilot.py --out $OUT/pilot                  # the pilot (GPU): 4 seeds × ≤ 40 steps × 8 × G 16
  python benchmarks/gpu_pilot.py --rehearsal --out /tmp/pilot       # CPU, tiny model, cut sizes, short deadline
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import teaching_protocol as protocol

PILOT = dict(
    seeds=4, steps=40, questions=8, generations=16, lr=1e-5, temperature=1.0, cap=64, heldout=128, k=4, minutes=8.0
)
PILOT.update(sft_steps=8, sft_lr=1e-4, train_size=512, minutes=4.0)
REHEARSAL = dict(seeds=2, steps=3, questions=2, generations=4, heldout=4, k=4, minutes=3.0, sft_steps=2, cap=16)
MICRO = 32  # rows per forward/backward of the update
EVAL_BATCH = 128  # sequences per generate call of the held-out measurement (16 on CPU)
EVAL_SEED = 4242  # common random numbers of every held-out measurement
TAUS = (1.0, 0.7)


def device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def autocast(dev: str):
    import contextlib

    import torch

    return torch.autocast("cuda", dtype=torch.bfloat16) if dev == "cuda" else contextlib.nullcontext()


def load(path: str, dev: str, trainable: bool):
    """fp32 weights (the master copy when trained); the frozen student in bf16 on CUDA."""
    import torch
    from transformers import AutoModelForCausalLM

    from rlt.data.models import load_tokenizer, resolve_model_path

    dtype = torch.float32 if trainable or dev != "cuda" else torch.bfloat16
    model = AutoModelForCausalLM.from_pretrained(resolve_model_path(path), dtype=dtype).to(dev)
    model.train(trainable).requires_grad_(trainable)
    return model, load_tokenizer(path, padding_side="left")


def formatter():
    from rlt.method.prompts import Formatter, resolve_format
    from rlt.spec.inputs import FormatSpec

    return Formatter(resolve_format(FormatSpec()))


def completion_logprobs(
    model, prompt_ids: list[list[int]], completion_ids: list[list[int]], dev: str, tau: float = 1.0
):
    """Per sequence, the policy's tempered (logits / τ, as TRL scores the policy at the sampling τ) log-prob of each
    completion token, right-padded; returns (logprobs [B, T], mask [B, T])."""
    import torch

    seqs = [p + c for p, c in zip(prompt_ids, completion_ids, strict=True)]
    width = max(len(s) for s in seqs)
    ids = torch.zeros(len(seqs), width, dtype=torch.long, device=dev)
    attn = torch.zeros_like(ids)
    cmask = torch.zeros(len(seqs), width, device=dev)
    for i, (p, c) in enumerate(zip(prompt_ids, completion_ids, strict=True)):
        ids[i, : len(p) + len(c)] = torch.tensor(p + c, device=dev)
        attn[i, : len(p) + len(c)] = 1
        cmask[i, len(p) : len(p) + len(c)] = 1
    with autocast(dev):
        logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1].float() / tau
    lp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    return lp, cmask[:, 1:]


def grpo_step(model, opt, tok, fmt, reward, rows: list[dict], sz: dict, dev: str, permute=None) -> dict:
    """One GRPO update: G samples per question, the RLT reward (permuted within each group by `permute`, a numpy
    Generator, in the shuffled arm: the group's mean and spread and so the step sizes stay, the direction is
    random), group-standardised advantages, TRL's loss with β 0, one iteration (ratio 1) and loss_type "grpo"."""
    import torch
    from sanity import permute_within_groups

    from rlt.method.generation import sample_with_logprobs

    g, tau, cap = sz["generations"], sz["temperature"], sz["cap"]
    prompts = [
        tok(fmt.teacher_prompt(tok, r["question"], r["solution"]), add_special_tokens=False).input_ids for r in rows
    ]
    prompt_ids = [p for p in prompts for _ in range(g)]
    model.eval()
    with torch.no_grad(), autocast(dev):
        s = sample_with_logprobs(model, tok, prompt_ids, temperature=tau, top_p=1.0, max_new_tokens=cap)
    model.train()
    texts = tok.batch_decode(s.completion_ids, skip_special_tokens=True)
    flat = [r for r in rows for _ in range(g)]
    br = reward.score([r["question"] for r in flat], [r["solution"] for r in flat], texts, s.logprobs, s.completion_ids)
    used = br.total if permute is None else permute_within_groups(list(br.total), g, permute)
    r = torch.tensor(used, device=dev).view(len(rows), g)
    adv = ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-4)).view(-1)
    opt.zero_grad(set_to_none=True)
    for a in range(0, len(prompt_ids), MICRO):  # micro-batches: full-vocabulary log-probs of 128 rows are GBs
        b = a + MICRO
        lp, mask = completion_logprobs(model, prompt_ids[a:b], s.completion_ids[a:b], dev, tau)
        per_seq = (lp * mask).sum(1) / mask.sum(1).clamp(min=1)  # the paper's: each sequence's mean token loss
        loss = -(adv[a:b] * per_seq).sum() / len(prompt_ids)
        loss.backward()
    gn = float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))
    opt.step()
    ent = -statistics.fmean(x for seq in s.logprobs for x in seq) if any(s.logprobs) else float("nan")
    real = torch.tensor(br.total).view(len(rows), g)
    return {
        "reward": float(real.mean()),  # the real reward in both arms: the shuffled arm's curve is comparable
        "reward_std": float(real.std()),
        "zero_std_groups": float((real.std(1) == 0).float().mean()),
        "cap_hits": sum(len(c) >= cap for c in s.completion_ids) / len(s.completion_ids),
        "grad_norm": gn,
        "entropy": ent,  # mean −log p of the sampled tokens at τ: the policy's entropy estimate
        **{k: v for k, v in br.means().items() if k != "total"},
    }


def sft_step(model, opt, tok, fmt, rows: list[dict], dev: str) -> dict:
    """One supervised step on the rows' worked traces, loss on the completion only (the sft stage's rows)."""
    import torch

    prompts = [
        tok(fmt.teacher_prompt(tok, r["question"], r["solution"]), add_special_tokens=False).input_ids for r in rows
    ]
    comps = [
        tok(fmt.teacher_completion(r["reasoning_trace"], tok.eos_token), add_special_tokens=False).input_ids
        for r in rows
    ]
    lp, mask = completion_logprobs(model, prompts, comps, dev)
    loss = -(lp * mask).sum() / mask.sum()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return {"loss": float(loss.detach())}


def measure(model, tok, fmt, student, s_tok, rows: list[dict], k: int, cap: int) -> tuple[dict, list[dict]]:
    """The objective (mean RLT reward) per held-out question at each τ of TAUS, K samples, common random numbers;
    with r_SS's solution log-prob (the teaching measure, exploratory) and r_KL's two parts. Also the explanations
    at τ 0.7 (the protocol's), each with its reward: what the CPU distils and evaluates afterwards."""
    from rlt.method.reward import RLTReward

    model.eval()
    out, explanations = {}, []
    for tau in TAUS:
        sampled = protocol.sample_explanations(
            model, tok, fmt, rows, k, cap, seed=EVAL_SEED, temperature=tau, batch_size=EVAL_BATCH
        )
        texts = sampled[0]
        reward = RLTReward(student, s_tok, fmt, temperature=tau, batch_size=64)
        br = protocol.score_sampled(reward, rows, sampled)

        def per_q(xs: list[float]) -> list[float]:
            return [statistics.fmean(xs[i * k : (i + 1) * k]) for i in range(len(rows))]

        out[f"tau{tau:g}"] = {
            "reward": per_q(br.total),
            "solution_logprob": per_q(br.solution_logprob_mean),
            "kl_teacher_logprob": per_q(br.kl_teacher_logprob),
            "kl_student_ce": per_q(br.kl_student_ce),
        }
        if tau == 0.7:
            explanations = [
                {
                    "question_index": i,
                    "question": rows[i]["question"],
                    "solution": rows[i]["solution"],
                    "sample": j,
                    "tau": tau,
                    "explanation": texts[i][j],
                    "reward": br.total[i * k + j],
                }
                for i in range(len(rows))
                for j in range(k)
            ]
    return out, explanations


def data(sz: dict) -> tuple[list[dict], list[dict]]:
    from learning import heldout_rows

    from rlt.data import tasks

    return tasks.generate("sums", sz["train_size"], 0), heldout_rows("sums", sz["train_size"], sz["heldout"])


def warm_up(args, sz: dict, out: Path, dev: str) -> str:
    """The short SFT teacher (8 steps × 8 rows, lr 1e-4 cosine, as benchmarks/learning.py): the start model."""
    import torch

    start = out / "start"
    if (start / "config.json").exists():
        return str(start)
    model, tok = load(args.model, dev, trainable=True)
    fmt = formatter()
    train, _ = data(sz)
    opt = torch.optim.AdamW(model.parameters(), lr=sz["sft_lr"])
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, sz["sft_steps"])
    torch.manual_seed(0)
    for step in range(sz["sft_steps"]):
        rows = [train[i] for i in torch.randperm(len(train))[:8].tolist()]
        m = sft_step(model, opt, tok, fmt, rows, dev)
        sched.step()
        print(f"[warm-up] step {step + 1}: loss {m['loss']:.3f}", flush=True)
    model.save_pretrained(start)
    tok.save_pretrained(start)
    return str(start)


ARMS = ("real", "shuffled")


def worker(args, sz: dict, out: Path, seed: int, deadline: float) -> None:
    """One seed: both arms from the start model, their steps alternated (real k, shuffled k) on the same questions
    with the same sampling seed per step, so the deadline stops the pair at the same step; then each arm measured,
    its result and explanations written at once."""
    import numpy as np
    import torch

    from rlt.method.reward import RLTReward

    dev = device()
    fmt = formatter()
    train, heldout = data(sz)
    start = str(out / "start")
    student, s_tok = load(args.model, dev, trainable=False)
    s_tok.padding_side = "right"
    reward = RLTReward(student, s_tok, fmt, temperature=sz["temperature"], batch_size=64)
    rng = np.random.default_rng([seed, 1])  # the seed's questions, the same for both arms
    draws = [rng.choice(len(train), sz["questions"], replace=False).tolist() for _ in range(sz["steps"])]
    d = out / f"seed{seed}"
    d.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    arms = {}
    for arm in ARMS:
        model, tok = load(start, dev, trainable=True)
        arms[arm] = (model, tok, torch.optim.AdamW(model.parameters(), lr=sz["lr"]))
    permute = np.random.default_rng([seed, 2])  # the shuffled arm's permutations
    done = 0
    for step, draw in enumerate(draws, 1):
        if time.time() > deadline:
            break
        rows = [train[i] for i in draw]
        for arm, (model, tok, opt) in arms.items():
            torch.manual_seed(seed * 10_000 + step)  # common random numbers: both arms sample with one seed
            m = grpo_step(model, opt, tok, fmt, reward, rows, sz, dev, permute if arm == "shuffled" else None)
            with (d / "steps.jsonl").open("a") as f:
                f.write(json.dumps({"seed": seed, "arm": arm, "step": step, **m}) + "\n")
        done = step
    train_s = round(time.time() - t0, 1)
    for arm, (model, tok, _) in arms.items():
        measures, explanations = measure(model, tok, fmt, student, s_tok, heldout, sz["k"], sz["cap"])
        result = {"arm": arm, "seed": seed, "steps_done": done, "train_seconds": train_s, "measures": measures}
        (d / f"{arm}.json").write_text(json.dumps(result))
        with (d / f"explanations-{arm}.jsonl").open("w") as f:
            f.writelines(json.dumps({"seed": seed, "arm": arm, **e}) + "\n" for e in explanations)
        print(f"[seed {seed}] {arm}: {done} steps, {time.time() - t0:.0f} s", flush=True)
    del arms


MARGIN = 0.8  # FAIL when real − shuffled's upper 95 % bound is below it: half the CPU sanity run's paired +1.6


def curve(steps: list[dict]) -> float:
    """The real reward's mean over the last third of an arm's steps minus over its first third."""
    third = max(1, len(steps) // 3)
    return statistics.fmean(x["reward"] for x in steps[-third:]) - statistics.fmean(x["reward"] for x in steps[:third])


def interval(xs: list[float]) -> list[float] | None:
    return list(protocol.one_sample_interval(xs)) if len(xs) >= 2 else None


def health(steps: list[dict]) -> dict:
    finite = all(math.isfinite(v) for x in steps for k, v in x.items() if k.startswith("kl") or k == "grad_norm")
    last = steps[-max(1, len(steps) // 3) :]
    return {
        "zero_std_groups": statistics.fmean(x["zero_std_groups"] for x in steps),
        "cap_hits_last_third": statistics.fmean(x["cap_hits"] for x in last),
        "entropy_first_last": [steps[0]["entropy"], steps[-1]["entropy"]],
        "kl_and_grad_finite": finite,
    }


def report(sz: dict, out: Path, started: float) -> dict:
    """Primary: real − shuffled (paired per seed) and real − start of the held-out objective at the training τ, with
    seed-level 95 % t intervals. Secondary: the training curve, health, the teaching measure."""
    start = json.loads((out / "start.json").read_text())["measures"]
    res: dict = {"sizes": sz, "seconds": round(time.time() - started, 1), "loss": "TRL loss_type grpo (the paper's)"}
    seeds = sorted(int(f.parent.name[4:]) for f in out.glob("seed*/shuffled.json") if (f.parent / "real.json").exists())
    res["seeds"], lines = seeds, [f"seeds with both arms: {seeds}"]
    obj = {a: {s: json.loads((out / f"seed{s}" / f"{a}.json").read_text()) for s in seeds} for a in ARMS}
    for tau in TAUS:
        key = f"tau{tau:g}"
        s0 = statistics.fmean(start[key]["reward"])
        real = [statistics.fmean(obj["real"][s]["measures"][key]["reward"]) for s in seeds]
        shuf = [statistics.fmean(obj["shuffled"][s]["measures"][key]["reward"]) for s in seeds]
        teach = [
            statistics.fmean(obj["real"][s]["measures"][key]["solution_logprob"])
            - statistics.fmean(obj["shuffled"][s]["measures"][key]["solution_logprob"])
            for s in seeds
        ]
        row = {
            "start": s0,
            "real": dict(zip(seeds, real, strict=True)),
            "shuffled": dict(zip(seeds, shuf, strict=True)),
        }
        row.update(real_vs_shuffled=interval([r - x for r, x in zip(real, shuf, strict=True)]))
        row.update(real_vs_start=interval([r - s0 for r in real]), teaching_real_vs_shuffled=interval(teach))
        res[key] = row
        lines.append(
            f"τ {tau:g}: start {s0:+.3f}; per seed (real, shuffled): "
            + ", ".join(f"{s}: ({r:+.3f}, {x:+.3f})" for s, r, x in zip(seeds, real, shuf, strict=True))
        )
        for k in ("real_vs_shuffled", "real_vs_start", "teaching_real_vs_shuffled"):
            if row[k]:
                lines.append(f"       {k}: {row[k][0]:+.3f} [{row[k][1]:+.3f}, {row[k][2]:+.3f}] (95 % t over seeds)")
    steps = [json.loads(x) for f in sorted(out.glob("seed*/steps.jsonl")) for x in f.read_text().splitlines()]
    by = {(a, s): [x for x in steps if x["arm"] == a and x["seed"] == s] for a in ARMS for s in seeds}
    curves = [curve(by["real", s]) - curve(by["shuffled", s]) for s in seeds if by["real", s]]
    res["health"] = {f"{a}/seed{s}": health(v) for (a, s), v in by.items() if v}
    res["training_curve_real_minus_shuffled"] = interval(curves)
    res["gates"] = gates(res, curves)
    (out / "pilot.json").write_text(json.dumps(res, indent=1))
    print("\n".join(lines))
    print("gates: " + json.dumps(res["gates"]))
    print(f"wall {res['seconds']:.0f} s; {out / 'pilot.json'}")
    return res


def gates(res: dict, curves: list[float]) -> dict:
    """The primary verdict (PASS: both lower bounds above 0; FAIL: real − shuffled's upper bound below MARGIN;
    else inconclusive) at τ 1.0, and the secondary gates, each a yes/no that can fail."""
    obj = res["tau1"]
    vs_shuf, vs_start = obj["real_vs_shuffled"], obj["real_vs_start"]
    if vs_shuf and vs_start and vs_shuf[1] > 0 and vs_start[1] > 0:
        verdict = "PASS"
    elif vs_shuf and vs_shuf[2] < MARGIN:
        verdict = "FAIL"
    else:
        verdict = "inconclusive" if vs_shuf else "no result (fewer than 2 complete pairs)"
    real = [h for k, h in res["health"].items() if k.startswith("real/")]
    return {
        "primary": verdict,
        "primary_margin": MARGIN,
        "curve_real_above_shuffled": bool(curves) and statistics.fmean(curves) > 0,
        "zero_std_groups_under_half": bool(real) and all(h["zero_std_groups"] < 0.5 for h in real),
        "cap_hits_under_half": bool(real) and all(h["cap_hits_last_third"] < 0.5 for h in real),
        "no_entropy_collapse": bool(real)
        and all(h["entropy_first_last"][1] >= 0.1 * h["entropy_first_last"][0] for h in real),
        "kl_finite": bool(real) and all(h["kl_and_grad_finite"] for h in res["health"].values()),
    }


def pack(work: Path, out: Path) -> None:
    """What comes back from the box, ≤ 5 files one folder deep: pilot.json, every explanation and every step in
    one JSONL each, the per-seed JSON in one tar (never the models)."""
    import tarfile

    out.mkdir(parents=True, exist_ok=True)
    explanations = sorted(work.glob("explanations-*.jsonl")) + sorted(work.glob("seed*/explanations-*.jsonl"))
    for name, parts in (("explanations.jsonl", explanations), ("steps.jsonl", sorted(work.glob("seed*/steps.jsonl")))):
        with (out / name).open("w") as f:
            for part in parts:
                f.write(part.read_text())
    if (work / "pilot.json").exists():
        (out / "pilot.json").write_text((work / "pilot.json").read_text())
    with tarfile.open(out / "results.tar.gz", "w:gz") as tar:
        for f in sorted(work.glob("*.json")) + sorted(work.glob("seed*/*.json")):
            tar.add(f, arcname=str(f.relative_to(work)))


def measure_start(args, sz: dict, work: Path, dev: str, start: str) -> None:
    model, tok = load(start, dev, trainable=False)
    student, s_tok = load(args.model, dev, trainable=False)
    s_tok.padding_side = "right"
    _, heldout = data(sz)
    m, explanations = measure(model, tok, formatter(), student, s_tok, heldout, sz["k"], sz["cap"])
    (work / "start.json").write_text(json.dumps({"measures": m}))
    with (work / "explanations-start.jsonl").open("w") as f:
        f.writelines(json.dumps({"seed": 0, "arm": "start", **e}) + "\n" for e in explanations)
    questions = [
        {"question_index": i, "question": r["question"], "solution": r["solution"]} for i, r in enumerate(heldout)
    ]
    (work / "questions.json").write_text(json.dumps(questions))


def main(argv: list[str] | None = None) -> dict | None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="builtin:smollm2-135m-instruct", help="teacher start and frozen student")
    p.add_argument("--out", default="results/pilot", help="the ≤ 5 files that come back")
    p.add_argument("--work", default="/tmp/rlt-pilot-work", help="models and per-seed files (stays on the box)")
    p.add_argument("--rehearsal", action="store_true", help="CPU sizes with a tiny model and a short deadline")
    p.add_argument("--minutes", type=float, help="deadline after the conversion and warm-up (default 4)")
    p.add_argument("--wall", type=float, help="and at most this many seconds after the start, conversion included")
    p.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    p.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    sz = PILOT | (REHEARSAL if args.rehearsal else {})
    # sizes overridden for a shorter device slot (inherited by the seed processes): RLT_PILOT_SIZES='{"heldout": 32}'
    sz.update(json.loads(os.environ.get("RLT_PILOT_SIZES") or "{}"))
    if args.rehearsal and args.model == p.get_default("model"):
        args.model = "builtin:tiny-qwen2"
    if args.minutes:
        sz["minutes"] = args.minutes
    work = Path(args.work)
    if args.worker is None:
        shutil.rmtree(work, ignore_errors=True)  # a run's files only: steps.jsonl is appended to
    work.mkdir(parents=True, exist_ok=True)
    from transformers.utils import logging as hf_logging  # not rlt's quiet_libraries: it imports `datasets`

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    if args.worker is not None:
        worker(args, sz, work, args.worker, args.deadline)
        return None
    from rlt.data.models import resolve_model_path

    dev = device()
    t0 = time.time()
    print(f"[pilot] {dev}; sizes {sz}; {args.model} -> {resolve_model_path(args.model)}", flush=True)
    start = warm_up(args, sz, work, dev)
    started = time.time()  # the clock starts after the conversion and the warm-up
    print(f"[pilot] conversion and warm-up: {started - t0:.0f} s; the clock starts", flush=True)
    deadline = min(started + 60 * sz["minutes"], t0 + (args.wall or float("inf")))
    reserve = 0.35 * (deadline - started)  # each seed stops training with this left to measure its two teachers
    base = [sys.executable, "-u", __file__, "--work", str(work), "--model", args.model]
    base += ["--rehearsal"] if args.rehearsal else []
    procs = [
        subprocess.Popen([*base, "--worker", str(s), "--deadline", str(deadline - reserve)])
        for s in range(1, sz["seeds"] + 1)
    ]
    measure_start(args, sz, work, dev, start)  # meanwhile: the seeds are the long part
    for proc in procs:
        try:
            proc.wait(timeout=max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            proc.kill()
            print(f"[deadline] a seed process was stopped at {(deadline - started) / 60:.1f} min", flush=True)
    try:
        return report(sz, work, started)
    finally:
        pack(work, Path(args.out))


if __name__ == "__main__":
    main()
