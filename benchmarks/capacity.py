"""The capacity plan against real runs: each case runs one real stage on CPU and compares what it measured with what
`rlt.checks.capacity` planned for the same spec. Each stage runs as its pod would: the trainer container's command
from the operator's builders (`rlt stage`, or `rlt launch -- accelerate launch ... --use_deepspeed --zero_stage N`
over gloo), with only its entry point `-m rlt.cli` swapped for a wrapper that runs rlt's CLI and reports its peak
memory (pod_command).

  memory:  peak resident memory of each process (ru_maxrss) minus that of a process that imported the same
           libraries and loaded nothing ("measured"), against the plan's per-process total (model states + the
           largest phase) planned for CPU (fp32 auto dtype, no CUDA terms) plus "runtime": what the same launch
           holds with a model of nothing (null_model: one layer of width 8), less that model's own plan; a GPU holds
           that runtime (rlt, TRL, the Trainer, the data, torch's and DeepSpeed's CPU state) in host memory. The
           processes run with glibc's mmap threshold fixed (MMAP_THRESHOLD), so RSS counts live tensors.
  disk:    the stage folder at its fullest (polled while the stage runs) and what the finished stage keeps, against
           the plan's disk terms for the stage.

SFT rows are as long as maxLength (rows are truncated to it), and rl's maxPromptLength is the longest prompt, so
activations meet the plan's worst case (rl's completions are sampled: up to maxCompletionLength). Targets:
±35 % memory, ±25 % disk. Prints one row per measurement and names the worst (figures: docs/gpu-cluster.md).

    nice -n 10 env OMP_NUM_THREADS=1 .venv/bin/python benchmarks/capacity.py [--quick] [--world 2]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "manifests" / "examples" / "rltrun-tiny.yaml"
MARK = "RLT_MAXRSS_DIR"  # each measured process writes its peak RSS to a file of its own in this folder
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
import os
with open(os.path.join(os.environ["{MARK}"], str(os.getpid())), "w") as f:
    f.write(str(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024))
"""
TOLERANCE = {"memory": 0.35, "disk": 0.25}
# glibc raises its mmap threshold after the first large free (up to 32 MiB), and the heap then keeps what later frees
# give back: a LoRA forward of SmolLM2-135M (4 × 144 tokens) left 1743 MiB resident for 1144 MiB of tensors autograd
# saved, 1161 MiB with the threshold fixed (full fine-tuning: 899 and 756). A fixed threshold makes RSS count live
# tensors, as a GPU's allocator does; the measured processes run with it.
MMAP_THRESHOLD = 64 * 1024


def full_length(doc: dict, model: str) -> int:
    """The shortest training row of the case in tokens: with maxLength set to it every row is exactly that long (the
    longer ones truncated, none losing its whole completion), so the run meets the plan's worst case."""
    from rlt.data.dataset import load_data
    from rlt.data.models import load_tokenizer
    from rlt.method.prompts import Formatter, resolve_format
    from rlt.spec.loading import parse_run
    from rlt.stages.sft import sft_rows

    spec = parse_run(copy.deepcopy(doc)).spec
    fmt = Formatter(resolve_format(spec.format))
    rows = sft_rows(load_data(spec.dataset, fmt.fmt).train, fmt, load_tokenizer(model, "right"), "skip")
    shortest = min(len(r["input_ids"]) for r in rows)
    assert shortest > max(r["completion_mask"].index(1) for r in rows), "a row would lose its whole completion"
    return shortest


def longest_prompt(doc: dict, model: str) -> int:
    """The longest teacher prompt of the case in tokens: as stages.rl.maxPromptLength the batch holding it meets the
    plan's prompt length (rl refuses longer prompts)."""
    from rlt.data.dataset import load_data
    from rlt.data.models import load_tokenizer
    from rlt.method.prompts import Formatter, resolve_format
    from rlt.spec.loading import parse_run
    from rlt.stages.sft import teacher_prompt_ids

    spec = parse_run(copy.deepcopy(doc)).spec
    fmt = Formatter(resolve_format(spec.format))
    tokenizer = load_tokenizer(model, "left")
    rows = load_data(spec.dataset, fmt.fmt).train
    return max(len(teacher_prompt_ids(fmt, tokenizer, r["question"], r["solution"])) for r in rows)


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
        spec["stages"]["rl"]["maxPromptLength"] = longest_prompt(doc, model)
    spec["stages"]["distill"]["enabled"] = False
    spec["resources"]["trainer"]["gpus"] = world
    return doc


