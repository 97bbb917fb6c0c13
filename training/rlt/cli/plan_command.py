"""`rlt plan FILE.yaml`: the capacity plan of each run in the file (rlt.checks.capacity), exit 1 when something
cannot fit, naming the field to change."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from rlt.cli.output import add_output_option, wants_json

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from rlt.checks.step_time import PromptTokens
    from rlt.spec.run import RLTRunSpec


def cmd_plan(args: argparse.Namespace) -> int:
    import json

    from rlt.checks.gpu_figures import calibrated, calibration_lines, read_calibration

    calibration = None
    doc: dict[str, Any] | None = None
    if wants_json(args):
        doc = {"calibration": [], "plans": [], "invalid": [], "skipped": []}
    if args.calibration:
        try:
            calibration = read_calibration(args.calibration)
        except ValueError as err:
            print(f"rlt plan: {err}", file=sys.stderr)
            return 2
        if doc is None:
            print("\n".join(calibration_lines(calibration)))
        else:
            doc["calibration"] = calibration_lines(calibration)
    with calibrated(calibration):
        code = _plan_files(args, doc)
    if doc is not None:  # one document on stdout; the errors and warnings are on stderr as in text
        print(json.dumps(doc, indent=2))
    return code


def _plan_files(args: argparse.Namespace, doc: dict[str, Any] | None) -> int:
    """Plan every run of the files; each plan rendered as text, or added to `doc` (-o json)."""
    from rlt.checks.capacity import plan_document, plan_for_run, render, spec_gpu_memory
    from rlt.checks.validation import load_valid_runs
    from rlt.spec.loading import SpecError, expand_run_files

    given = args.gpu_memory
    bad = 0
    paths, skipped = expand_run_files(args.files)
    for line in skipped:  # a folder's kustomization or values file: said, not planned
        print(f"rlt plan: {line}", file=sys.stderr)
    if doc is not None:
        doc["skipped"] = skipped
    if not paths:
        print(f"rlt plan: no RLTRun in {', '.join(args.files)}", file=sys.stderr)
        return 1
    for path in paths:
        try:
            runs = load_valid_runs(path, paths_from_file=True)  # relative data paths: from the file's folder
        except SpecError as err:
            print(str(err), file=sys.stderr)
            if doc is not None:
                doc["invalid"].append({"file": path, "problems": list(err.problems)})
            bad += 1
            continue
        for run in runs:
            gpu_memory = given if given is not None else spec_gpu_memory(run.spec)[0]
            plan = plan_for_run(run.spec, gpu_memory, prompts=run_prompts(run.spec))
            if doc is None:
                print(render(plan, f"{path} ({run.name})"))
            else:
                doc["plans"].append(plan_document(plan, path, run.name))
            for line in plan.errors():
                print(f"rlt plan: {path}: {line}", file=sys.stderr)
            for line in plan.warnings:  # a run that fits but wastes GPU-hours: said, not refused
                print(f"rlt plan: {path}: warning: {line}", file=sys.stderr)
            bad += bool(plan.failures or plan.unplaceable or plan.problems)
    return 1 if bad else 0


def run_prompts(spec: RLTRunSpec) -> PromptTokens:
    """The rl prompts' lengths the step time uses: measured on the run's rows where this machine can
    (rlt.checks.prompt_tokens), else the default, with why it was not measured."""
    from dataclasses import replace

    from rlt.checks.step_time import default_prompts

    measured, why = measure_prompt_tokens(spec)
    if measured is not None:
        return measured
    default = default_prompts(spec)
    return replace(default, source=f"{default.source}; {why}")


def measure_prompt_tokens(
    spec: RLTRunSpec, tokenizer: PreTrainedTokenizerBase | None = None
) -> tuple[PromptTokens | None, str]:
    """(the mean and longest teacher prompt of the training rows, or None; why not when None). The rl update, the
    passes and the scoring run over prompt + completion, and a real teacher prompt (question + solution) is a tenth
    of the 16k maxPromptLength. Measured as `rlt validate` checks them (rlt.stages.prompt_lengths: the teacher's
    tokenizer when this machine has it, the rows when they are reachable, never a download)."""
    from rlt.contract.method_registry import method_info

    if not method_info(spec.method).row_prompts or not spec.stages.rl.enabled:
        return None, f"method {spec.method} has no rl stage with teacher prompts of its rows"
    from rlt.checks.step_time import PromptTokens
    from rlt.data.dataset import is_reachable, load_data
    from rlt.method.prompts import Formatter, resolve_format
    from rlt.stages.prompt_lengths import load_local_tokenizer

    if not is_reachable(spec.dataset):
        return None, f"{spec.dataset.source} is not on this machine"
    if tokenizer is None:
        tokenizer, why = load_local_tokenizer(spec, build=True)
        if tokenizer is None:
            return None, why
    formatter = Formatter(resolve_format(spec.format))
    try:
        rows = load_data(spec.dataset, formatter.fmt, warn=False).train
    except (ValueError, OSError) as err:  # said in the plan's line; `rlt validate` reports the rows themselves
        return None, f"the rows of {spec.dataset.source} did not load ({err})"
    lengths = [
        len(
            tokenizer(
                formatter.teacher_prompt(tokenizer, r["question"], r["solution"]), add_special_tokens=False
            ).input_ids
        )
        for r in rows
    ]
    if not lengths:
        return None, f"{spec.dataset.source} has no training rows"
    mean = round(sum(lengths) / len(lengths))
    return PromptTokens(mean, max(lengths), f"measured on {len(lengths)} rows of {spec.dataset.source}"), ""


GPU_MEMORY_RANGE = (2**30, 2**44)  # 1Gi to 16Ti: a value outside is a typo, not a GPU


def gpu_memory_bytes(text: str) -> int:
    """`--gpu-memory`: a Kubernetes quantity of bytes within GPU_MEMORY_RANGE (argparse names the flag)."""
    from rlt.spec.k8s import quantity_bytes

    try:
        value = quantity_bytes(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a Kubernetes quantity (e.g. 80Gi, 141Gi)") from None
    low, high = GPU_MEMORY_RANGE
    if not low <= value <= high:
        raise argparse.ArgumentTypeError(f"{text!r} is not a GPU's memory (from 1Gi to 16Ti)")
    return value


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "plan",
        help="per stage and pod: GPU memory per process, generator KV cache, host memory, disk on the volume; "
        "exit 1 naming the field to change when something cannot fit",
    )
    p.add_argument(
        "files",
        nargs="+",
        metavar="FILE",
        help="RLTRun YAML files (several runs per file allowed), folders (their *.yaml, *.yml) or - for standard input",
    )
    p.add_argument(
        "--gpu-memory",
        type=gpu_memory_bytes,
        help="memory of one GPU, a Kubernetes quantity (default: the spec's nodeSelector nvidia.com/gpu.memory in "
        "MiB when it selects nodes by it, else 80Gi: A100/H100 80GB)",
    )
    p.add_argument(
        "--calibration",
        metavar="FILE",
        help="a GPU check's JSON (benchmarks/gpu_check.py): plan with the figures it measured (dense bf16 matmul "
        "rate, GPU model and memory, local-disk write rate) instead of the spec-sheet ones; prints which it replaced "
        "and which it measured but kept, and why",
    )
    add_output_option(
        p,
        text="a table per run",
        json="one document on stdout, each run's checks in bytes, its goodput per stage as fractions (share, losses), "
        "errors and warnings",
    )
    p.set_defaults(func=cmd_plan)
