"""`rlt` command line: a thin caller of the library (validate, run, stage, and the operator's commands)."""

from __future__ import annotations

import argparse
import sys

from rlt.spec import SpecError
from rlt.validation import load_valid_runs


def cmd_validate(args: argparse.Namespace) -> int:
    bad = 0
    for path in args.files:
        try:
            runs = load_valid_runs(path)  # the same checks as the operator's and the pods'
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
