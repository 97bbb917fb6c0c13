"""The capacity plan against real runs: each case runs one real stage on CPU (`rlt stage`, TRL + DeepSpeed as the
pods run them) and compares what it measured with what `rlt.spec.capacity` planned for the same spec.

  memory: peak resident memory of each process (ru_maxrss) minus that of a process that imported the same
          libraries and loaded nothing, against the plan's per-process total (model states + the largest phase),
          planned for CPU (fp32 auto dtype, no CUDA terms);
  disk:   the stage folder at its fullest (polled while the stage runs) and what the finished stage keeps, against
          the plan's disk terms for the stage.

Rows are as long as maxLength (rows are truncated to it), so activations are the plan's worst case. Targets:
±35 % memory, ±25 % disk. Prints one row per measurement and names the worst.

    nice -n 10 env OMP_NUM_THREADS=1 .venv/bin/python benchmarks/capacity.py [--quick] [--world 2]
"""

from __future__ import annotations

import argparse
import copy
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "manifests" / "examples" / "rltrun-tiny.yaml"
MARK = "RLT_MAXRSS"
# Run inside each measured process: the stage through rlt's CLI, then this process's peak RSS.
MEASURE = f"""
import resource, sys
if sys.argv[1] == "--baseline":
    import torch, transformers, trl, datasets, deepspeed, peft  # noqa: F401
    import rlt.stages.sft, rlt.stages.rl  # noqa: F401
else:
    from rlt.cli import main
    rc = main(sys.argv[1:])
    if rc:
        sys.exit(rc)
print("{MARK}", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, flush=True)
"""
TOLERANCE = {"memory": 0.35, "disk": 0.25}


def full_length(doc: dict, model: str) -> int:
    """The shortest training row of the case in tokens: with maxLength set to it every row is exactly that long (the
    longer ones truncated, none losing its whole completion), so the run meets the plan's worst case."""
    from rlt.data.dataset import load_data
    from rlt.method.prompts import Formatter, resolve_format
    from rlt.run.models import load_tokenizer
    from rlt.spec.loading import parse_run
    from rlt.stages.sft import sft_rows

    spec = parse_run(copy.deepcopy(doc)).spec
    fmt = Formatter(resolve_format(spec.format))
    rows = sft_rows(load_data(spec.dataset, fmt.fmt).train, fmt, load_tokenizer(model, "right"), "skip")
    shortest = min(len(r["input_ids"]) for r in rows)
    assert shortest > max(r["completion_mask"].index(1) for r in rows), "a row would lose its whole completion"
    return shortest


def case_doc(model: str, stage: str, lora: bool, zero: int, world: int) -> dict:
    doc = yaml.safe_load(TINY.read_text())
    spec = doc["spec"]
    doc["metadata"]["name"] = "capacity"
    spec["teacher"] = {"model": model, **({"lora": {"r": 16, "alpha": 32}} if lora else {})}
    spec["student"] = {"model": model}
    sft = spec["stages"]["sft"]
    sft.update(maxSteps=2, saveSteps=1, saveTotalLimit=2, batchSize=4 * world, perDeviceBatchSize=4)
    sft["maxLength"] = full_length(doc, model)
    sft["deepspeedZeroStage"] = zero
    spec["stages"]["rl"].update(enabled=stage == "rl", deepspeedZeroStage=zero, saveTotalLimit=2)
    if stage == "rl":
        spec["stages"]["sft"]["enabled"] = False
    spec["stages"]["distill"]["enabled"] = False
    spec["resources"]["trainer"]["gpus"] = world
    return doc


def planned(doc: dict, stage: str):
    from rlt.spec.capacity import Shapes, plan_run
    from rlt.spec.loading import parse_run
    from rlt.spec.shapes import read_shape

    spec = parse_run(copy.deepcopy(doc)).spec
    shapes = Shapes(read_shape(spec.teacher)[0], read_shape(spec.student)[0])
    plan = plan_run(spec, shapes, gpu=False)
    (check,) = [c for c in plan.checks if c.stage == stage and c.resource.startswith("GPU memory")]
    return check, plan.disk[stage]


def du(path: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(dirpath, f)).st_size
            except FileNotFoundError:
                pass
    return total


