"""The `-o/--output` option that rlt's reporting commands share, after kubectl's: `text` for people (the default),
`json` for a pipeline, with the same exit code either way."""

from __future__ import annotations

import argparse

FORMATS = ("text", "json")


def add_output_option(parser: argparse.ArgumentParser, text: str, json: str) -> None:
    """Declare `-o/--output {text,json}` on `parser`; `text` and `json` say what each format prints."""
    parser.add_argument(
        "-o",
        "--output",
        choices=FORMATS,
        default="text",
        help=f"text: {text}; json: {json} (the exit code is the same)",
    )


def wants_json(args: argparse.Namespace) -> bool:
    return getattr(args, "output", "text") == "json"
