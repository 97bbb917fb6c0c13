"""Reward scoring: rlt's batched RLTReward against a one-at-a-time, full-vocabulary reference.

The reference scores like the research code (one sequence at a time, a full student forward and a full teacher
forward, full-vocabulary fp32 log-softmax over every position) minus its per-sample gc.collect(). rlt's reward
takes the teacher log-probs from generation (so no teacher forward), runs the shared prefix of a question's
completions once and the LM head only on scored rows.

Prints one JSON object: per model and workload, the max |difference| of every component, tokens/s (student-chat
tokens of the workload per second, the same numerator for both), the ratio,
peak memory above the loaded weights (each variant in its own process), and achieved FLOP/s as a fraction of
this machine's fp32 matmul peak measured here.

    python benchmarks/reward_scoring.py                       # tiny49k and SmolLM2-135M, grouped and distinct
    python benchmarks/reward_scoring.py --models tiny49k --n 32
    python benchmarks/reward_scoring.py --models "" --long-tokens 16384   # only the long-completion workload

The workload's explanations mix in unicode (math symbols, LaTeX, CJK, emoji, combining marks) that byte-level BPE
splits over several tokens. The long-completion workload scores one 16k-token completion through the generation
path and prints the share of its scoring time spent locating the generated tokens and pairing them (target ≤ 2 %),
next to the old prefix-decoding offsets timed on its first 2k tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TAU = 0.7
WORDS = [
    "first",
    "consider",
    "the",
    "numbers",
    "then",
    "combine",
    "them",
    "carefully",
    "check",
    "the",
    "intermediate",
    "value",
    "and",
    "keep",
    "the",
    "sum",
    "multiply",
    "subtract",
    "compare",
    "because",
    "therefore",
    "so",
    "we",
    "get",
    "which",
    "means",
    "next",
    "step",
    "result",
    "target",
]
# Text real reasoning data is full of, and that byte-level BPE splits over several tokens (see docs/reward.md).
UNICODE_WORDS = (
    "x ≤ y",
    "y ≥ 0",
    "√2 ≈ 1.414",
    "a ≠ b",
    "∑ᵢ aᵢ",
    "∫₀¹ f(x) dx",
    "→ ∞",
    "$\\frac{a}{b}$",
    "\\(\\alpha + \\beta\\)",
    "计算结果",
    "日本語",
    "😀",
    "🎉👍🏽",
    "café",
    "e\u0301",
    "  \n\n\t",
)


def rss_mb() -> float:
    with Path("/proc/self/status").open() as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def reset_peak() -> None:
    """Reset the kernel's peak-RSS mark (VmHWM) so the next reading covers only the timed section."""
    with Path("/proc/self/clear_refs").open("w") as f:
        f.write("5")


def peak_mb() -> float:
    with Path("/proc/self/status").open() as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def build_tiny49k(path: Path) -> None:
    """Tiny Qwen2 with a realistic 49,152-token vocabulary: the SmolLM2 tokenizer, 2 small layers."""
    from transformers import AutoTokenizer

    from rlt.data.models import resolve_model_path, tiny_qwen2

    tok = AutoTokenizer.from_pretrained(resolve_model_path("builtin:smollm2-135m-instruct"))
    tiny_qwen2(len(tok), 2048).save_pretrained(path)
    tok.save_pretrained(path)


def model_path(name: str) -> str:
    from rlt.data.models import cache_root, resolve_model_path

    if name == "smollm2":
        return resolve_model_path("builtin:smollm2-135m-instruct")
    path = cache_root() / "models" / "bench-tiny49k-v1"
    if not (path / "config.json").exists():
        build_tiny49k(path)
    return str(path)


def workload(tok, n: int, grouped: bool, seed: int = 0):
    """n completions with explanations of 100–300 tokens; grouped = all for one question (a GRPO group)."""
    from rlt.data import tasks

    rng = random.Random(seed)
    problems = tasks.generate("mixed", n, seed=seed)
    qs, ss, cs = [], [], []
    for i in range(n):
        p = problems[0] if grouped else problems[i]
        target = rng.randint(100, 300)
        words = p["reasoning_trace"].split()
        while len(tok(" ".join(words), add_special_tokens=False).input_ids) < target:
            words += rng.sample(WORDS, 5) + rng.sample(UNICODE_WORDS, 1)
        text = " ".join(words)
        ids = tok(text, add_special_tokens=False).input_ids[:target]
        qs.append(p["question"])
        ss.append(p["solution"])
        cs.append(tok.decode(ids).rstrip("\ufffd") + "</explain>")  # never cut a character in half
    return qs, ss, cs


