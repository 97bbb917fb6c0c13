"""`rlt` command line: a thin caller of the library (validate, run, stage, and the operator's commands)."""

from __future__ import annotations

import argparse
import sys

from rlt.spec import SpecError
from rlt.stage_registry import TRAINER_STAGES, stage_settings
from rlt.validation import load_valid_runs


def check_datasets(run) -> tuple[list[str], list[str]]:
    """The run's data where this machine can read it: (problems, notes). Every bad row is listed (up to 20)."""
    from rlt.data import DataError, check_data, group_problems, is_reachable, scan_rows
    from rlt.prompts import resolve_format

    problems: list[str] = []
    notes: list[str] = []
    datasets = [("spec.dataset", run.spec.dataset)]
    if run.spec.stages.evaluate.enabled and run.spec.stages.evaluate.dataset is not None:
        datasets.append(("spec.stages.evaluate.dataset", run.spec.stages.evaluate.dataset))
    for where, ds in datasets:
        if not is_reachable(ds):
            notes.append(f"{where}: {ds.source} not checked (a hub dataset is read at run time)")
            continue
        fmt = resolve_format(run.spec.format)
        try:
            data = check_data(ds, fmt, listed=True)
        except DataError as err:
            problems.append(str(err) if str(err).startswith("spec.") else f"{where}: {err}")
            try:  # every bad row, grouped by problem, not only the first
                _, bad, _, _ = scan_rows(ds, fmt)
                problems += [f"  {line}" for line in group_problems(bad)] if len(bad) > 1 else []
            except DataError:
                pass
            continue
        used = data.read - len(data.skipped)
        note = f"{where}: {used} usable rows"
        if data.skipped:
            note += f"; badRows: skip drops {len(data.skipped)} of {data.read} (first: {data.skipped[0]})"
        if data.numbers:
            note += f"; {len(data.numbers)} numeric values used as text (first: {data.numbers[0]})"
        notes.append(note)
    return problems, notes


def trainer_args_problems(run) -> list[str]:
    """trainerArgs checked against the installed TRL; without TRL they cannot be, which is said, not hidden."""
    try:
        import trl  # noqa: F401
    except ImportError:
        if any(stage_settings(run.spec, s).trainer_args for s in TRAINER_STAGES):
            print(
                f"{run.name}: note: trainerArgs not checked (TRL is not installed here; the stage checks them)",
                file=sys.stderr,
            )
        return []
    from rlt.trainer_check import check_trainer_args

    return check_trainer_args(run)


def cmd_validate(args: argparse.Namespace) -> int:
    bad = 0
    for path in args.files:
        notes: list[str] = []
        try:
            runs = load_valid_runs(path)  # the same checks as the operator's and the pods'
            problems: list[str] = []
            if not args.no_data:
                for run in runs:
                    run_problems, run_notes = check_datasets(run)
                    problems += run_problems
                    notes += run_notes
            problems += [p for run in runs for p in trainer_args_problems(run)]
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
        for note in notes:
            print(f"  {note}")
    return 1 if bad else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rlt", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser(
        "validate", help="check RLTRun files and the data they name; exit 1 naming every invalid field and bad row"
    )
    p.add_argument("files", nargs="+")
    p.add_argument("--no-data", action="store_true", help="check the spec only, not the dataset it names")
    p.set_defaults(func=cmd_validate)

    from rlt import runner_cli  # training commands (heavy imports happen inside their handlers)

    runner_cli.register(sub)

    register_command_groups(sub)
    return parser


COMMAND_GROUPS = "rlt.commands"  # entry-point group: `register(subparsers)` functions of other packages


def register_command_groups(sub: argparse._SubParsersAction) -> None:
    """Commands of packages built on rlt (the operator's `crd`, `operator`, `sandbox`), found through their
    entry points, so that the core imports nothing from them."""
    from importlib.metadata import entry_points

    for ep in sorted(entry_points(group=COMMAND_GROUPS), key=lambda e: e.name):
        ep.load()(sub)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
