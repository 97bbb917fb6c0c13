"""The stage table carries the data flow (issue 55): a stage inserted before `student` that produces the
distillation dataset, added as one table row and its own modules, is what the student trains on, what
spec.outputs.distillDataset pushes, what the operator's status names and what `rlt compare` distils from — with no
other file changed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from suite_helpers import ROOT, tiny_doc

# The filter stage's modules, kept outside rlt as a plugin's stage would be: its settings, its plan terms and its
# function, which reads its input and writes its product through the table's one lookup.
SETTINGS = '''
from pydantic import Field

from rlt.spec.stage_settings import StageSettings


class FilterStage(StageSettings):
    """Drops distillation rows whose explanation's reward is below a threshold (tests/unit/test_stage_data_flow.py)."""

    enabled: bool = Field(False, description="Run this stage.")
    min_reward: float = Field(0.5, description="Keep rows rewarded at least this.")
'''
TERMS = """
from rlt.checks.plan_terms import StagePlan


class FilterTerms:
    def plan(self, spec, shapes, at, plan):
        return StagePlan(0, (0, 0))

    def step_time(self, spec, shapes, gpu, prompts, gpu_memory):
        return None

    def step_models(self, spec):
        return set()


TERMS = FilterTerms()
"""
RUN = """
from rlt.contract.layout import atomic_write_text
from rlt.data.jsonl import read_jsonl, write_jsonl


def run_filter(ctx):
    source = ctx.layout.input_of("filter", "dataset", ctx.spec.stages.enabled())
    rows = [r for r in read_jsonl(source) if r["reward"] >= ctx.spec.stages.filter.min_reward]
    out = ctx.layout.product("filter")
    write_jsonl(out, rows)
    atomic_write_text(ctx.layout.stage_done("filter"), "done\\n")
    return str(out)
"""
# The row inserted before `student`, before anything reads the table: what editing contract/stage_registry.STAGES
# does. Then distill's output is laid down by hand (rewards 0.9, 0.1, 0.8, 0.2), and filter and student run.
SCRIPT = """
import json, sys, traceback
sys.path.insert(0, sys.argv[1])
import rlt.contract.stage_registry as table

row = table.StageInfo("filter", "dataset", None, False, False, "filter", consumes=("dataset",),
                      settings="filter_settings:FilterStage", terms="filter_terms", function="filter_run:run_filter")
at = table.STAGE_ORDER.index("student")
table.STAGES = table.STAGES[:at] + (row,) + table.STAGES[at:]
table.STAGE_ORDER = tuple(s.name for s in table.STAGES)
table._BY_NAME[row.name] = row

from rlt.contract.layout import RunLayout, atomic_write_text
from rlt.data.jsonl import read_jsonl, write_jsonl
from rlt.spec import fingerprint
from rlt.spec.loading import parse_run

out = {}
doc = json.loads(sys.argv[2])
run = parse_run(doc)
layout = RunLayout.for_run(sys.argv[1] + "/results", run.name)
rows = []
for i, reward in enumerate((0.9, 0.1, 0.8, 0.2)):
    q, s = f"What is {i} + 1?", str(i + 1)
    rows.append({"question": q, "solution": s, "reasoning_trace": f"{i} and one more is {i + 1}.", "reward": reward,
                 "closed": True, "source_row": i, "candidates": [],
                 "messages": [{"role": "system", "content": "Think."}, {"role": "user", "content": q},
                              {"role": "assistant", "content": f"{i} and one more is {i + 1}. Answer: {s}"}]})
write_jsonl(layout.stage_dir("distill") / "dataset.jsonl", rows)
fingerprint.record(layout, run.spec, "distill")
atomic_write_text(layout.stage_done("distill"), "done\\n")


def part(name, fn):
    try:
        out[name] = fn()
    except Exception:
        out[name] = "ERROR " + traceback.format_exc(limit=3)


def train():
    from rlt.run.runner import run_local

    run_local(run, sys.argv[1] + "/results", metrics_port=None, only=["filter", "student"], device="cpu",
              show_progress=False)
    report = json.loads(layout.student_dataset_report.read_text())
    return [r["source_row"] for r in report["rows"]]


def pushed():
    return [r["source_row"] for r in read_jsonl(sys.argv[1] + "/pushed/dataset.jsonl")]


def status():
    from rlt_operator.builders.common import outputs

    return outputs(run.name, run.spec, ["distill", "filter"])


def compare():
    from rlt.run.compare import Compare

    both = json.loads(sys.argv[2])  # compare's two teachers come from sft and rl
    both["spec"]["stages"]["sft"]["enabled"] = both["spec"]["stages"]["rl"]["enabled"] = True
    cmp = Compare(parse_run(both), sys.argv[1] + "/cmp", "cpu", False)
    both["spec"]["stages"]["filter"]["enabled"] = False  # a file that disables it: compare runs without it
    off = Compare(parse_run(both), sys.argv[1] + "/cmp-off", "cpu", False)
    return {"stages": cmp.arm_stages, "rows": str(cmp.distilled("rl_teacher")), "off": off.arm_stages["rl_teacher"]}


part("student_rows", train)
part("pushed_rows", pushed)
part("status", status)
part("compare", compare)
print("RESULT " + json.dumps(out))
"""

STUDENT = {
    "enabled": True,
    "maxSteps": 1,
    "batchSize": 2,
    "perDeviceBatchSize": 2,
    "learningRate": 1.0e-3,
    "maxLength": 400,
    "gradientCheckpointing": False,
}


@pytest.mark.slow
def test_a_dataset_stage_before_student_is_what_the_student_outputs_status_and_compare_use(tmp_path: Path) -> None:
    (tmp_path / "filter_settings.py").write_text(SETTINGS)
    (tmp_path / "filter_terms.py").write_text(TERMS)
    (tmp_path / "filter_run.py").write_text(RUN)
    doc = tiny_doc()
    doc["metadata"]["name"] = "tiny-filter"
    doc["spec"]["stages"]["sft"]["enabled"] = False
    doc["spec"]["stages"]["rl"]["enabled"] = False
    doc["spec"]["stages"]["filter"] = {"enabled": True, "minReward": 0.5}
    doc["spec"]["stages"]["student"] = STUDENT
    doc["spec"]["outputs"] = {"distillDataset": f"file://{tmp_path}/pushed"}
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path), json.dumps(doc)],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": f"{ROOT / 'training'}:{ROOT / 'operator'}", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
        timeout=600,
    )
    result = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and result, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = json.loads(result[0].removeprefix("RESULT "))
    # the student trained on the filter's rows (rewards >= 0.5), not on distill's four
    assert out["student_rows"] == [0, 2], out
    # spec.outputs.distillDataset pushed the filter's file
    assert out["pushed_rows"] == [0, 2], out
    # the operator's status names the filter's file, and its pushed copy
    status = out["status"]
    assert isinstance(status, dict), status
    assert status["distilledDataset"] == "/data/tiny-filter/filter/dataset.jsonl"
    assert status["distilledDatasetUri"] == f"file://{tmp_path}/pushed/dataset.jsonl"
    # `rlt compare` runs the filter in every arm that distils, and reads the filtered rows
    compare = out["compare"]
    assert isinstance(compare, dict), compare
    assert compare["stages"]["rl_teacher"] == ["sft", "rl", "distill", "filter", "student"]
    assert compare["stages"]["sft_teacher"] == ["sft", "distill", "filter", "student"]
    # the dataset's own traces, for the questions the RL teacher's rows kept, stand in for distill's product
    assert compare["stages"]["dataset_traces"] == ["distill", "student"]
    assert compare["rows"].endswith("/compare/rl_teacher/filter/dataset.jsonl")
    assert compare["off"] == ["sft", "rl", "distill", "student"]


def _typed_fields(model: type, cls: type, path: str) -> list[str]:
    """Every field path under pydantic `model` whose type is `cls` (or cls | None), by the model's own annotations."""
    import typing

    from pydantic import BaseModel

    out = []
    for name, field in model.model_fields.items():
        here = f"{path}.{field.alias or name}"
        kinds = [a for a in typing.get_args(field.annotation) if a is not type(None)] or [field.annotation]
        for kind in kinds:
            if kind is cls:
                out.append(here)
            elif isinstance(kind, type) and issubclass(kind, BaseModel):
                out += _typed_fields(kind, cls, here)
    return out


def test_the_models_and_datasets_a_run_names_are_one_list() -> None:
    """named_models / named_datasets hold every ModelRef and DatasetSpec field of the spec model: a new one that
    is left out of the list fails here (and would escape the door's source, hub-id and data checks)."""
    from rlt.spec.inputs import DatasetSpec, ModelRef
    from rlt.spec.loading import parse_run
    from rlt.spec.run import RLTRunSpec

    models = _typed_fields(RLTRunSpec, ModelRef, "spec")
    datasets = _typed_fields(RLTRunSpec, DatasetSpec, "spec")
    assert "spec.stages.student.model" in models and "spec.stages.evaluate.dataset" in datasets
    doc = tiny_doc()
    for path, value in [(p, {"model": "builtin:tiny-qwen2"}) for p in models] + [
        (p, {"source": "builtin:arithmetic"}) for p in datasets
    ]:
        *parents, last = path.split(".")[1:]
        node = doc["spec"]
        for part in parents:
            node = node.setdefault(part, {})
        node.setdefault(last, value)
    spec = parse_run(doc).spec
    assert sorted(w for w, _, _ in spec.named_models()) == sorted(models)
    assert sorted(w for w, _, _ in spec.named_datasets()) == sorted(datasets)
