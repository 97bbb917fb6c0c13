"""Which rows evaluation uses: one answer for the evaluate stage (both methods) and `rlt compare`.

Before this module the question was answered three times and the answers differed; `evaluation_set` keeps one
behaviour for each case:

- `stages.evaluate.dataset` is a benchmark: its rows (`load_benchmark`, normalised question/solution), for both
  methods (rcl read a benchmark's hub id as a plain dataset, with the hub's own column names).
- `stages.evaluate.dataset` is another dataset: its held-out part when it has one (its own `evalFraction`), else
  all its rows. Kept from rcl: the stage rlt used read the *training* part, so an evaluation dataset pointed at the
  training source with the same split evaluated on rows the teacher had trained on.
- no evaluation dataset, `spec.dataset.evalFraction > 0`: the held-out part of spec.dataset (all three agreed).
- no evaluation dataset, no held-out part, a built-in task: fresh problems from the next seed, minus any seen in
  training, 64 unless `stages.evaluate.limit` says otherwise. Kept from rlt's stage (compare restated the 64 on its
  own; rcl refused): the fresh problems are as unseen as held-out rows, so the door's rule needs no method.
- otherwise: a DataError naming both fields to set (the door refuses such a spec before a run).

`stages.evaluate.limit` then cuts the rows, and no rows is a DataError naming the source.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlt.data.benchmarks import find_benchmark, load_benchmark
from rlt.data.dataset import load_data
from rlt.data.errors import DataError
from rlt.method.prompts import PromptFormat
from rlt.spec.run import RLTRunSpec

FRESH_DEFAULT_LIMIT = 64  # fresh built-in problems when stages.evaluate.limit is unset


@dataclass
class EvalSet:
    rows: list[dict[str, Any]]
    answer_type: str  # math | choice | builtin
    source: str


def resolve_answer_type(requested: str, source: str) -> str:
    if requested != "auto":
        return requested
    bench = find_benchmark(source)
    if bench is not None:
        return bench.answer
    return "builtin" if source.startswith("builtin:") else "math"


def _rows(spec: RLTRunSpec, fmt: PromptFormat) -> tuple[list[dict[str, Any]], str]:
    st = spec.stages.evaluate
    if st.dataset is not None:
        bench = find_benchmark(st.dataset.source)
        if bench is not None:
            return load_benchmark(bench, st.dataset.revision, st.limit), st.dataset.source
        data = load_data(st.dataset, fmt)
        return data.eval or data.train, st.dataset.source
    if spec.dataset.eval_fraction > 0:
        return load_data(spec.dataset, fmt).eval, f"{spec.dataset.source} (held out)"
    if spec.dataset.source.startswith("builtin:"):
        seen = {r["question"] for r in load_data(spec.dataset, fmt).train}
        limit = st.limit or FRESH_DEFAULT_LIMIT
        fresh = spec.dataset.model_copy(
            update={"seed": spec.dataset.seed + 1, "limit": None, "size": max(spec.dataset.size, 4 * limit)}
        )
        rows = [r for r in load_data(fresh, fmt).train if r["question"] not in seen][:limit]
        return rows, f"{spec.dataset.source} seed {fresh.seed} (unseen in training)"
    raise DataError(
        "stages.evaluate.dataset: not set, and spec.dataset.evalFraction is 0 (no held-out rows); set one of them"
    )


def evaluation_set(spec: RLTRunSpec, fmt: PromptFormat) -> EvalSet:
    """The evaluation questions of run spec `spec` (rows read with prompt format `fmt`'s tags); see the module."""
    rows, source = _rows(spec, fmt)
    st = spec.stages.evaluate
    rows = rows[: st.limit]
    if not rows:
        raise DataError(f"stage evaluate: {source} gave no questions")
    return EvalSet(
        rows, resolve_answer_type(st.answer_type, st.dataset.source if st.dataset else spec.dataset.source), source
    )
