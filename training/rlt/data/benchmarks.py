"""Known reasoning benchmarks (AIME 2024, MATH-500, GPQA Diamond) as data: rlt/data/benchmarks.yaml maps each
one's hub id, split and columns onto question / solution / reasoning_trace and names its answer type."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from rlt.data.errors import DataError
from rlt.data.sources import first_line

BENCHMARKS_FILE = Path(__file__).parent / "benchmarks.yaml"
LETTERS = "ABCDEFGHIJ"


@dataclass(frozen=True)
class Benchmark:
    name: str
    hub_id: str
    split: str
    answer: str  # math | choice
    columns: dict[str, str]
    config: str | None = None
    choices: dict[str, Any] = field(default_factory=dict)


@lru_cache(maxsize=1)
def benchmarks() -> dict[str, Benchmark]:
    data = yaml.safe_load(BENCHMARKS_FILE.read_text())
    return {
        name: Benchmark(
            name=name,
            hub_id=b["hubId"],
            split=b["split"],
            answer=b["answer"],
            columns=b["columns"],
            config=b.get("config"),
            choices=b.get("choices") or {},
        )
        for name, b in data.items()
    }


def find_benchmark(source: str) -> Benchmark | None:
    """The benchmark named by a short name (math500), `benchmark:<name>` or its hub id; None for anything else."""
    key = source.removeprefix("benchmark:")
    for b in benchmarks().values():
        if key.lower() in (b.name, b.hub_id.lower()):
            return b
    if source.startswith("benchmark:"):
        raise DataError(f"stages.evaluate.dataset.source: unknown benchmark {key!r} (known: {', '.join(benchmarks())})")
    return None


def benchmark_row(raw: dict[str, Any], bench: Benchmark, index: int) -> dict[str, Any]:
    """One benchmark row as {question, solution, reasoning_trace, row}; choice questions get lettered options."""
    cols = bench.columns
    missing = [c for c in [cols["question"], cols.get("solution")] if c and c not in raw]
    if bench.answer == "choice":
        missing += [c for c in [bench.choices["correct"], *bench.choices["incorrect"]] if c not in raw]
    if missing:
        raise DataError(
            f"{bench.hub_id} row {index}: column(s) {', '.join(missing)} missing (columns: {', '.join(sorted(raw))})"
        )
    question = str(raw[cols["question"]]).strip()
    trace = raw.get(cols["reasoningTrace"]) if cols.get("reasoningTrace") else None
    if bench.answer == "choice":
        options = [str(raw[bench.choices["correct"]]).strip()] + [
            str(raw[c]).strip() for c in bench.choices["incorrect"]
        ]
        order = list(range(len(options)))
        random.Random(f"rlt-choices-{bench.name}-{index}").shuffle(order)
        lines = [f"{LETTERS[k]}. {options[j]}" for k, j in enumerate(order)]
        question = question + "\n\n" + "\n".join(lines) + "\n\nAnswer with the letter of the correct option."
        solution = LETTERS[order.index(0)]
    else:
        solution = str(raw[cols["solution"]]).strip()
    return {"question": question, "solution": solution, "reasoning_trace": trace, "row": index}


def load_benchmark(bench: Benchmark, revision: str | None = None, limit: int | None = None) -> list[dict[str, Any]]:
    import datasets  # the hub: clusters only

    try:
        ds = datasets.load_dataset(bench.hub_id, bench.config, split=bench.split, revision=revision)
    except Exception as err:  # noqa: BLE001 - the boundary: the hub's or the reader's failure in one line
        raise DataError(
            f"{bench.hub_id} (benchmark {bench.name}): cannot be read ({type(err).__name__}: {first_line(err)})"
        ) from None
    rows = []
    for i, raw in enumerate(ds):
        rows.append(benchmark_row(raw, bench, i))
        if limit and len(rows) >= limit:
            break
    return rows