def long_completion(tok, tokens: int, seed: int = 0) -> str:
    """One explanation of `tokens` tokens, a sixth of its words unicode (the paper's 16k-token completions)."""
    rng = random.Random(seed)
    words: list[str] = []
    while len(words) < tokens:
        words += rng.sample(WORDS, 5) + rng.sample(UNICODE_WORDS, 1)
    ids = tok(" ".join(words), add_special_tokens=False).input_ids[:tokens]
    return tok.decode(ids).rstrip("\ufffd") + "</explain>"


def reference_scores(model, tok, fmt, qs, ss, cs):
    """One at a time, full forward, full-vocabulary fp32 log-softmax: the research code's way (without gc)."""
    import torch

    from rlt.method.pairing import SideTokens, pair_explanation
    from rlt.method.reward import RewardBreakdown

    def token_lps(text, spans):
        enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
        ids = torch.tensor([enc["input_ids"]])
        with torch.no_grad():
            lp = torch.log_softmax(model(ids).logits[0].float() / TAU, dim=-1)
        out = []
        for start, end in spans:
            pos = [t for t, (s, e) in enumerate(enc["offset_mapping"]) if t > 0 and e > s >= start and e <= end]
            out.append(
                SideTokens(
                    [(enc["offset_mapping"][t][0] - start, enc["offset_mapping"][t][1] - start) for t in pos],
                    [enc["input_ids"][t] for t in pos],
                    [lp[t - 1, ids[0, t]].item() for t in pos],
                )
            )
        return out, ids.shape[1]

    res, tokens = RewardBreakdown(), 0
    for q, s, c in zip(qs, ss, cs, strict=True):
        e, closed = fmt.split_explanation(c)
        chat, e_span, s_span = fmt.student_chat(tok, q, e, s)
        (stud_e, stud_s), n1 = token_lps(chat, [(e_span.start, e_span.end), (s_span.start, s_span.end)])
        sol = list(stud_s.logprobs)
        prompt = fmt.teacher_prompt(tok, q, s)
        (teach,), n2 = token_lps(prompt + c, [(len(prompt), len(prompt) + len(e))])
        tokens += n1 + n2
        d = pair_explanation(teach, stud_e, same_vocab=True).deltas  # the documented pairing (docs/reward.md)
        r_ss = sum(sol) / len(sol) + 0.01 * min(sol)
        r_kl = sum(d) / len(d) + 0.01 * max(d)
        pen = 0.0 if closed else 1.0
        for k, v in (
            ("total", r_ss - 3 * r_kl - pen),
            ("r_ss", r_ss),
            ("r_kl", r_kl),
            ("format_penalty", pen),
            ("solution_logprob_mean", sum(sol) / len(sol)),
            ("solution_logprob_min", min(sol)),
            ("kl_mean", sum(d) / len(d)),
            ("kl_max", max(d)),
        ):
            getattr(res, k).append(v)
    return res, tokens


def teacher_logprobs(model, tok, fmt, qs, ss, cs):
    """What generation hands the reward: per completion token, its tempered log-prob (not timed)."""
    import torch

    ids_all, lps_all = [], []
    for q, s, c in zip(qs, ss, cs, strict=True):
        p_ids = tok(fmt.teacher_prompt(tok, q, s), add_special_tokens=False).input_ids
        c_ids = tok(c, add_special_tokens=False).input_ids
        with torch.no_grad():
            lp = torch.log_softmax(model(torch.tensor([p_ids + c_ids])).logits[0].float() / TAU, -1)
        ids_all.append(c_ids)
        lps_all.append([lp[len(p_ids) - 1 + i, t].item() for i, t in enumerate(c_ids)])
    return ids_all, lps_all


def prefix_decode_offsets(tokenizer, ids):
    """The offsets method this project used before: decode every growing prefix (quadratic), for comparison."""
    lengths = [len(tokenizer.decode(list(ids[: k + 1]), skip_special_tokens=True)) for k in range(len(ids))]
    return list(zip([0] + lengths[:-1], lengths, strict=False))


