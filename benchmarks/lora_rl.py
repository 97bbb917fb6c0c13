"""RL of SmolLM2-135M on this CPU with and without LoRA: peak memory and step time, and the reward's numbers for the
same weights (adapter unmerged in a PeftModel vs merged into a plain model).

Each arm runs the real `rl` stage (TRL GRPOTrainer, the paper's β = 0.04, so full fine-tuning also holds a reference
copy while LoRA uses the frozen base) in its own process; peak RSS is the process's high-water mark.

    python benchmarks/lora_rl.py                 # both arms, 3 steps each, then the reward check
    python benchmarks/lora_rl.py --steps 2 --completion 32
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SMOL = "builtin:smollm2-135m-instruct"


def run_doc(name: str, steps: int, completion: int, lora: bool) -> dict:
    teacher = {"model": SMOL, **({"lora": {"r": 16, "alpha": 32, "dropout": 0.0}} if lora else {})}
    return {
        "apiVersion": "rlt.dev/v1alpha1",
        "kind": "RLTRun",
        "metadata": {"name": name},
        "spec": {
            "teacher": teacher,
            "student": {"model": SMOL},
            "dataset": {"source": "builtin:arithmetic", "size": 16},
            "resources": {"trainer": {"gpus": 1}},  # one process
            "stages": {
                "sft": {"enabled": False},
                "distill": {"enabled": False},
                "rl": {
                    "steps": steps,
                    "batchSize": 4,
                    "numGenerations": 4,
                    "perDeviceBatchSize": 4,
                    "maxCompletionLength": completion,
                    "maxPromptLength": 512,
                    "saveSteps": 1000,
                    "gradientCheckpointing": False,
                    "learningRate": 1e-5,
                },
            },
        },
    }


def one_arm(arm: str, steps: int, completion: int) -> dict:
    """Runs in a child process: the rl stage only, then its figures."""
    from rlt.run.runner import run_local
    from rlt.spec.loading import parse_run

    run = parse_run(run_doc(f"lora-bench-{arm}", steps, completion, arm == "lora"))
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        run_local(run, tmp, metrics_port=None, show_progress=False, device="cpu")
        wall = time.perf_counter() - t0
        rows = [json.loads(x) for x in (Path(tmp) / run.name / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r["stage"] == "rl"]
    later = rows[1:] or rows  # the first step also pays one-off costs
    import torch

    return {
        "arm": arm,
        "steps": len(rows),
        "wall_s": round(wall, 1),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "step_s_mean_after_first": round(statistics.mean(r["step_seconds"] for r in later), 2),
        "update_s_mean_after_first": round(statistics.mean(r["seconds_update"] for r in later), 2),
        "generate_s_mean_after_first": round(statistics.mean(r["seconds_generate"] for r in later), 2),
        "score_s_mean_after_first": round(statistics.mean(r["seconds_score"] for r in later), 2),
        "torch_threads": torch.get_num_threads(),
    }


def reward_same_weights(completion: int) -> dict:
    """The reward of the same completions with the teacher as PeftModel (adapter live) and as merged plain model."""
    import copy

    import torch
    from peft import LoraConfig, get_peft_model

    from rlt.data import tasks
    from rlt.data.models import load_model, load_tokenizer
    from rlt.method.generation import sample_with_logprobs
    from rlt.method.prompts import Formatter, resolve_format
    from rlt.method.reward import RLTReward
    from rlt.spec.inputs import FormatSpec, ModelRef

    ref = ModelRef(model=SMOL)
    tok = load_tokenizer(ref, padding_side="left")
    base = load_model(ref, "cpu")
    student = load_model(ref, "cpu")
    torch.manual_seed(0)  # a random, non-zero adapter: the check is meaningless with LoRA's zero-initialised B
    peft = get_peft_model(
        copy.deepcopy(base), LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", init_lora_weights=False)
    ).eval()
    merged = copy.deepcopy(peft).merge_and_unload().eval()
    fmt = Formatter(resolve_format(FormatSpec()))
    rows = list(tasks.generate("arithmetic", 4, seed=3))
    prompts = [
        tok(fmt.teacher_prompt(tok, r["question"], r["solution"]), add_special_tokens=False).input_ids for r in rows
    ]
    out = {}
    samples = {}
    for name, model in (("peft", peft), ("merged", merged)):
        torch.manual_seed(1)
        samples[name] = sample_with_logprobs(model, tok, prompts, temperature=0.7, top_p=1.0, max_new_tokens=completion)
    out["same_sampled_tokens"] = samples["peft"].completion_ids == samples["merged"].completion_ids
    out["max_abs_diff_sampled_logprob"] = max(
        abs(a - b)
        for x, y in zip(samples["peft"].logprobs, samples["merged"].logprobs, strict=False)
        for a, b in zip(x, y, strict=False)
    )
    texts = [tok.decode(c, skip_special_tokens=True) for c in samples["merged"].completion_ids]
    q, s = [r["question"] for r in rows], [r["solution"] for r in rows]
    scores = {}
    # teacher forward inside the reward (r_KL); get_base_model() is the model with the LoRA layers injected and live
    for name, model in (("peft", peft.get_base_model()), ("merged", merged)):
        reward = RLTReward(
            student,
            load_tokenizer(ref, padding_side="right"),
            fmt,
            temperature=0.7,
            teacher=model,
            teacher_tokenizer=tok,
        )
        scores[name] = reward.score(q, s, texts).total
    out["rewards_merged"] = [round(x, 5) for x in scores["merged"]]
    out["max_abs_diff_reward"] = max(abs(a - b) for a, b in zip(scores["peft"], scores["merged"], strict=True))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--completion", type=int, default=48)
    p.add_argument("--arm", choices=("full", "lora"), help=argparse.SUPPRESS)  # child process
    p.add_argument("--reward-only", action="store_true")
    a = p.parse_args()
    if a.arm:
        print(json.dumps(one_arm(a.arm, a.steps, a.completion)))
        return
    result = {}
    if not a.reward_only:
        for arm in ("full", "lora"):
            proc = subprocess.run(
                [sys.executable, __file__, "--arm", arm, "--steps", str(a.steps), "--completion", str(a.completion)],
                check=False,
                capture_output=True,
                text=True,
            )
            if proc.returncode:
                sys.exit(f"arm {arm} failed:\n{proc.stderr[-3000:]}")
            result[arm] = json.loads(proc.stdout.strip().splitlines()[-1])
            print(arm, json.dumps(result[arm]), file=sys.stderr, flush=True)
        full, lora = result["full"], result["lora"]
        result["ratios_lora_over_full"] = {
            k: round(lora[k] / full[k], 3)
            for k in (
                "peak_rss_mb",
                "step_s_mean_after_first",
                "update_s_mean_after_first",
                "generate_s_mean_after_first",
            )
        }
    result["reward_same_weights"] = reward_same_weights(a.completion)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
