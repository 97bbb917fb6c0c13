"""Generation and training overlapped one step off-policy (rlt.stages.overlap) against today's order, in one run:
the real vLLM CPU server (the generator's flags, `make vllm-venv`) on the tiny Qwen2 and a 2-rank gloo world of
CPU trainers running TRL's GRPOTrainer with rlt's one-step-off rollout.

Separate hardware, emulated: on a cluster the generators and the trainers are different GPUs; here they would fight
for the same few cores and the overlap could not show. So the vLLM server (its API process and its engine, OpenMP
bound by VLLM_CPU_OMP_THREADS_BIND) runs on the generator cores only and the trainer ranks on the others
(os.sched_setaffinity, inherited by every child; each rank's torch threads = its share of the trainer cores, at least
one: on a 2-core machine the two ranks share core 1). The output prints the split, the nice value and the load
average before and after: other processes on the same cores still take their share, at whatever nice they run.

Arm "sequential" (today): each step's rollout (every rank samples its rows from the server over HTTP), then the
scoring and the update: a step takes rollout + update. Arm "oneStepOff": step k+1's rows are sampled while step k
updates: a step should take max(rollout, update) (plus the wait when the rollout is the longer). The weights cannot
be pushed to vLLM's CPU build (TRL's weight transfer needs the GPU engine), so the server keeps the start weights in
both arms; the push is the same in both and the plan charges it. beta = 0: no reference pass in either arm.
Reported per arm: the median step, rollout and update seconds after the first step; then, side by side, each arm's
step against max(rollout, update) and against rollout + update, where rollout and update are the sequential arm's
(measured apart, nothing beside them), and where the one-step-off arm's extra time went: the wait for its rollout,
the update slowed by the rollout beside it, and the step's work before its rollout is sent.

Colocated mode (TRL's vllm_mode="colocate" with vllm_enable_sleep_mode) is probed first: vLLM's engine in a process
of its own with sleep mode on, put to sleep (level 2) and woken (weights, then KV cache), as TRL 1.16 does around
each rollout; the exact error is printed when
the CPU build refuses (vLLM 0.32 CPU: "Sleep mode is not supported on current platform.").

The rollout's HTTP client runs in a process of its own (rlt.stages.overlap.ClientProcess); --thread-arm adds the
one-step-off arm with the client in a thread of the trainer, as before, in the same run.

Measured 2026-11-28 on the 2-core build machine (generator core 0, both ranks core 1), thread arm alone (nice 0,
load ~15): 32 tokens, rollout-bound (rollout 1.06 s, update 0.28 s): one step off 1.02 × the max; 8 tokens
(0.25 s, 0.17 s): 1.39 × the max, its rollout 1.39 × and its update 1.22 × slower than apart. With the client
process and --thread-arm, nice 10, load ~11 (a full CI run beside busy loops on both cores):
  --tokens 64 --rows 64 (rollout-bound, 2.78 s / 1.30 s): process 1.02 × the max, thread 1.04 ×; sequential 0.98 ×
    the sum;
  --tokens 8 (0.18 s / 0.15 s): process 1.11 ×, thread 1.19 ×;
  --tokens 64 --rows 32 --prompt-tokens 200 (balanced, 1.56 s / 1.92 s): process 1.20 ×, thread 1.22 ×; sequential
    1.01 × the sum. The update beside the rollout: ×1.07 (process), ×1.16 (thread); the rollout beside the update:
    ×1.52 in both, though the vLLM server runs alone on core 0.
  The same balanced command at load ~5.4: rollout 1.41 s, update 2.12 s apart; sequential 0.98 × the sum, one step
    off 0.93 × the max with the client process, 1.05 × with the client thread (steps 1.97 s and 2.21 s).
  Again at 23:28 (load 1.9 at the start, 6.1 at the end), --steps 8: rollout 1.33 s, update 1.87 s apart; sequential
    1.00 × the sum; one step off 1.36 × the max (process), 1.37 × (thread): the update beside the rollout ×1.07 and
    ×1.15, the rollout beside the update ×1.79 and ×2.04.
So the client process takes the GIL's cost off the update (×1.07 against ×1.15), but the 15 % target holds only in
some runs: the rollout, overlapped, ends late, and not through the client: instrumented once (23:31, load ~5), the
client process used 0.02 s of CPU per request, while a request took 1.1-1.5 s with the ranks waiting and 2.5-2.9 s
beside their update. The vLLM server alone on core 0 serves slower while core 1 trains: the two vCPUs share hardware
underneath (caches, memory bandwidth, perhaps sibling threads on the host; the VM reports one thread per core),
which a generator GPU and a trainer GPU do not. Moved to core 0 beside vLLM (a one-off run), the client made it
worse (1.54 × the max).
On idle cores (2026-11-29 04:17, load 0.7 before, 2.2 after, nothing else running), the balanced command without
the thread arm: rollout 1.02 s, update 1.87 s apart; sequential 1.00 × the sum (2.89 s), one step off 1.02 × the max
(1.90 s, 0.66 × the sequential step), its rollout ×1.15 beside the update, its update ×1.02.

    python benchmarks/overlap.py                                  # about 5 minutes on 2 loaded cores
    # balanced, seconds-long steps, the client in a thread beside (about 3 minutes with the colocate probe):
    nice -n 10 python benchmarks/overlap.py --tokens 64 --rows 32 --prompt-tokens 200 --steps 6 --thread-arm
    python benchmarks/overlap.py --steps 4 --tokens 24 --skip-colocate   # quicker
    python benchmarks/overlap.py --generator-cores 0-3 --trainer-cores 4-7
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
llm.sleep(level=2)  # TRL 1.16's cycle (trl.generation.vllm_generation): level 2 drops the weights,
llm.wake_up(tags=["weights"])  # wakes them to load the policy's in place,
llm.wake_up(tags=["kv_cache"])  # then the cache to generate, and sleeps again
llm.generate(["Hello"], SamplingParams(max_tokens=4))
llm.sleep(level=2)
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
    # the rollout's HTTP client: a process of its own (rlt's), or, arm "oneStepOff-thread", a thread of this process
    served = overlap.ServedBehaviour(
        opts.base, st, timeout=600, generate=overlap.generate_all if "thread" in arm else None
    )
    rollout = make_rollout(tok, timer, st, counters)
    steps: list[dict] = []
    sent: dict[str, float] = {}  # when the step sent its next rollout (oneStepOff)

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()
            sent.clear()

        def on_step_end(self, args, state, control, **kw):
            phases = timer.take()
            ahead = ahead_timer.take()
            steps.append(
                {
                    "step": time.perf_counter() - self.t0,
                    "waited": phases.get("generate", 0.0),
                    "rollout": ahead.get("generate", phases.get("generate", 0.0)),
                    # the step's own work before it sends the next rollout, besides the wait for this one
                    "before_send": sent.get("at", self.t0) - self.t0 - phases.get("generate", 0.0),
                }
            )

    if arm.startswith("oneStepOff"):
        ahead = overlap.RolloutAhead(rollout, make_rollout(tok, ahead_timer, st, counters), served, timer)
        start_next = ahead.start_next

        def timed_start(trainer):
            sent["at"] = time.perf_counter()
            start_next(trainer)

        ahead.start_next = timed_start  # type: ignore[method-assign]
        cls, func = overlap.peeking(GRPOTrainer), ahead
    else:

        def sequential(prompts, trainer):
            step, rank = trainer.state.global_step, trainer.accelerator.process_index
            with overlap.sampling_with(served, overlap.rollout_seed(args.seed, step, rank)):
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
    if arm.startswith("oneStepOff"):
        trainer.rollout_ahead = ahead
        overlap.behaviour_is_old_policy(trainer)
    trainer.train()
    later = steps[1:]  # the first step: start-up, and in oneStepOff an on-policy rollout
    # the update: what the step spends besides waiting for its rollout (sequential: besides the rollout itself)
    return {
        "arm": arm,
        "step": statistics.median(s["step"] for s in later),
        "rollout": statistics.median(s["rollout"] for s in later),
        "update": statistics.median(s["step"] - s["waited"] for s in later),
        "waited": statistics.median(s["waited"] for s in later),
        "before_send": statistics.median(s["before_send"] for s in later),
        "counts": getattr(func, "counts", None),
        "steps": steps,
    }


def worker(opts) -> None:
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    import torch

    from rlt.stages.ranks import join_process_group

    torch.set_num_threads(opts.threads)
    rank, world = join_process_group("cpu")
    prompts = opts.rows * world // opts.generations * opts.steps
    # a shared preamble lengthens the update's sequences (its forward and backward read every prompt token) more
    # than the rollout (one prefill, vLLM's prefix cache shares it): it moves the balance towards the update
    preamble = "Context:" + " the" * opts.prompt_tokens + "\n" if opts.prompt_tokens else ""
    rows = [{"prompt": f"{preamble}Question {i}: what is {i} plus {2 * i}? Explain:"} for i in range(prompts)]
    names = ("sequential", "oneStepOff") + (("oneStepOff-thread",) if opts.thread_arm else ())
    arms = [run_arm(arm, opts, rows) for arm in names]
    if rank == 0:
        cores = sorted(os.sched_getaffinity(0))
        Path(opts.out).write_text(json.dumps({"world": world, "arms": arms, "rank0_cores": cores}))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def core_list(text: str) -> set[int]:
    """'0-3,6' -> {0, 1, 2, 3, 6}"""
    out: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def split_cores(generator: str | None, trainer: str | None) -> tuple[set[int], set[int]]:
    """The generator's and the trainers' cores: as given, or the first half of this process's cores for the generator
    and the rest for the trainers. Disjoint, and within what this process may use."""
    mine = set(os.sched_getaffinity(0))
    if len(mine) < 2:
        raise SystemExit(f"overlap benchmark: needs 2 cores or more to keep the generator apart, has {sorted(mine)}")
    ordered = sorted(mine)
    gen = core_list(generator) if generator else set(ordered[: len(ordered) // 2])
    train = core_list(trainer) if trainer else mine - gen
    if gen & train or not gen <= mine or not train <= mine or not gen or not train:
        raise SystemExit(
            f"--generator-cores {sorted(gen)} and --trainer-cores {sorted(train)}: two disjoint, non-empty sets "
            f"of this process's cores {ordered}"
        )
    return gen, train


def parse(argv: list[str] | None):
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--steps", type=int, default=8, help="optimizer steps per arm (the first is not counted)")
    ap.add_argument("--rows", type=int, default=8, help="completions per rank per step")
    ap.add_argument("--generations", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=32, help="completion length cap")
    ap.add_argument("--prompt-tokens", type=int, default=0, help="a preamble of about this many tokens per prompt")
    ap.add_argument("--generator-cores", help="e.g. 0 or 0-3 (default: the first half of the usable cores)")
    ap.add_argument("--trainer-cores", help="e.g. 1 or 4-7 (default: the usable cores the generator does not get)")
    ap.add_argument("--skip-colocate", action="store_true")
    ap.add_argument(
        "--thread-arm",
        action="store_true",
        help="a third arm: one step off with the rollout's HTTP client in a thread of the trainer (rlt's before)",
    )
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--base", help=argparse.SUPPRESS)
    ap.add_argument("--model-dir", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def report(res: dict, opts, gen: set[int], train: set[int], threads: int, load_before: str) -> None:
    seq, off, *others = res["arms"]
    rollout, update = seq["rollout"], seq["update"]  # measured apart: the sequential arm
    most, total = max(rollout, update), rollout + update
    print(
        f"\n{res['world']} trainer ranks (gloo, {threads} torch thread(s) each) on cores {sorted(train)}; the vLLM CPU "
        f"server on cores {sorted(gen)} (separate hardware, emulated by affinity); tiny Qwen2; {opts.rows} "
        f"completions/rank/step, ≤{opts.tokens} tokens, prompts +{opts.prompt_tokens} tokens; medians of steps "
        f"2..{opts.steps}; nice {os.nice(0)}; load average {load_before} before, {load()} after"
    )
    print(f"{'arm':<18}{'step s':>9}{'rollout s':>11}{'update s':>10}{'waited s':>10}")
    for a in res["arms"]:
        print(f"{a['arm']:<18}{a['step']:>9.2f}{a['rollout']:>11.2f}{a['update']:>10.2f}{a['waited']:>10.2f}")
    print(f"rollout {rollout:.2f} s, update {update:.2f} s (sequential arm): max {most:.2f} s, sum {total:.2f} s")
    print(f"{'':<18}{'step/max':>10}{'step/sum':>10}")
    for a in res["arms"]:
        print(f"{a['arm']:<18}{a['step'] / most:>10.2f}{a['step'] / total:>10.2f}")
    print(f"one-step-off step / sequential step: {off['step'] / seq['step']:.2f}; rows sampled ahead: {off['counts']}")
    for a in (off, *others):
        print(
            f"where the {a['arm']} step goes: waiting for its rollout {a['waited']:.2f} s + the rest of the step "
            f"{a['update']:.2f} s (apart: {update:.2f} s, ×{a['update'] / update:.2f}); its rollout took "
            f"{a['rollout']:.2f} s (apart: {rollout:.2f} s, ×{a['rollout'] / rollout:.2f}), sent after "
            f"{a['before_send']:.2f} s of the step's own work (besides the wait)"
        )


def main(argv: list[str] | None = None) -> int:
    opts = parse(argv)
    if opts.worker:
        worker(opts)
        return 0
    from suite_helpers import VLLM_PYTHON, serving_vllm

    from rlt.data.models import resolve_model_path

    gen, train = split_cores(opts.generator_cores, opts.trainer_cores)
    threads = max(1, len(train) // opts.world)
    load_before = load()
    model_dir = resolve_model_path("builtin:tiny-qwen2")
    everything = os.sched_getaffinity(0)
    os.sched_setaffinity(0, gen)  # the server and its engine inherit the generator's cores
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, sorted(gen)))
    if not opts.skip_colocate:
        probe = colocate_probe(model_dir, str(VLLM_PYTHON))
        print(
            f"colocated (vLLM in-process, sleep mode level 2, slept and woken): {'runs' if probe['ok'] else 'REFUSED'}"
        )
        if not probe["ok"]:
            print(f"  error: {probe['error']}")
            print("  so no colocated arm: TRL's colocate mode needs that cycle (rl refuses mode colocate on CPU)")
    work = Path(tempfile.mkdtemp(prefix="rlt-overlap-"))
    out = work / "result.json"
    with serving_vllm(model_dir, "tiny", work / "vllm.log") as base:
        os.sched_setaffinity(0, train)  # the launcher and the ranks: the trainers' cores
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={opts.world}"]
        cmd += [f"--master_port={free_port()}", __file__, "--worker", "--base", base, "--model-dir", model_dir]
        cmd += ["--out", str(out), "--steps", str(opts.steps), "--rows", str(opts.rows), "--threads", str(threads)]
        cmd += ["--generations", str(opts.generations), "--tokens", str(opts.tokens)]
        cmd += ["--prompt-tokens", str(opts.prompt_tokens)] + (["--thread-arm"] if opts.thread_arm else [])
        path = os.pathsep.join(p for p in (str(ROOT / "training"), os.environ.get("PYTHONPATH")) if p)
        env = dict(os.environ, OMP_NUM_THREADS=str(threads), PYTHONPATH=path, CUDA_VISIBLE_DEVICES="")
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3000, check=False)
        os.sched_setaffinity(0, everything)
        if proc.returncode != 0:
            print(proc.stdout[-3000:], proc.stderr[-5000:])
            return 1
    res = json.loads(out.read_text())
    assert set(res["rank0_cores"]) <= train, res["rank0_cores"]  # the ranks ran where they were put
    report(res, opts, gen, train, threads, load_before)
    print(f"per-step figures: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