def run_long(args, model, tok, fmt) -> dict:
    """One completion of `args.long_tokens` tokens through the generation path: what share of its scoring time goes to
    locating the generated tokens in the text and pairing them with the student's (docs/reward.md)."""
    import torch

    from rlt.data import tasks
    from rlt.method.reward import RLTReward
    from rlt.method.scoring import completion_token_offsets

    p = tasks.generate("mixed", 1, seed=1)[0]
    c = long_completion(tok, args.long_tokens)
    prompt_ids = tok(fmt.teacher_prompt(tok, p["question"], p["solution"]), add_special_tokens=False).input_ids
    ids = tok(c, add_special_tokens=False).input_ids
    with torch.no_grad():  # generation's log-probs (not timed), with the LM head in chunks
        hidden = model.model(torch.tensor([prompt_ids + ids])).last_hidden_state[0, len(prompt_ids) - 1 : -1]
        head = model.get_output_embeddings()
        lps = torch.cat(
            [
                torch.log_softmax(head(hidden[i : i + 1024]).float() / TAU, -1)
                .gather(1, torch.tensor(ids[i : i + 1024])[:, None])
                .squeeze(1)
                for i in range(0, len(ids), 1024)
            ]
        )
    reward = RLTReward(model, tok, fmt, temperature=TAU, batch_size=1)
    t0 = time.perf_counter()
    res = reward.score([p["question"]], [p["solution"]], [c], [lps.tolist()], [ids])
    seconds = time.perf_counter() - t0
    t0 = time.perf_counter()
    completion_token_offsets(tok, ids)
    offsets_seconds = time.perf_counter() - t0
    head_ids = ids[: args.quadratic_tokens]
    t0 = time.perf_counter()
    prefix_decode_offsets(tok, head_ids)
    quadratic = time.perf_counter() - t0
    return {
        "completion_tokens": len(ids),
        "explanation_tokens": res.explanation_tokens[0],
        "scoring_seconds": seconds,
        "offsets_and_pairing_seconds": reward.last_pairing_seconds,
        "offsets_alone_seconds": offsets_seconds,
        "pairing_coverage": res.pairing_coverage[0],
        "quadratic_offsets_tokens": len(head_ids),
        "quadratic_offsets_seconds": quadratic,
    }


def matmul_peak_gflops(seconds: float = 3.0) -> float:
    """Best fp32 GEMM rate over shapes like the scorer's (rows × 576 @ 576 × 1536)."""
    import torch

    best = 0.0
    for m, k, n in ((3072, 576, 1536), (2048, 1536, 576), (4096, 1024, 1024)):
        a, b = torch.randn(m, k), torch.randn(k, n)
        for _ in range(3):
            a @ b
        t0, reps = time.perf_counter(), 0
        while time.perf_counter() - t0 < seconds / 3:
            a @ b
            reps += 1
        best = max(best, 2 * m * k * n * reps / (time.perf_counter() - t0) / 1e9)
    return best


