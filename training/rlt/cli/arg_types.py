"""argparse types for the flags that name a folder, a file to write, a port or a number of seconds: a bad value is
the usual one-line usage error before anything starts, not a traceback after a run (or never)."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


def _nearest_existing(path: Path) -> Path:
    return next(p for p in (path, *path.parents) if p.exists())


def folder_to_write(value: str) -> str:
    """A folder, or one that can be made here: what exists of the path is folders."""
    path = Path(value)
    there = _nearest_existing(path.absolute())
    if not there.is_dir():
        raise argparse.ArgumentTypeError(f"{value}: {'' if there == path.absolute() else f'{there} is '}not a folder")
    return value


def file_to_write(value: str) -> str:
    """A file that can be written: not a folder, and its folder exists or can be made."""
    path = Path(value)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{value}: a folder, not a file")
    there = _nearest_existing(path.absolute().parent)
    if not there.is_dir():
        raise argparse.ArgumentTypeError(f"{value}: {there} is not a folder")
    return value


def metrics_port(value: str) -> int:
    """A metrics port as `rlt run` takes it (rlt.contract.metrics.parse_metrics_port: also 0 = any, -1 = off)."""
    from rlt.contract.metrics import parse_metrics_port

    try:
        return parse_metrics_port(value)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def port(value: str) -> int:
    """A TCP port to listen on, 1-65535 (a server's own port: no 'any' or 'off')."""
    try:
        number = int(value)
    except ValueError:
        number = 0
    if not 1 <= number <= 65535:
        raise argparse.ArgumentTypeError(f"{value!r} is not a port number (1-65535)")
    return number


def seconds(minimum: float = 0.0, above: bool = False) -> Callable[[str], float]:
    """A finite number of seconds, at least `minimum` (above it when `above`)."""
    bound = f"{'above' if above else 'at least'} {minimum:g}"

    def parse(value: str) -> float:
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if not math.isfinite(number) or number < minimum or (above and number == minimum):
            raise argparse.ArgumentTypeError(f"{value!r}: expected a number of seconds, {bound}")
        return number

    return parse


class _RenamedFlag(argparse.Action):
    """A flag's old name, still taken for a while: it fills the new flag's value and says on stderr what to type."""

    def __init__(self, option_strings: list[str], dest: str, new: str, **kwargs: Any) -> None:
        self.new = new
        super().__init__(option_strings, dest, **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        print(f"{parser.prog}: {option_string} is deprecated, use {self.new} (same value)", file=sys.stderr)
        setattr(namespace, self.dest, values)


def add_output_dir(parser: argparse.ArgumentParser, help: str, default: str | None, old: str) -> None:
    """`--output-dir DIR`, every command's name for the folder it writes (`-o/--output` picks a format, as kubectl's
    does); `old`, the name it had, is still taken, hidden from help, with a deprecation line on stderr."""
    parser.add_argument("--output-dir", metavar="DIR", type=folder_to_write, default=default, help=help)
    parser.add_argument(
        old,
        dest="output_dir",
        metavar="DIR",
        type=folder_to_write,
        action=_RenamedFlag,
        new="--output-dir",
        help=argparse.SUPPRESS,
    )
