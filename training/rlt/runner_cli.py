"""CLI commands that train: `rlt run` (local, all stages) and `rlt stage` (one stage, in a pod)."""

from __future__ import annotations

import argparse
import logging
import sys

from rlt.spec import STAGE_ORDER, SpecError
from rlt.validation import load_valid_run


def _load(path: str):
    # Logging is set up by the command that runs, not at registration: the operator has its own format.
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        return load_valid_run(path)  # the checks `rlt validate` and the operator make
    except SpecError as err:
        print(str(err), file=sys.stderr)
        raise SystemExit(1) from None


def cmd_run(args: argparse.Namespace) -> int:
    from rlt.runner import run_local

    run = _load(args.file)
    port = None if args.metrics_port < 0 else args.metrics_port
    run_local(run, args.output, port, args.linger, args.stage or None, args.device, not args.no_progress)
    return 0


def cmd_stage(args: argparse.Namespace) -> int:
    from rlt.metrics import metrics_port_from_env
    from rlt.runner import run_stage_in_pod

    run = _load(args.config)
    run_stage_in_pod(run, args.name, args.root, metrics_port_from_env())
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from rlt.rcl.cli import run_eval

    run = _load(args.file)
    if run.spec.method != "rcl":
        print(f"{args.file}: rlt eval runs the rcl teaching evaluation; this run has method {run.spec.method} "
              "(use its evaluate stage)", file=sys.stderr)
        return 2
    report = run_eval(run, args.output, args.teacher, args.label, args.device)
    print(report.read_text())
    print(f"report: {report}")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from rlt.compare import run_compare

    run = _load(args.file)
    port = None if args.metrics_port < 0 else args.metrics_port
    run_compare(run, args.output, args.device, not args.no_progress, port)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run an RLTRun's stages on this machine into OUTPUT/<run>/")
    p.add_argument("file", help="RLTRun YAML")
    p.add_argument("--output", default="results", help="results folder (default: results)")
    p.add_argument("--metrics-port", type=int, default=9400, help="Prometheus port on 127.0.0.1 (0 = any, -1 = off)")
    p.add_argument("--linger", type=float, default=0.0, help="keep serving metrics this many seconds after the run")
    p.add_argument("--stage", action="append", choices=STAGE_ORDER, help="run only this stage (repeatable)")
    p.add_argument("--device", choices=["cpu", "cuda"], help="default: cuda if available")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("eval", help="rcl: APG/NDR/TES of a teacher on the held-out split -> OUTPUT/<run>/eval/")
    p.add_argument("file", help="RLTRun YAML (method: rcl)")
    p.add_argument("--teacher", help="teacher to evaluate: a model path or hub id, builtin:<name>, 'initial' "
                   "(spec.teacher), 'none' (no teacher); default: the run's latest trained teacher (rl, else sft)")
    p.add_argument("--label", help="row name in the report (default: from --teacher)")
    p.add_argument("--output", default="results", help="results folder of the run (default: results)")
    p.add_argument("--device", choices=["cpu", "cuda"], help="default: cuda if available")
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("stage", help="run one stage of the run in --config (what the operator's pods execute)")
    p.add_argument("name", choices=STAGE_ORDER)
    p.add_argument("--config", required=True, help="RLTRun YAML (the run's ConfigMap)")
    p.add_argument("--root", default="/data", help="data root (the run's PVC)")
    p.set_defaults(func=cmd_stage)
    p = sub.add_parser("compare", help="distil students from the RL teacher, the SFT-only teacher and the dataset's traces; "
                                       "evaluate them and the untrained student (OUTPUT/<run>/compare/)")
    p.add_argument("file", help="RLTRun YAML (sft and rl enabled; student/evaluate defaults apply when disabled)")
    p.add_argument("--output", default="results", help="results folder (default: results)")
    p.add_argument("--metrics-port", type=int, default=-1, help="Prometheus port on 127.0.0.1 (0 = any, -1 = off)")
    p.add_argument("--device", choices=["cpu", "cuda"], help="default: cuda if available")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_compare)

