"""`rlt completion SHELL`: the shell's completion script for every rlt command, after kubectl's and helm's
`completion` (`source <(rlt completion bash)`). shtab writes it from the argparse parser, so it follows the commands
as they are, the operator's and the sandbox's included when they are installed."""

from __future__ import annotations

import argparse
import sys

from rlt.contract.exitcodes import ExitCode

SHELLS = ("bash", "zsh", "tcsh")  # what shtab writes
# An argument whose metavar says it is a path completes as one (files, or folders only).
FILE_METAVARS = frozenset({"FILE"})
DIR_METAVARS = frozenset({"DIR", "ROOT"})


def mark_paths(parser: argparse.ArgumentParser, file: object, directory: object) -> None:
    """Give every argument of `parser` and its subcommands whose metavar names a file or a folder shtab's path
    completion (`file` or `directory`, shtab's values; read from its `complete` attribute)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                mark_paths(sub, file, directory)
        elif action.metavar in FILE_METAVARS:
            action.complete = file  # type: ignore[attr-defined]
        elif action.metavar in DIR_METAVARS:
            action.complete = directory  # type: ignore[attr-defined]


def cmd_completion(args: argparse.Namespace) -> int:
    try:
        import shtab
    except ModuleNotFoundError:  # the images leave it out: completion is for the machine one types on
        print("rlt completion: needs shtab, a dependency of rlt (pip install shtab)", file=sys.stderr)
        return int(ExitCode.FAILED)
    from rlt.cli import build_parser

    parser = build_parser()
    mark_paths(parser, shtab.FILE, shtab.DIRECTORY)
    sys.stdout.write(shtab.complete(parser, shell=args.shell))
    return int(ExitCode.OK)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "completion",
        help="print the shell completion script: `source <(rlt completion bash)`, or for zsh "
        '`rlt completion zsh > "${fpath[1]}/_rlt"`',
    )
    p.add_argument("shell", choices=SHELLS, metavar="SHELL", help=f"the shell: {', '.join(SHELLS)}")
    p.set_defaults(func=cmd_completion)