def run_measured(
    args: list[str], world: int, env: dict, watch: Path | None = None, zero: int = 0
) -> tuple[list[int], int]:
    """(peak RSS per process, peak bytes under `watch`) of `rlt <args>` in `world` processes, launched as the
    operator launches them (rlt_operator.builders.trainer_command: accelerate + DeepSpeed for several)."""
    script = Path(env["RLT_BENCH_DIR"]) / "measure.py"
    script.write_text(MEASURE)
    if world > 1:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        cmd = [
            sys.executable,
            "-m",
            "accelerate.commands.launch",
            "--num_machines",
            "1",
            "--num_processes",
            str(world),
            "--machine_rank",
            "0",
            "--main_process_ip",
            "127.0.0.1",
            "--main_process_port",
            str(port),
            "--use_deepspeed",
            "--zero_stage",
            str(zero),
            "--deepspeed_multinode_launcher",
            "standard",
            "--mixed_precision",
            "no",
            str(script),
            *args,
        ]
    else:
        cmd = [sys.executable, str(script), *args]
    peak = [0]
    done = threading.Event()

    def poll() -> None:
        while not done.is_set():
            if watch is not None and watch.exists():
                peak[0] = max(peak[0], du(watch))
            time.sleep(0.02)

    t = threading.Thread(target=poll, daemon=True)
    t.start()
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200)
    done.set()
    t.join()
    if out.returncode:
        raise SystemExit(f"{' '.join(args)} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    rss = [int(n) for n in re.findall(rf"{MARK} (\d+)", out.stdout)]  # ranks share stdout: lines may interleave
    if len(rss) != world:
        raise SystemExit(f"{' '.join(args)}: {len(rss)} of {world} processes reported their peak memory")
    return rss, peak[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="the tiny model only (plus the --world cases)")
    parser.add_argument("--world", type=int, default=1, help="also run ZeRO-2/3 cases in a gloo world of this size")
    opts = parser.parse_args()
    cases = [("builtin:tiny-qwen2", "sft", False, 0, 1)]
    if not opts.quick:
        cases += [
            ("builtin:smollm2-135m-instruct", "sft", False, 0, 1),
            ("builtin:smollm2-135m-instruct", "sft", True, 0, 1),
        ]
    if opts.world > 1:
        cases += [("builtin:smollm2-135m-instruct", "sft", False, z, opts.world) for z in (2, 3)]
    rows = []
    with tempfile.TemporaryDirectory(prefix="rlt-capacity-") as tmp:
        env = {
            **os.environ,
            "RLT_BENCH_DIR": tmp,
            "RLT_METRICS_PORT": "-1",
            "OMP_NUM_THREADS": "1",
            "PYTHONPATH": os.pathsep.join([str(ROOT / "training"), os.environ.get("PYTHONPATH", "")]),
        }
        base_rss, _ = run_measured(["--baseline"], 1, env)
        baseline = base_rss[0]
        for model, stage, lora, zero, world in cases:
            doc = case_doc(model, stage, lora, zero, world)
            root = Path(tmp) / f"{stage}-{len(rows)}"
            cfg = Path(tmp) / f"{stage}-{len(rows)}.yaml"
            cfg.write_text(yaml.safe_dump(doc))
            check, (disk_peak, disk_kept) = planned(doc, stage)
            rss, peak = run_measured(
                ["stage", stage, "--config", str(cfg), "--root", str(root)],
                world,
                env,
                watch=root / "capacity" / stage,
                zero=zero,
            )
            kept = du(root / "capacity" / stage)
            label = f"{model.removeprefix('builtin:')} {stage}{' lora' if lora else ''} zero{zero} world{world}"
            for rank, r in enumerate(rss):
                rows.append((f"{label} rank{rank}", "memory", r - baseline, check.total))
            rows.append((f"{label}", "disk peak", peak, disk_peak))
            rows.append((f"{label}", "disk kept", kept, disk_kept))
    print(f"baseline (imports only): {baseline / 2**20:.0f} MiB per process")
    print(f"{'case':<58}{'what':<11}{'measured':>12}{'planned':>12}{'ratio':>8}")
    worst, ok = None, True
    for label, what, measured, plan in rows:
        ratio = measured / plan if plan else float("inf")
        kind = "memory" if what == "memory" else "disk"
        inside = abs(ratio - 1) <= TOLERANCE[kind]
        ok &= inside
        err = abs(ratio - 1)
        if worst is None or err > worst[0]:
            worst = (err, label, what, ratio)
        print(
            f"{label:<58}{what:<11}{measured / 2**20:>9.0f} MiB{plan / 2**20:>8.0f} MiB{ratio:>8.2f}"
            f"{'' if inside else '  outside target'}"
        )
    if worst:
        print(f"worst: {worst[1]} {worst[2]} ratio {worst[3]:.2f}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