def planned(doc: dict, stage: str):
    from rlt.checks.capacity import plan_run
    from rlt.checks.model_shape import Shapes
    from rlt.checks.shapes import read_shape
    from rlt.spec.loading import parse_run

    spec = parse_run(copy.deepcopy(doc)).spec
    shapes = Shapes(read_shape(spec.teacher)[0], read_shape(spec.student)[0])
    plan = plan_run(spec, shapes, gpu=False)
    (check,) = [c for c in plan.checks if c.stage == stage and c.resource.startswith("GPU memory")]
    return check, plan.disk[stage]


def du(path: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            with contextlib.suppress(FileNotFoundError):
                total += (Path(dirpath) / f).lstat().st_size
    return total


def pod_command(doc: dict, stage: str, root: Path, script: Path) -> tuple[list[str], dict[str, str]]:
    """The trainer container's command and literal env as the operator renders them (rlt_operator.builders
    trainer_job), made runnable here: Kubernetes' $(VAR) expansion with this machine as the rendezvous, the volume's
    mount at `root`, and the stage's entry point (`-m rlt.cli`, or `rlt` for one process) swapped for `script`,
    which runs rlt's CLI with the same arguments and then reports its peak memory."""
    import socket

    from rlt.checks.validation import validate_spec
    from rlt.contract.layout import PVC_MOUNT
    from rlt_operator import builders
    from rlt_sandbox.kubelet_model import expand

    spec = validate_spec(copy.deepcopy(doc["spec"]), name=doc["metadata"]["name"])
    job = builders.trainer_job(builders.RunRef(doc["metadata"]["name"], "default", "bench"), spec, stage, 0)
    (container,) = job["spec"]["template"]["spec"]["containers"]
    literal = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    here = {"NODE_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
    cmd = [expand(a, here) for a in container["command"]]  # the kubelet's $(VAR) rules
    cmd = [a.replace(PVC_MOUNT, str(root)) for a in cmd]
    if cmd[0] == "rlt" and cmd[1] != "launch":  # one process: `rlt stage ...`
        cmd[:1] = [sys.executable, str(script)]
    else:  # `rlt launch -- accelerate launch ... -m rlt.cli stage ...`
        at = cmd.index("-m")
        assert cmd[at + 1] == "rlt.cli", cmd
        cmd[at : at + 2] = [str(script)]
        cmd[0] = str(Path(sys.executable).parent / "rlt")
    # The pod's own env, less what names the pod's filesystem or the cluster: paths under /data and /tmp of the
    # pod, its DNS rendezvous (replaced above) and the fixed metrics port (other processes here use it).
    pod_only = {"HOME", "XDG_CACHE_HOME", "TMPDIR", "HF_HOME", "MASTER_ADDR", "MASTER_PORT", "RLT_METRICS_PORT"}
    env = {k: v for k, v in literal.items() if k not in pod_only}
    return cmd, {**env, **here}


def run_measured(cmd: list[str], world: int, env: dict, watch: Path | None = None) -> tuple[list[int], int]:
    """(peak RSS per process, peak bytes under `watch`) of `cmd`, whose `world` processes each write one file
    under MARK (ranks share stdout, where lines may interleave)."""
    marks = Path(tempfile.mkdtemp(prefix="rss-"))
    env = {**env, MARK: str(marks)}
    peak = [0]
    done = threading.Event()

    def poll() -> None:
        while not done.is_set():
            if watch is not None and watch.exists():
                peak[0] = max(peak[0], du(watch))
            time.sleep(0.02)

    t = threading.Thread(target=poll, daemon=True)
    t.start()
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200, check=False)
    done.set()
    t.join()
    if out.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    rss = [int(f.read_text()) for f in sorted(marks.iterdir())]
    shutil.rmtree(marks)
    if len(rss) != world:
        raise SystemExit(f"{' '.join(cmd)}: {len(rss)} of {world} processes reported their peak memory")
    return rss, peak[0]


def null_model(tmp: Path) -> str:
    """A model of (almost) nothing with the tiny model's tokenizer: one layer of width 8. Its stage run measures what
    a stage process holds besides the model (rlt, TRL and the Trainer, the data, torch's and DeepSpeed's runtime),
    which a GPU holds in host memory, not on the GPU, and which the plan therefore leaves out."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from rlt.data.models import resolve_model_path

    tiny = resolve_model_path("builtin:tiny-qwen2")
    out = tmp / "null-model"
    config = AutoConfig.from_pretrained(tiny)
    config.update(
        dict(hidden_size=8, intermediate_size=8, num_hidden_layers=1, num_attention_heads=1, num_key_value_heads=1)
    )
    config.head_dim = 8
    if hasattr(config, "layer_types"):
        config.layer_types = config.layer_types[:1]
    AutoModelForCausalLM.from_config(config).save_pretrained(out)
    AutoTokenizer.from_pretrained(tiny).save_pretrained(out)
    return str(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="the tiny model only (plus the --world cases)")
    parser.add_argument("--world", type=int, default=1, help="also run ZeRO-2/3 cases in a gloo world of this size")
    parser.add_argument("--dir", default=None, help="where the cases write (default: the system's temporary folder)")
    opts = parser.parse_args()
    cases = [("builtin:tiny-qwen2", "sft", False, 0, 1)]
    if not opts.quick:
        cases += [
            ("builtin:smollm2-135m-instruct", "sft", False, 0, 1),
            ("builtin:smollm2-135m-instruct", "sft", True, 0, 1),
            ("builtin:smollm2-135m-instruct", "rl", False, 0, 1),
        ]
    if opts.world > 1:
        cases += [("builtin:smollm2-135m-instruct", "sft", False, z, opts.world) for z in (2, 3)]
    rows = []
    with tempfile.TemporaryDirectory(prefix="rlt-capacity-", dir=opts.dir) as tmp:
        script = Path(tmp) / "measure.py"
        script.write_text(MEASURE)
        env = {
            **os.environ,
            "RLT_METRICS_PORT": "-1",
            "OMP_NUM_THREADS": "1",
            "MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD),
            "PYTHONPATH": os.pathsep.join([str(ROOT / "training"), str(ROOT / "operator")]),
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        }
        base_rss, _ = run_measured([sys.executable, str(script), "--baseline"], 1, env)
        baseline = base_rss[0]

        def measure(doc: dict, stage: str, world: int, tag: str) -> tuple[list[int], int, int]:
            root = Path(tmp) / tag
            cmd, pod_env = pod_command(doc, stage, root, script)
            watch = root / doc["metadata"]["name"] / stage
            rss, peak = run_measured(cmd, world, {**env, **pod_env}, watch=watch)
            kept = du(watch)
            shutil.rmtree(root)  # the next case needs the disk
            return [r - baseline for r in rss], peak, kept

        # What a stage process holds besides its model, per launch (stage, world, ZeRO stage): the null model's
        # run, less what the plan gives that model (its own small terms).
        null = null_model(Path(tmp))
        runtime: dict[tuple[str, int, int], int] = {}
        for stage, world, zero in dict.fromkeys((s, w, z) for _, s, _, z, w in cases):
            doc = case_doc(null, stage, False, zero, world)
            check, _ = planned(doc, stage)
            rss, _, _ = measure(doc, stage, world, f"null-{stage}-w{world}-z{zero}")
            runtime[(stage, world, zero)] = max(rss) - check.total
        for n, (model, stage, lora, zero, world) in enumerate(cases):
            doc = case_doc(model, stage, lora, zero, world)
            check, (disk_peak, disk_kept) = planned(doc, stage)
            rss, peak, kept = measure(doc, stage, world, f"{stage}-{n}")
            label = f"{model.removeprefix('builtin:')} {stage}{' lora' if lora else ''} zero{zero} world{world}"
            for rank, r in enumerate(rss):
                rows.append((f"{label} rank{rank}", "memory", r, runtime[(stage, world, zero)], check.total))
            rows.append((label, "disk peak", peak, 0, disk_peak))
            rows.append((label, "disk kept", kept, 0, disk_kept))
    print(f"baseline (imports only): {baseline / 2**20:.0f} MiB per process; measured = peak RSS - baseline;")
    print("runtime = the null model's measured - its plan (same launch); ratio = measured / (planned + runtime)")
    print(f"{'case':<54}{'what':<11}{'measured':>12}{'runtime':>12}{'planned':>12}{'ratio':>8}")
    worst, ok = None, True
    for label, what, measured, extra, plan in rows:
        ratio = measured / (plan + extra) if plan + extra else float("inf")
        kind = "memory" if what == "memory" else "disk"
        inside = abs(ratio - 1) <= TOLERANCE[kind]
        ok &= inside
        err = abs(ratio - 1)
        if worst is None or err > worst[0]:
            worst = (err, label, what, ratio)
        shown = f"{extra / 2**20:>8.0f} MiB" if what == "memory" else f"{'-':>12}"
        print(
            f"{label:<54}{what:<11}{measured / 2**20:>8.0f} MiB{shown}{plan / 2**20:>8.0f} MiB{ratio:>8.2f}"
            f"{'' if inside else '  outside target'}"
        )
    if worst:
        print(f"worst: {worst[1]} {worst[2]} ratio {worst[3]:.2f}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
