"""GPU pilot of the RLT teacher on `builtin:sums` (issue 36): does GRPO raise the held-out objective above the start
model and above SFT continued for as many steps? Sized for one H100/H200 in ≤ 8 minutes of compute.

Runs on a box with only torch, transformers and accelerate (plus the small wheels of docs/evaluation.md, "GPU
pilot"): no TRL (its `datasets` needs pyarrow, too large to ship), so the GRPO update is written here, ~30 lines,
on top of rlt's own reward (rlt.method.reward), sampler (rlt.method.generation) and prompts — the same code the rl
stage uses for everything but the optimizer step. The update is TRL's with β = 0, one iteration per generation
round (the importance ratio is 1) and DAPO token normalisation; fp32 master weights, bf16 autocast on CUDA.

The parent trains the short SFT warm-up (the start model), measures it, then starts one process per seed on the same
GPU. Each seed: GRPO (`--steps` × `--questions` × G) and SFT continued on the very questions GRPO drew, the same
number of optimizer steps; each arm's held-out measurement (`--heldout` questions × K at τ 1.0 and 0.7, the same
sampling seed for every teacher) is written to <out>/seed<S>/<arm>.json as soon as the arm finishes. Past
`--minutes` nothing new starts and the parent stops what still runs; `pilot.json` reports what finished.

  python benchmarks/gpu_pilot.py --out results/pilot                 # the pilot (GPU): 4 seeds × 40 steps × 8 × G 16
  python benchmarks/gpu_pilot.py --rehearsal --out /tmp/pilot         # CPU, tiny model, cut sizes, short deadline
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

PILOT = dict(
    seeds=4, steps=40, questions=8, generations=16, lr=1e-5, temperature=1.0, cap=64, heldout=128, k=4, minutes=8.0
)
PILOT.update(sft_steps=8, sft_lr=1e-4, train_size=512)
REHEARSAL = dict(seeds=2, steps=2, questions=2, generations=4, heldout=4, k=4, minutes=6.0, sft_steps=2, cap=16)
MICRO = 32  # rows per forward/backward of the update
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


def grpo_step(model, opt, tok, fmt, reward, rows: list[dict], g: int, tau: float, cap: int, dev: str) -> dict:
    """One GRPO update: G samples per question, the RLT reward, group-standardised advantages, the token-level
    policy-gradient loss (TRL's with β 0 and one iteration: ratio 1, DAPO normalisation)."""
    import torch

    from rlt.method.generation import sample_with_logprobs

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
    r = torch.tensor(br.total, device=dev).view(len(rows), g)
    adv = ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-4)).view(-1)
    n_tokens = max(1, sum(len(c) for c in s.completion_ids))
    opt.zero_grad(set_to_none=True)
    for a in range(0, len(prompt_ids), MICRO):  # micro-batches: full-vocabulary log-probs of 128 rows are GBs
        b = a + MICRO
        lp, mask = completion_logprobs(model, prompt_ids[a:b], s.completion_ids[a:b], dev, tau)
        loss = -(adv[a:b, None] * lp * mask).sum() / n_tokens
        loss.backward()
    gn = float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))
    opt.step()
    ent = -statistics.fmean(x for seq in s.logprobs for x in seq) if any(s.logprobs) else float("nan")
    return {
        "reward": float(r.mean()),
        "reward_std": float(r.std()),
        "zero_std_groups": float((r.std(1) == 0).float().mean()),
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


def measure(model, tok, fmt, student, s_tok, rows: list[dict], k: int, cap: int) -> dict:
    """The objective (mean RLT reward) per held-out question at each τ of TAUS, K samples, common random numbers;
    with r_SS's solution log-prob (the teaching measure, exploratory) and r_KL's two parts."""
    from rlt.method.reward import RLTReward

    model.eval()
    out = {}
    for tau in TAUS:
        texts, ids, lps = protocol.sample_explanations(model, tok, fmt, rows, k, cap, seed=EVAL_SEED, temperature=tau)
        reward = RLTReward(student, s_tok, fmt, temperature=tau, batch_size=64)
        flat = [r for r in rows for _ in range(k)]
        br = reward.score(
            [r["question"] for r in flat],
            [r["solution"] for r in flat],
            [t for ts in texts for t in ts],
            [x for xs in lps for x in xs],
            [x for xs in ids for x in xs],
        )

        def per_q(xs: list[float]) -> list[float]:
            return [statistics.fmean(xs[i * k : (i + 1) * k]) for i in range(len(rows))]

        out[f"tau{tau:g}"] = {
            "reward": per_q(br.total),
            "solution_logprob": per_q(br.solution_logprob_mean),
            "kl_teacher_logprob": per_q(br.kl_teacher_logprob),
            "kl_student_ce": per_q(br.kl_student_ce),
            "example": texts[0][0],
        }
    return out


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


def weight_change(model, start_path: str) -> float:
    """Relative L2 distance of the trained weights from the start model's."""
    from safetensors.torch import load_file

    ref = {}
    for f in Path(start_path).glob("*.safetensors"):
        ref.update(load_file(f))
    num = den = 0.0
    for name, p in model.named_parameters():
        if name in ref:
            num += float((p.detach().float().cpu() - ref[name].float()).pow(2).sum())
            den += float(ref[name].float().pow(2).sum())
    return math.sqrt(num / den) if den else float("nan")


def worker(args, sz: dict, out: Path, seed: int, deadline: float) -> None:
    """One seed: GRPO, then SFT continued on the questions GRPO drew; each arm measured and written at once."""
    import random

    import torch

    dev = device()
    fmt = formatter()
    train, heldout = data(sz)
    start = str(out / "start")
    student, s_tok = load(args.model, dev, trainable=False)
    s_tok.padding_side = "right"
    from rlt.method.reward import RLTReward

    reward = RLTReward(student, s_tok, fmt, temperature=sz["temperature"], batch_size=64)
    rng = random.Random(seed)
    draws = [rng.sample(range(len(train)), sz["questions"]) for _ in range(sz["steps"])]
    d = out / f"seed{seed}"
    d.mkdir(parents=True, exist_ok=True)
    for arm in ("rl", "sft"):
        t0 = time.time()
        torch.manual_seed(seed)
        model, tok = load(start, dev, trainable=True)
        opt = torch.optim.AdamW(model.parameters(), lr=sz["lr"])
        steps = []
        for draw in draws:
            if time.time() > deadline:
                break
            rows = [train[i] for i in draw]
            if arm == "rl":
                m = grpo_step(model, opt, tok, fmt, reward, rows, sz["generations"], sz["temperature"], sz["cap"], dev)
            else:
                m = sft_step(model, opt, tok, fmt, rows, dev)
            steps.append(m)
            with (d / f"{arm}_steps.jsonl").open("a") as f:
                f.write(json.dumps({"step": len(steps), **m}) + "\n")
        result = {
            "arm": arm,
            "seed": seed,
            "steps_done": len(steps),
            "weight_change": weight_change(model, start),
            "train_seconds": round(time.time() - t0, 1),
            "measures": measure(model, tok, fmt, student, s_tok, heldout, sz["k"], sz["cap"]),
            "seconds": round(time.time() - t0, 1),
        }
        (d / f"{arm}.json").write_text(json.dumps(result))
        print(f"[seed {seed}] {arm}: {len(steps)} steps, {result['seconds']:.0f} s", flush=True)
        del model, opt
        if dev == "cuda":
            torch.cuda.empty_cache()


def report(sz: dict, out: Path, started: float) -> dict:
    start = json.loads((out / "start.json").read_text())
    arms: dict[str, dict[int, dict]] = {"rl": {}, "sft": {}}
    for arm, by_seed in arms.items():
        for f in sorted(out.glob(f"seed*/{arm}.json")):
            r = json.loads(f.read_text())
            by_seed[r["seed"]] = r
    res: dict = {
        "sizes": sz,
        "seconds": round(time.time() - started, 1),
        "seeds": {a: sorted(v) for a, v in arms.items()},
    }
    lines = []
    for tau in TAUS:
        key = f"tau{tau:g}"
        s0 = statistics.fmean(start["measures"][key]["reward"])
        rl = {s: statistics.fmean(r["measures"][key]["reward"]) for s, r in arms["rl"].items()}
        sft = {s: statistics.fmean(r["measures"][key]["reward"]) for s, r in arms["sft"].items()}
        row: dict = {"start": s0, "rl": rl, "sft": sft}
        if len(rl) >= 2:
            row["rl_vs_start"] = protocol.one_sample_interval(list(rl.values()), s0)
        both = sorted(set(rl) & set(sft))
        if len(both) >= 2:  # paired per seed: the SFT arm saw the very questions its seed's GRPO drew
            row["rl_vs_sft"] = protocol.one_sample_interval([rl[s] - sft[s] for s in both])
            sd = statistics.stdev([rl[s] - sft[s] for s in both])
            row["power"] = [
                f"paired seed-level sd {sd:.3f}: {protocol.seeds_needed(sd, e, two_arms=False)} seeds for 80 % power "
                f"at a difference of {e:g}"
                for e in (0.1, 0.25, 0.5)
            ]
        res[key] = row
        lines.append(f"τ {tau:g}: start {s0:+.3f}; RL per seed " + ", ".join(f"{s}: {v:+.3f}" for s, v in rl.items()))
        lines.append("       SFT continued per seed " + ", ".join(f"{s}: {v:+.3f}" for s, v in sft.items()))
        for k in ("rl_vs_start", "rl_vs_sft"):
            if k in row:
                dd, lo, hi = row[k]
                lines.append(f"       {k}: {dd:+.3f} [{lo:+.3f}, {hi:+.3f}] (95 % t over seeds)")
        lines += ["       " + p for p in row.get("power", [])]
    obj = res["tau1"]
    ent = {}
    for s in arms["rl"]:
        rows = [json.loads(x) for x in (out / f"seed{s}" / "rl_steps.jsonl").read_text().splitlines()]
        ent[s] = (rows[0]["entropy"], rows[-1]["entropy"])
    res["gates"] = {
        "objective_above_start": "rl_vs_start" in obj and obj["rl_vs_start"][1] > 0,
        "objective_above_sft": "rl_vs_sft" in obj and obj["rl_vs_sft"][1] > 0,
        "weights_changed": bool(arms["rl"]) and all(r["weight_change"] > 0 for r in arms["rl"].values()),
        # collapse: the last step's entropy under a tenth of the first's
        "no_entropy_collapse": bool(ent) and all(last >= 0.1 * first for first, last in ent.values()),
    }
    res["entropy_first_last"] = ent
    res["weight_change"] = {s: r["weight_change"] for s, r in arms["rl"].items()}
    (out / "pilot.json").write_text(json.dumps(res, indent=1))
    print("\n".join(lines))
    print("gates: " + ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in res["gates"].items()))
    print(f"wall {res['seconds']:.0f} s; {out / 'pilot.json'}")
    return res