def run_variant(args) -> dict:
    """Child process: load, build the workload, time one variant, report."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlt.method.prompts import Formatter, resolve_format
    from rlt.method.reward import RewardBreakdown, RLTReward
    from rlt.spec.inputs import FormatSpec

    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", os.cpu_count() or 1)))
    path = model_path(args.model)
    tok = AutoTokenizer.from_pretrained(path)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token if tok.unk_token is None else tok.unk_token
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    for p in model.parameters():  # fault the mmapped weights in so the baseline RSS includes them
        p.data.add_(0)
    fmt = Formatter(resolve_format(FormatSpec()))
    if args.variant == "long":
        return run_long(args, model, tok, fmt)
    qs, ss, cs = workload(tok, args.n, args.grouped)
    chat_tokens = sum(
        len(tok(fmt.student_chat(tok, q, fmt.split_explanation(c)[0], s)[0], add_special_tokens=False).input_ids)
        for q, s, c in zip(qs, ss, cs, strict=True)
    )
    if args.variant == "teacher":  # generation's log-probs, made in their own process so they cost the scorer nothing
        ids, lps = teacher_logprobs(model, tok, fmt, qs, ss, cs)
        return {"ids": ids, "lps": lps}
    if args.variant == "reference":
        reference_scores(model, tok, fmt, qs[:2], ss[:2], cs[:2])  # warm-up
        base = rss_mb()
        reset_peak()
        t0 = time.perf_counter()
        res, tokens = reference_scores(model, tok, fmt, qs, ss, cs)
        seconds = time.perf_counter() - t0
        forward_tokens, head_rows = tokens, tokens
    else:
        given = json.loads(Path(args.teacher_file).read_text())
        ids, lps = given["ids"], given["lps"]
        reward = RLTReward(model, tok, fmt, temperature=TAU, batch_size=args.batch_size)
        reward.score(qs[:2], ss[:2], cs[:2], lps[:2], ids[:2])  # warm-up
        reward.student.stats.__init__()
        base = rss_mb()
        reset_peak()
        t0 = time.perf_counter()
        res = reward.score(qs, ss, cs, lps, ids)
        seconds = time.perf_counter() - t0
        forward_tokens, head_rows = reward.student.stats.forward_tokens, reward.student.stats.scored_tokens
    n_params = sum(p.numel() for p in model.parameters())
    emb = model.get_input_embeddings().weight.numel()
    flops = 2 * (n_params - emb) * forward_tokens + 2 * emb * head_rows  # body on every position, head on scored rows
    return {
        "seconds": seconds,
        "chat_tokens": chat_tokens,
        "forward_tokens": forward_tokens,
        "head_rows": head_rows,
        "flops": flops,
        "naive_flops": 2 * n_params * forward_tokens,
        "peak_over_loaded_mb": peak_mb() - base,
        "scores": {k: getattr(res, k) for k in ("total", *RewardBreakdown.COMPONENTS)},
    }


def child(model: str, variant: str, grouped: bool, n: int, batch_size: int, teacher_file: str = "", extra=()) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        cmd = [
            sys.executable,
            __file__,
            "--child",
            variant,
            "--models",
            model,
            "--n",
            str(n),
            "--batch-size",
            str(batch_size),
            "--out",
            f.name,
            "--teacher-file",
            teacher_file,
            *extra,
        ] + (["--grouped"] if grouped else [])
        subprocess.run(cmd, check=True)
        return json.loads(Path(f.name).read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="tiny49k,smollm2")
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=2)
    ap.add_argument("--workloads", default="grouped,distinct")
    ap.add_argument("--child", choices=["reference", "teacher", "batched", "long"])
    ap.add_argument("--long-tokens", type=int, default=16384, help="length of the long-completion workload (0: skip)")
    ap.add_argument(
        "--long-model",
        default="tiny49k",
        help="model of the long workload (the cheapest model gives the largest offsets/pairing share)",
    )
    ap.add_argument(
        "--quadratic-tokens",
        type=int,
        default=2048,
        help="tokens on which the old prefix-decoding offsets are timed for comparison",
    )
    ap.add_argument("--teacher-file", default="")
    ap.add_argument("--grouped", action="store_true")
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.child:
        args.variant, args.model = args.child, args.models
        Path(args.out).write_text(json.dumps(run_variant(args)))
        return

    peak = matmul_peak_gflops()
    report = {
        "machine": {"cpus": os.cpu_count(), "fp32_matmul_peak_gflops": round(peak, 1)},
        "n": args.n,
        "batch_size": args.batch_size,
        "results": [],
    }
    for model in filter(None, args.models.split(",")):
        for wl in args.workloads.split(","):
            grouped = wl == "grouped"
            ref = child(model, "reference", grouped, args.n, args.batch_size)
            with tempfile.NamedTemporaryFile("w", suffix=".json") as tf:
                json.dump(child(model, "teacher", grouped, args.n, args.batch_size), tf)
                tf.flush()
                new = child(model, "batched", grouped, args.n, args.batch_size, tf.name)
            diffs = {
                k: max(abs(a - b) for a, b in zip(ref["scores"][k], new["scores"][k], strict=True))
                for k in ref["scores"]
            }
            entry = {
                "model": model,
                "workload": wl,
                "max_abs_diff": {k: float(f"{v:.3g}") for k, v in diffs.items()},
                "equal_within_1e-4": all(v <= 1e-4 for v in diffs.values()),
                "reference": {
                    "seconds": round(ref["seconds"], 2),
                    "tokens_per_s": round(ref["chat_tokens"] / ref["seconds"], 1),
                    "peak_mem_mb": round(ref["peak_over_loaded_mb"], 1),
                    "gflops": round(ref["flops"] / ref["seconds"] / 1e9, 1),
                },
                "batched": {
                    "seconds": round(new["seconds"], 2),
                    "tokens_per_s": round(new["chat_tokens"] / new["seconds"], 1),
                    "peak_mem_mb": round(new["peak_over_loaded_mb"], 1),
                    "gflops": round(new["flops"] / new["seconds"] / 1e9, 1),
                },
                "speedup": round(ref["seconds"] / new["seconds"], 2),
                "batched_fraction_of_matmul_peak": round(new["flops"] / new["seconds"] / 1e9 / peak, 3),
                "completions_per_s": {
                    "reference": round(args.n / ref["seconds"], 2),
                    "batched": round(args.n / new["seconds"], 2),
                },
            }
            report["results"].append(entry)
            print(json.dumps(entry), file=sys.stderr, flush=True)
    if args.long_tokens:
        long = child(
            args.long_model,
            "long",
            False,
            1,
            1,
            extra=["--long-tokens", str(args.long_tokens), "--quadratic-tokens", str(args.quadratic_tokens)],
        )
        long["model"] = args.long_model
        long["offsets_and_pairing_share_of_scoring"] = round(
            long["offsets_and_pairing_seconds"] / long["scoring_seconds"], 4
        )
        long["within_2_percent"] = long["offsets_and_pairing_share_of_scoring"] <= 0.02
        report["long_completion"] = long
        print(json.dumps(long), file=sys.stderr, flush=True)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
