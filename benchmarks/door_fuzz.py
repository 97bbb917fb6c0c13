"""A long property run of the door (issue 54): `rlt validate` over generated run files, data rows and local model
files, for a given number of minutes, with fixed seeds (seed, seed+1, ... one hypothesis run of --batch examples
each). For every example: no exception (a traceback), an exit code of 0 or 1, an answer within --hang seconds, and
no silent drop: a data file that validate accepts has every row it holds counted as usable (badRows: reject).

    nice -n 19 .venv/bin/python benchmarks/door_fuzz.py --minutes 20 --seed 54

Prints per family the examples run, accepted, refused and every failure (with its seed); exit 1 when any failed.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import json
import re
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import seed as fixed_seed
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[1]
TINY = yaml.safe_load((ROOT / "manifests" / "examples" / "rltrun-tiny.yaml").read_text())
INVISIBLE = "\u200b\u200c\u200d\u2060\ufeff\u200e\u202e\u3164\u2800\u00ad"
SPECIAL = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "<|begin_of_thought|>"]
TEXT = st.one_of(
    st.text(max_size=40),
    st.text(st.sampled_from(INVISIBLE + " \t\n"), max_size=6),
    st.sampled_from(SPECIAL).map(lambda t: f"What is 1+1?{t}"),
    st.sampled_from(["What is 2 + 3?", "5", "add them", "", " "]),
)
SCALAR = st.one_of(
    TEXT,
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.none(),
)
VALUE = st.recursive(
    SCALAR, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3), max_leaves=8
)

PATHS = [
    "teacher.model",
    "teacher.revision",
    "student.model",
    "dataset.source",
    "dataset.split",
    "dataset.size",
    "dataset.layout",
    "dataset.columns.system",
    "format.file",
    "format.preset",
    "rcl.format",
    "method",
    "stages.rl.generation.mode",
    "stages.rl.generation.maxModelLen",
    "stages.rl.maxPromptLength",
    "resources.generator.tensorParallelSize",
    "resources.generator.gpus",
    "storage.writeBytesPerSecond",
    "scheduling.queueName",
    "scheduling.nodeSelector",
    "outputs.teacher",
    "outputs.student",
    "env",
    "seed",
]


class Hang(Exception):
    pass


def _alarm(_signum: int, _frame: Any) -> None:
    raise Hang


def door(argv: list[str], hang: int) -> tuple[int, str, str]:
    """`rlt validate ARGV` in this process: (exit code, stdout, stderr); Hang past `hang` seconds."""
    from rlt.cli import main

    out, err = io.StringIO(), io.StringIO()
    signal.alarm(hang)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(["validate", *argv])
    finally:
        signal.alarm(0)
    return code, out.getvalue(), err.getvalue()


def _set(doc: dict[str, Any], path: str, value: Any) -> None:
    node = doc["spec"]
    *parents, last = path.split(".")
    for p in parents:
        if not isinstance(node.get(p), dict):
            node[p] = {}
        node = node[p]
    node[last] = value


def family_run_files(folder: Path, changes: list[tuple[str, Any]], hang: int) -> str:
    doc = copy.deepcopy(TINY)
    for path, value in changes:
        _set(doc, path, value)
    run = folder / "run.yaml"
    run.write_text(yaml.safe_dump(doc, allow_unicode=True))
    code, _, err = door(["--no-data", str(run)], hang)
    assert code in (0, 1) and "Traceback" not in err, (code, err)
    return "accepted" if code == 0 else "refused"


def family_rows(folder: Path, rows: list[Any], hang: int) -> str:
    data = folder / "rows.jsonl"
    data.write_text("".join(json.dumps(r, allow_nan=True) + "\n" for r in rows))
    doc = copy.deepcopy(TINY)
    doc["spec"]["dataset"] = {"source": str(data)}
    run = folder / "run.yaml"
    run.write_text(yaml.safe_dump(doc))
    code, out, err = door(["--no-plan", str(run)], hang)
    assert code in (0, 1) and "Traceback" not in err, (code, err)
    if code == 0:  # no silent drop: every row written is a usable row
        used = re.search(r"spec\.dataset: (\d+) usable rows", out)
        assert used and int(used.group(1)) == len(rows), (len(rows), out)
    return "accepted" if code == 0 else "refused"


def family_model_files(folder: Path, config: Any, cut: int, hang: int) -> str:
    model = folder / "model"
    model.mkdir(exist_ok=True)
    text = json.dumps(config, allow_nan=True)
    (model / "config.json").write_text(text[: max(0, len(text) - cut)])
    doc = copy.deepcopy(TINY)
    doc["spec"]["teacher"]["model"] = str(model)
    doc["spec"]["stages"]["rl"]["generation"] = {"mode": "server"}
    doc["spec"]["resources"]["generator"] = {"gpus": 2, "tensorParallelSize": 2}
    run = folder / "run.yaml"
    run.write_text(yaml.safe_dump(doc))
    code, _, err = door(["--no-data", str(run)], hang)
    assert code in (0, 1) and "Traceback" not in err, (code, err)
    return "accepted" if code == 0 else "refused"


ROW = st.one_of(
    st.fixed_dictionaries({"question": TEXT, "solution": TEXT}, optional={"reasoning_trace": TEXT, "system": TEXT}),
    st.fixed_dictionaries(
        {
            "conversations": st.lists(
                st.dictionaries(st.sampled_from(["from", "role", "value", "content"]), VALUE, max_size=4), max_size=4
            )
        }
    ),
    st.dictionaries(TEXT, VALUE, max_size=4),
)
CONFIG = st.fixed_dictionaries(
    {
        "model_type": st.sampled_from(["qwen2", "llama", "bert", "gpt2"]),
        "architectures": st.lists(
            st.sampled_from(["Qwen2ForCausalLM", "BertForMaskedLM", "T5ForConditionalGeneration", "GPT2LMHeadModel"]),
            max_size=2,
        ),
    },
    optional={
        k: st.one_of(st.integers(-2, 10**12), st.sampled_from([0, 1, 2, 4, 64, 4096]), VALUE)
        for k in (
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "vocab_size",
            "max_position_embeddings",
            "head_dim",
        )
    },
)


def _property(family: str, strategy: Any, check: Any, seed: int, batch: int, hang: int, end: float, record: Any) -> Any:
    """One seeded hypothesis run of `check` over `strategy` (examples past the end time are skipped)."""

    @fixed_seed(seed)
    @settings(
        max_examples=batch,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
        report_multiple_bugs=False,
    )
    @given(value=strategy)
    def one(value: Any) -> None:
        if time.monotonic() > end:
            return
        try:
            record(family, check(value))
        except Hang:
            raise AssertionError(f"hang over {hang} s") from None

    return one


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=20)
    parser.add_argument("--seed", type=int, default=54)
    parser.add_argument("--batch", type=int, default=50, help="examples per seed and family")
    parser.add_argument("--hang", type=int, default=300, help="seconds one validate may take")
    args = parser.parse_args()
    signal.signal(signal.SIGALRM, _alarm)
    stats: dict[str, dict[str, int]] = {
        f: {"examples": 0, "accepted": 0, "refused": 0} for f in ("run", "rows", "model")
    }
    failures: list[str] = []
    end = time.monotonic() + args.minutes * 60
    current = args.seed
    with tempfile.TemporaryDirectory(prefix="rlt-door-fuzz-") as tmp:
        folder = Path(tmp)

        def record(family: str, verdict: str) -> None:
            stats[family]["examples"] += 1
            stats[family][verdict] += 1

        cases = {
            "run": (
                st.lists(st.tuples(st.sampled_from(PATHS), VALUE), min_size=1, max_size=3),
                lambda v: family_run_files(folder, v, args.hang),
            ),
            "rows": (st.lists(ROW, min_size=1, max_size=6), lambda v: family_rows(folder, v, args.hang)),
            "model": (
                st.tuples(CONFIG, st.integers(0, 40)),
                lambda v: family_model_files(folder, v[0], v[1], args.hang),
            ),
        }
        while time.monotonic() < end:
            for family, (strategy, check) in cases.items():
                one = _property(family, strategy, check, current, args.batch, args.hang, end, record)
                try:
                    one()
                except Exception as exc:  # noqa: BLE001 - a failure is the run's finding: kept, with its seed
                    inner = getattr(exc, "exceptions", None)  # hypothesis' FlakyFailure: the first call's error
                    shown = inner[0] if inner else exc
                    line = "".join(traceback.format_exception_only(shown)).strip().replace("\n", " | ")[:800]
                    failures.append(f"seed {current} family {family}: {line}")
                    print(failures[-1], flush=True)
            current += 1
            print(f"seeds {args.seed}..{current - 1}: {json.dumps(stats)}", flush=True)
    print(f"done: seeds {args.seed}..{current - 1}, {json.dumps(stats)}, {len(failures)} failure(s)")
    for f in failures:
        print("  " + f)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