def main(argv: list[str] | None = None) -> dict | None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="builtin:smollm2-135m-instruct", help="teacher start and frozen student")
    p.add_argument("--out", default="results/pilot")
    p.add_argument("--rehearsal", action="store_true", help="CPU sizes with a tiny model and a short deadline")
    p.add_argument("--minutes", type=float, help="hard deadline of the whole pilot (default 8; rehearsal 6)")
    p.add_argument(
        "--convert-only", action="store_true", help="materialise --model (the SmolLM2 GGUF conversion), exit"
    )
    p.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    p.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    sz = PILOT | (REHEARSAL if args.rehearsal else {})
    if args.rehearsal and args.model == p.get_default("model"):
        args.model = "builtin:tiny-qwen2"
    if args.minutes:
        sz["minutes"] = args.minutes
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from transformers.utils import logging as hf_logging  # not rlt's quiet_libraries: it imports `datasets`

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    if args.convert_only:
        from rlt.data.models import resolve_model_path

        print(f"[pilot] {args.model} -> {resolve_model_path(args.model)}", flush=True)
        return None
    if args.worker is not None:
        worker(args, sz, out, args.worker, args.deadline)
        return None
    started = time.time()
    deadline = started + 60 * sz["minutes"]
    dev = device()
    print(f"[pilot] {dev}; sizes {sz}", flush=True)
    start = warm_up(args, sz, out, dev)
    # the seeds start before the start model is measured: they are the long part
    reserve = 0.25 * (deadline - time.time())  # each seed stops training with a quarter of the time left to measure
    base = [sys.executable, "-u", __file__, "--out", str(out), "--model", args.model]
    base += ["--rehearsal"] if args.rehearsal else []
    procs = [
        subprocess.Popen([*base, "--worker", str(s), "--deadline", str(deadline - reserve)])
        for s in range(1, sz["seeds"] + 1)
    ]
    model, tok = load(start, dev, trainable=False)
    student, s_tok = load(args.model, dev, trainable=False)
    s_tok.padding_side = "right"
    _, heldout = data(sz)
    m = measure(model, tok, formatter(), student, s_tok, heldout, sz["k"], sz["cap"])
    (out / "start.json").write_text(json.dumps({"measures": m}))
    del model, student
    for proc in procs:
        try:
            proc.wait(timeout=max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            proc.kill()
            print(f"[deadline] a seed process was stopped at {sz['minutes']} min", flush=True)
    return report(sz, out, started)


if __name__ == "__main__":
    main()
