"""CLI commands that train: `rlt run` and `rlt stage` (filled in by the training code)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    pass
