"""CLI commands of the operator side (`rlt crd`, `rlt operator`, `rlt sandbox`)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    pass
