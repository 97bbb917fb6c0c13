"""spec.stages.<stage>.trainerArgs checked without TRL: each key against the option table of TRL's own config class
(`trl_options.json`, generated from the installed TRL's SFTConfig/GRPOConfig dataclass fields by
`rlt.stages.trainer_check`, `make generate`; a test keeps it equal to the installed TRL), so the operator (whose
image has no TRL) refuses what `rlt validate` refuses.

Each key is one of: an option rlt sets itself (refused, naming the spec field to use or why it is fixed — two
sources for one option would make the effective value depend on merge order), an option of the config (passed
through; its value must have the option's type), or not an option (refused, with the closest real name). Every
problem is reported, not only the first."""

from __future__ import annotations

import difflib
import json
from functools import cache
from pathlib import Path
from typing import Any

OPTIONS_FILE = Path(__file__).with_name("trl_options.json")

# An option's accepted kinds: "bool", "int", "float", "str", "list", "dict", "null", or {"enum": [values]}.
Kind = str | dict[str, list[Any]]


@cache
def trl_options() -> dict[str, dict[str, list[Kind]]]:
    """{config class name: {option: [accepted kinds]}} (plus "_trl": the TRL version it was made from)."""
    table: dict[str, dict[str, list[Kind]]] = json.loads(OPTIONS_FILE.read_text())
    return table


def _is(value: Any, kind: Kind) -> bool:
    if isinstance(kind, dict):
        return value in kind["enum"]
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "float":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "null":
        return value is None
    return isinstance(value, {"str": str, "list": list, "dict": dict}[kind])


def _kinds(kinds: list[Kind]) -> str:
    words = [
        " | ".join(repr(v) for v in k["enum"]) if isinstance(k, dict) else {"null": "null"}.get(k, k) for k in kinds
    ]
    return " or ".join(words)


def value_problem(value: Any, kinds: list[Kind]) -> str | None:
    """Why `value` does not fit an option of these kinds (None when it does)."""
    if any(_is(value, k) for k in kinds):
        return None
    hint = ""
    if isinstance(value, str) and "float" in kinds:
        try:
            float(value)
            hint = " (a number in quotes is text: write it without the quotes)"
        except ValueError:
            pass
    shown = json.dumps(value, default=str)
    if value is None:
        return f"null is not {_kinds(kinds)}"
    return f"{shown[:40]} is a {type(value).__name__}, not {_kinds(kinds)}{hint}"


# Options whose valid range a library checks only once the optimizer is built, hours into a run: torch.optim.AdamW's
# own checks (0 <= betas < 1, eps >= 0; tests/operator/test_door_cases.py holds this table equal to torch's).
# (low, high, words): low <= value < high (high None: no upper bound).
RANGES: dict[str, tuple[float, float | None, str]] = {
    "adam_beta1": (0.0, 1.0, "in [0, 1) (torch.optim.AdamW)"),
    "adam_beta2": (0.0, 1.0, "in [0, 1) (torch.optim.AdamW)"),
    "adam_epsilon": (0.0, None, "at least 0 (torch.optim.AdamW)"),
}
# Stated bounds of the options rlt passes through that neither TRL nor transformers checks when the config is built
# (a zero evaluation interval, a clipping range of 0, a smoothing factor above 1 reach the training loop); the options
# rlt sets itself have their bounds on the spec's own fields.
_BIG = 2.0**31  # a step interval, worker count or step count past this is a typo, not a plan
STATED: dict[str, tuple[float, float | None, bool, str]] = {
    # key: (low, high, low_open, words) with low (<, or <= when not low_open) value < high
    "label_smoothing_factor": (0.0, 1.0, False, "in [0, 1)"),
    "dataloader_num_workers": (0.0, 1025.0, False, "in [0, 1024]"),
    "dataloader_prefetch_factor": (0.0, 1025.0, True, "in [1, 1024]"),
    "data_seed": (0.0, 2.0**32, False, "in [0, 2^32) (numpy's seed)"),
    "eval_steps": (0.0, _BIG, True, "above 0 (a fraction below 1, else a step count)"),
    "torch_empty_cache_steps": (0.0, _BIG, True, "above 0"),
    "neftune_noise_alpha": (0.0, None, False, "at least 0"),
    "epsilon": (0.0, 1.0, True, "in (0, 1) (GRPO's clipping range)"),
    "epsilon_high": (0.0, 1.0, True, "in (0, 1) (GRPO's upper clipping range)"),
    "delta": (0.0, None, True, "above 0 (GRPO's two-sided clipping)"),
    "num_completions_to_print": (0.0, _BIG, False, "at least 0"),
}


def range_problem(key: str, value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if key in RANGES:
        low, high, words = RANGES[key]
        if not (value >= low and (high is None or value < high)):
            return f"{value} is out of range: must be {words}"
    if key in STATED:
        low, top, low_open, words = STATED[key]
        above = value > low if low_open else value >= low
        below = top is None or value < top
        if not (above and below):
            return f"{value} is out of range: must be {words}"
    return None


def trainer_args_problems(stage: str, config: str, owned: dict[str, str], args: dict[str, Any]) -> list[str]:
    """'spec.stages.<stage>.trainerArgs.<key>: ...' for every key that is owned by rlt, unknown, or of the wrong
    type; `owned` maps the keys rlt sets to what to set instead ('{stage}' is the stage's name)."""
    where = f"spec.stages.{stage}.trainerArgs"
    options = trl_options()[config]
    out = []
    for key, value in args.items():
        if key in owned:
            out.append(f"{where}.{key}: set by rlt; {owned[key].format(stage=stage)}")
        elif key not in options:
            close = difflib.get_close_matches(key, sorted(options), n=1)
            out.append(f"{where}.{key}: not a {config} option" + (f" (did you mean {close[0]}?)" if close else ""))
        else:
            problem = value_problem(value, options[key]) or range_problem(key, value)
            if problem:
                out.append(f"{where}.{key}: {problem} ({config}.{key})")
    return out
