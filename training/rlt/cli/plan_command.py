"""`rlt plan FILE.yaml`: the capacity plan of each run in the file (rlt.checks.capacity), exit 1 when something
cannot fit, naming the field to change."""

from __future__ import annotations

import argparse
import sys


def cmd_plan(args: argparse.Namespace) -> int:
    from rlt.checks.capacity import plan_for_run, render, spec_gpu_memory
    from rlt.checks.validation import load_valid_runs
    from rlt.spec.k8s import quantity_bytes
    from rlt.spec.loading import SpecError

    given = quantity_bytes(args.gpu_memory) if args.gpu_memory else None
    bad = 0
    for path in args.files:
        try:
            runs = load_valid_runs(path)
        except SpecError as err:
            print(str(err), file=sys.stderr)
            bad += 1
            continue
        for run in runs:
            plan = plan_for_run(run.spec, given or spec_gpu_memory(run.spec)[0])
            print(render(plan, f"{path} ({run.name})"))
            for line in plan.errors():
                print(f"rlt plan: {path}: {line}", file=sys.stderr)
            for line in plan.warnings:  # a run that fits but wastes GPU-hours: said, not refused
                print(f"rlt plan: {path}: warning: {line}", file=sys.stderr)
            bad += bool(plan.failures or plan.unplaceable)
    return 1 if bad else 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plan",
        help="per stage and pod: GPU memory per process, generator KV cache, host memory, disk on the volume; "
        "exit 1 naming the field to change when something cannot fit",
    )
    p.add_argument("files", nargs="+")
    p.add_argument(
        "--gpu-memory",
        help="memory of one GPU, a Kubernetes quantity (default: the spec's nodeSelector nvidia.com/gpu.memory in "
        "MiB when it selects nodes by it, else 80Gi: A100/H100 80GB)",
    )
    p.set_defaults(func=cmd_plan)
