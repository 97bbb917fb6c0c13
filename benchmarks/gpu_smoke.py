"""GPU smoke benchmark: reward scoring and one GRPO step at realistic shapes, random weights (nothing downloaded).

Models: Qwen2 shapes of 0.5B and 1.5B (Qwen2.5-0.5B/1.5B configs), random-initialised in bf16 on the GPU, with the
tiny built-in byte-level tokenizer (token ids stay far below the 151,936-row vocabulary; throughput is what counts).

1. Reward scoring (the RLT reward's student pass): rlt's batched RLTReward against a one-at-a-time reference (full
   forward, full-vocabulary fp32 log-softmax per sequence, as the research code scores), same workload. Prints
   tokens/s, the ratio (target ≥ 10×), achieved TFLOP/s and its share of this GPU's bf16 dense GEMM peak measured in
   the same run (target ≥ 40 %).
2. One GRPO step of the recipe (`rlt run --stage rl`, in-process generation) per model, its time split into
   generate / score / update from metrics.jsonl.

Prints one JSON object. Usage: benchmarks/gpu_smoke.sh (sets up the environment) or
    python benchmarks/gpu_smoke.py --models 0.5b,1.5b --n 64
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SHAPES = {  # Qwen2.5 configs (hidden, intermediate, layers, heads, kv heads); vocab 151,936, tied embeddings at 0.5B/1.5B
    "0.5b": dict(
        hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2
    ),
    "1.5b": dict(
        hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2
    ),
}
TAU = 0.7


def build(name: str, out: Path) -> Path:
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from rlt.data.models import resolve_model_path

    tok = AutoTokenizer.from_pretrained(resolve_model_path("builtin:tiny-qwen2"))
    cfg = Qwen2Config(
        vocab_size=151936,
        max_position_embeddings=32768,
        tie_word_embeddings=True,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        bos_token_id=None,
        torch_dtype="bfloat16",
        **SHAPES[name],
    )
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = Qwen2ForCausalLM(cfg).to(torch.bfloat16)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def bf16_peak_tflops(seconds: float = 3.0) -> float:
    import torch

    best = 0.0
    for n in (4096, 8192):
        a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        for _ in range(5):
            a @ b
        torch.cuda.synchronize()
        t0, reps = time.perf_counter(), 0
        while time.perf_counter() - t0 < seconds / 2:
            a @ b
            reps += 1
        torch.cuda.synchronize()
        best = max(best, 2 * n**3 * reps / (time.perf_counter() - t0) / 1e12)
    return best


def reward_bench(path: Path, n: int, batch_size: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlt.method.prompts import Formatter, resolve_format
    from rlt.method.reward import RLTReward
    from rlt.spec.inputs import FormatSpec

    sys.path.insert(0, str(Path(__file__).parent))
    from reward_scoring import workload  # the CPU benchmark's workload: explanations of 100-300 tokens

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).to("cuda").eval().requires_grad_(False)
    fmt = Formatter(resolve_format(FormatSpec()))
    out = {}
    for grouped in (True, False):
        qs, ss, cs = workload(tok, n, grouped)
        ids = [tok(c, add_special_tokens=False).input_ids for c in cs]
        lps = [[-1.0] * len(i) for i in ids]  # generation hands these over; their values do not change the cost
        reward = RLTReward(model, tok, fmt, temperature=TAU, batch_size=batch_size)
        reward.score(qs[:4], ss[:4], cs[:4], lps[:4], ids[:4])  # warm-up
        reward.student.stats.__init__()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        reward.score(qs, ss, cs, lps, ids)
        torch.cuda.synchronize()
        fast = time.perf_counter() - t0
        st = reward.student.stats
        n_params = sum(p.numel() for p in model.parameters())
        emb = model.get_input_embeddings().weight.numel()
        flops = 2 * (n_params - emb) * st.forward_tokens + 2 * emb * st.scored_tokens
        chats = [
            fmt.student_chat(tok, q, fmt.split_explanation(c)[0], s)[0] for q, s, c in zip(qs, ss, cs, strict=True)
        ]
        chat_tokens = sum(len(tok(c, add_special_tokens=False).input_ids) for c in chats)
        # Reference: one sequence at a time, full forward, full-vocabulary fp32 log-softmax.
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.no_grad():
            for chat in chats:
                x = torch.tensor([tok(chat, add_special_tokens=False).input_ids], device="cuda")
                torch.log_softmax(model(x).logits[0].float() / TAU, dim=-1)
        torch.cuda.synchronize()
        ref = time.perf_counter() - t0
        out["grouped" if grouped else "distinct"] = {
            "rlt_tokens_per_s": chat_tokens / fast,
            "reference_tokens_per_s": chat_tokens / ref,
            "speedup_vs_reference": ref / fast,
            "achieved_tflops": flops / fast / 1e12,
            "seconds": fast,
        }
    return out


def grpo_step(path: Path, workdir: Path) -> dict:
    import yaml

    from rlt.contract.api import GROUP_VERSION, KIND

    run = {
        "apiVersion": GROUP_VERSION,
        "kind": KIND,
        "metadata": {"name": "gpu-smoke"},
        "spec": {
            "teacher": {"model": str(path), "dtype": "bfloat16"},
            "student": {"model": str(path), "dtype": "bfloat16"},
            "dataset": {"source": "builtin:arithmetic", "size": 64},
            "resources": {"trainer": {"gpus": 1}},  # one process
            "stages": {
                "sft": {"enabled": False},
                "distill": {"enabled": False},
                "rl": {
                    "steps": 1,
                    "batchSize": 16,
                    "perDeviceBatchSize": 16,
                    "numGenerations": 8,
                    "maxCompletionLength": 512,
                    "maxPromptLength": 512,
                    "saveSteps": 100,
                    "gradientCheckpointing": True,
                },
            },
        },
    }
    spec_file = workdir / "run.yaml"
    spec_file.write_text(yaml.safe_dump(run))
    t0 = time.perf_counter()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "rlt.cli",
            "run",
            str(spec_file),
            "--output-dir",
            str(workdir / "out"),
            "--metrics-port",
            "-1",
            "--device",
            "cuda",
            "--no-progress",
        ],
        check=True,
    )
    rows = [json.loads(line) for line in (workdir / "out" / "gpu-smoke" / "metrics.jsonl").read_text().splitlines()]
    step = [r for r in rows if r["stage"] == "rl"][-1]
    return {
        "wall_seconds": time.perf_counter() - t0,
        **{k: step[k] for k in step if k.startswith("seconds_")},
        "step_seconds": step.get("step_seconds"),
        "generated_tokens": step.get("generated_tokens"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="0.5b,1.5b")
    ap.add_argument("--n", type=int, default=64, help="completions scored per workload")
    ap.add_argument("--batch-size", type=int, default=32, help="reward micro-batch on the GPU")
    ap.add_argument("--skip-grpo", action="store_true")
    args = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("gpu_smoke: no CUDA device")
    report: dict = {"device": torch.cuda.get_device_name(0), "bf16_peak_tflops_measured": bf16_peak_tflops()}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            path = build(name, Path(tmp) / name)
            res = {"reward": reward_bench(path, args.n, args.batch_size)}
            for w in res["reward"].values():
                w["share_of_bf16_peak"] = w["achieved_tflops"] / report["bf16_peak_tflops_measured"]
                w["meets_targets"] = w["share_of_bf16_peak"] >= 0.40 and w["speedup_vs_reference"] >= 10
            if not args.skip_grpo:
                (Path(tmp) / f"grpo-{name}").mkdir()
                res["grpo_step"] = grpo_step(path, Path(tmp) / f"grpo-{name}")
            report[name] = res
            torch.cuda.empty_cache()
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
