"""`rlt` command line: a thin caller of the library (validate, run, stage, and the operator's commands)."""

from __future__ import annotations

import argparse
import sys

from rlt.spec import SpecError, load_runs


def check_formats(run) -> list[str]:
    """Beyond the schema: the prompt format the run names must load and fit its method."""
    from pydantic import ValidationError

    try:
        if run.spec.method == "rcl":
            from rlt.rcl.protocol import load_rcl_format

            load_rcl_format(run.spec.rcl.format)
        else:
            from rlt.prompts import resolve_format

            resolve_format(run.spec.format)
    except (ValueError, ValidationError) as err:
        where = "spec.rcl.format" if run.spec.method == "rcl" else "spec.format"
        first = str(err).splitlines()[0]
        return [first if first.startswith("spec.") else f"{where}: not a usable {run.spec.method} format ({first})"]
    return []


def trainer_args_problems(run) -> list[str]:
    """trainerArgs checked against the installed TRL; without TRL they cannot be, which is said, not hidden."""
    try:
        import trl  # noqa: F401
    except ImportError:
        if any(getattr(run.spec.stages, s).trainer_args for s in ("sft", "rl", "student")):
            print(f"{run.name}: note: trainerArgs not checked (TRL is not installed here; the stage checks them)",
                  file=sys.stderr)
        return []
    from rlt.trainer_check import check_trainer_args

    return check_trainer_args(run)


def cmd_validate(args: argparse.Namespace) -> int:
    bad = 0
    for path in args.files:
        try:
            runs = load_runs(path)
            problems = [p for run in runs for p in check_formats(run) + trainer_args_problems(run)]
            if problems:
                raise SpecError(path, problems)
        except SpecError as err:
            bad += 1
            print(f"{path}: INVALID", file=sys.stderr)
            for p in err.problems:
                print(f"  {p}", file=sys.stderr)
            continue
        names = ", ".join(r.name for r in runs)
        print(f"{path}: ok ({names})")
    return 1 if bad else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rlt", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("validate", help="check RLTRun files; exit 1 naming every invalid field")
    p.add_argument("files", nargs="+")
    p.set_defaults(func=cmd_validate)

    from rlt import runner_cli  # training commands (heavy imports happen inside their handlers)

    runner_cli.register(sub)

    from rlt_operator import cli as operator_cli  # operator commands (kopf is imported inside the handlers)

    operator_cli.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
