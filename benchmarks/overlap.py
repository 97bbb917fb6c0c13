"""Generation and training overlapped one step off-policy (rlt.stages.overlap) against today's order, in one run:
the real vLLM CPU server (the generator's flags, `make vllm-venv`) on the tiny Qwen2 and a 2-rank gloo world of
CPU trainers running TRL's GRPOTrainer with rlt's one-step-off rollout.

Arm "sequential" (today): each step's rollout (every rank samples its rows from the server over HTTP), then the
scoring and the update: a step takes rollout + update. Arm "oneStepOff": step k+1's rows are sampled while step k
updates: a step should take max(rollout, update) (plus the wait when the rollout is the longer). The weights cannot
be pushed to vLLM's CPU build (TRL's weight transfer needs the GPU engine), so the server keeps the start weights in
both arms; the push is the same in both and the plan charges it. Reported per arm: the median step, rollout and
update seconds after the first step, and the one-step-off step against max(rollout, update) and against the sum.

Colocated mode (TRL's vllm_mode="colocate" with vllm_enable_sleep_mode) is probed first: vLLM's engine in this
process with sleep mode on, put to sleep and woken, as TRL does around each update; the exact error is printed when
the CPU build refuses.

    nice -n 10 python benchmarks/overlap.py                       # about 3 minutes here
    nice -n 10 python benchmarks/overlap.py --steps 4 --tokens 24  # quicker
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # suite_helpers: the vLLM command the test suite uses

COLOCATE_PROBE = """
import sys
from vllm import LLM, SamplingParams
llm = LLM(model=sys.argv[1], dtype="float32", max_model_len=256, enforce_eager=True, enable_sleep_mode=True)
llm.generate(["Hello"], SamplingParams(max_tokens=4))
llm.sleep(level=1)
llm.wake_up()
print("COLOCATE-OK")
"""


def colocate_probe(model_dir: str, python: str, timeout: float = 600) -> dict:
    """vLLM in-process with sleep mode, slept and woken (TRL colocate mode's cycle): ok, or the exact error."""
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1")
    try:
        proc = subprocess.run(
            [python, "-c", COLOCATE_PROBE, model_dir],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"no answer in {timeout:.0f} s"}
    if "COLOCATE-OK" in proc.stdout:
        return {"ok": True, "error": None}
    lines = [ln for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip() and "further information" not in ln]
    errors = [ln for ln in lines if "Error" in ln or "error" in ln or "not supported" in ln.lower()]
    return {"ok": False, "error": (errors or lines or ["exit " + str(proc.returncode)])[-1].strip()}


def reward(completions, **kw):
    return [float(len(c)) for c in completions]  # any function of the completion: non-zero advantages


def run_arm(arm: str, opts, rows: list[dict]) -> dict:
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rlt.data.models import load_model, load_tokenizer
    from rlt.spec.inputs import ModelRef
    from rlt.spec.stages import RlStage
    from rlt.stages import overlap
    from rlt.stages.record import PhaseTimer
    from rlt.stages.rl import make_rollout

    st = RlStage(temperature=1.0, top_p=1.0, max_completion_length=opts.tokens)
    ref = ModelRef(model=opts.model_dir)
    tok = load_tokenizer(ref, padding_side="left")
    args = GRPOConfig(
        output_dir=tempfile.mkdtemp(),
        per_device_train_batch_size=opts.rows,
        gradient_accumulation_steps=1,
        num_generations=opts.generations,
        max_completion_length=opts.tokens,
        max_steps=opts.steps,
        learning_rate=1e-5,
        beta=0.0,
        temperature=1.0,
        top_k=0,
        save_strategy="no",
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        bf16=False,
        seed=0,
        disable_tqdm=True,
    )
    timer, ahead_timer = PhaseTimer(), PhaseTimer()
    counters = {"generated_tokens": 0}
    served = overlap.ServedBehaviour(opts.base, st, timeout=600)
    rollout = make_rollout(tok, timer, st, counters)
    steps: list[dict] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            phases = timer.take()
            ahead = ahead_timer.take()
            steps.append(
                {
                    "step": time.perf_counter() - self.t0,
                    "waited": phases.get("generate", 0.0),
                    "rollout": ahead.get("generate", phases.get("generate", 0.0)),
                }
            )

    if arm == "oneStepOff":
        ahead = overlap.RolloutAhead(rollout, make_rollout(tok, ahead_timer, st, counters), served, timer)
        cls, func = overlap.peeking(GRPOTrainer), ahead
    else:

        def sequential(prompts, trainer):
            with overlap.sampling_with(served):
                return rollout(prompts, trainer)

        cls, func = GRPOTrainer, sequential
    from datasets import Dataset

    trainer = cls(
        model=load_model(ref, "cpu", trainable=True),
        reward_funcs=[reward],
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tok,
        rollout_func=func,
        callbacks=[Clock()],
    )
    if arm == "oneStepOff":
        trainer.rollout_ahead = ahead
        overlap.behaviour_is_old_policy(trainer)
    trainer.train()
    later = steps[1:]  # the first step: start-up, and in oneStepOff an on-policy rollout
    # the update: what the step spends besides waiting for its rollout (sequential: besides the rollout itself)
    update = [s["step"] - s["waited"] for s in later]
    return {
        "arm": arm,
        "step": statistics.median(s["step"] for s in later),
        "rollout": statistics.median(s["rollout"] for s in later),
        "update": statistics.median(update),
        "counts": getattr(func, "counts", None),
        "steps": steps,
    }


def worker(opts) -> None:
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from rlt.stages.ranks import join_process_group

    rank, world = join_process_group("cpu")
    prompts = opts.rows * world // opts.generations * opts.steps
    rows = [{"prompt": f"Question {i}: what is {i} plus {2 * i}? Explain:"} for i in range(prompts)]
    arms = [run_arm(arm, opts, rows) for arm in ("sequential", "oneStepOff")]
    if rank == 0:
        Path(opts.out).write_text(json.dumps({"world": world, "arms": arms}))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def parse(argv: list[str] | None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6, help="optimizer steps per arm (the first is not counted)")
    ap.add_argument("--rows", type=int, default=8, help="completions per rank per step")
    ap.add_argument("--generations", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=32, help="completion length cap")
    ap.add_argument("--skip-colocate", action="store_true")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--base", help=argparse.SUPPRESS)
    ap.add_argument("--model-dir", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    opts = parse(argv)
    if opts.worker:
        worker(opts)
        return 0
    from suite_helpers import VLLM_PYTHON, serving_vllm

    from rlt.data.models import resolve_model_path

    model_dir = resolve_model_path("builtin:tiny-qwen2")
    if not opts.skip_colocate:
        probe = colocate_probe(model_dir, str(VLLM_PYTHON))
        print(f"colocated (vLLM in-process, sleep mode, slept and woken): {'runs' if probe['ok'] else 'REFUSED'}")
        if not probe["ok"]:
            print(f"  error: {probe['error']}")
    work = Path(tempfile.mkdtemp(prefix="rlt-overlap-"))
    out = work / "result.json"
    with serving_vllm(model_dir, "tiny", work / "vllm.log") as base:
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={opts.world}"]
        cmd += [f"--master_port={free_port()}", __file__, "--worker", "--base", base, "--model-dir", model_dir]
        cmd += ["--out", str(out), "--steps", str(opts.steps), "--rows", str(opts.rows)]
        cmd += ["--generations", str(opts.generations), "--tokens", str(opts.tokens)]
        path = os.pathsep.join(p for p in (str(ROOT / "training"), os.environ.get("PYTHONPATH")) if p)
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=path, CUDA_VISIBLE_DEVICES="")
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3000, check=False)
        if proc.returncode != 0:
            print(proc.stdout[-3000:], proc.stderr[-5000:])
            return 1
    res = json.loads(out.read_text())
    seq, off = res["arms"]
    print(
        f"\n{res['world']} ranks (gloo, 1 thread each) + vLLM CPU server, tiny Qwen2; {opts.rows} completions/rank/step,"
        f" ≤{opts.tokens} tokens; medians of steps 2..{opts.steps}"
    )
    print(f"{'arm':<12}{'step s':>9}{'rollout s':>11}{'update s':>10}{'sum s':>8}{'max s':>8}{'step/max':>10}")
    for a in (seq, off):
        total, most = a["rollout"] + a["update"], max(a["rollout"], a["update"])
        print(
            f"{a['arm']:<12}{a['step']:>9.2f}{a['rollout']:>11.2f}{a['update']:>10.2f}{total:>8.2f}{most:>8.2f}"
            f"{a['step'] / most:>10.2f}"
        )
    most = max(seq["rollout"], seq["update"])
    print(
        f"one-step-off step / today's: {off['step'] / seq['step']:.2f}; one-step-off step / max(rollout, update) of "
        f"today's arm: {off['step'] / most:.2f} (1.00 = full overlap); today's step / their sum: "
        f"{seq['step'] / (seq['rollout'] + seq['update']):.2f}; rows sampled ahead: {off['counts']}"
    )
    print(f"per-step figures: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
