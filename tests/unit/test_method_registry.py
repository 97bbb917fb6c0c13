"""The method table (rlt.contract.method_registry) is the one place that knows the teaching methods.

A dummy method, one row built here and registered for the test, goes through the door (the spec model and the
validators), the stage dispatch, the fingerprint, `rlt compare`'s and `rlt eval`'s refusals and a local run, with
no other file changed. A suite check counts comparisons against a method's name outside the table.
"""

from __future__ import annotations

import argparse
import ast
import json
from pathlib import Path

import pytest
import yaml
from suite_helpers import deep_merge, tiny_doc

from rlt.contract import method_registry as methods
from rlt.contract.method_registry import METHODS, MethodInfo
from rlt.contract.stage_registry import STAGE_ORDER, method_stages, stage_function
from rlt.spec.loading import SpecError

REPO = Path(__file__).resolve().parents[2]
CALLS: list[tuple[str, str]] = []  # (what, detail) the dummy method's functions were called with


def run_dummy_sft(ctx) -> str:
    CALLS.append(("stage", "sft"))
    out = ctx.layout.root / "dummy-sft.txt"
    out.write_text(f"method {ctx.spec.method}\n")
    return str(out)


def run_dummy_evaluate(ctx) -> str:
    CALLS.append(("stage", "evaluate"))
    return str(ctx.layout.root)


def check_dummy_format(spec, local_files: bool = True) -> None:
    CALLS.append(("format", spec.format.preset))
    if spec.format.preset != "default":
        raise ValueError(f"no dummy prompts in {spec.format.preset!r}")


DUMMY = MethodInfo(
    "dummy",
    stages=("sft", "evaluate"),
    stage_functions=f"{__name__}:run_dummy_{{stage}}",
    format_check=f"{__name__}:check_dummy_format",
    format_field="spec.format.preset",
    settings="rcl",  # a dummy reusing rcl's settings block: they shape its fingerprint
)


@pytest.fixture
def dummy(monkeypatch):
    CALLS.clear()
    monkeypatch.setitem(METHODS, "dummy", DUMMY)
    return DUMMY


def dummy_doc(**patch) -> dict:
    doc = tiny_doc()
    doc["spec"]["method"] = "dummy"
    # the dummy has sft and evaluate; the tiny example enables rl and distill
    doc["spec"]["stages"] = deep_merge(doc["spec"]["stages"], {"rl": {"enabled": False}, "distill": {"enabled": False}})
    return deep_merge(doc, patch)


def test_a_registered_method_passes_the_door_and_its_format_check_runs(dummy):
    from rlt.checks.validation import validate_spec

    spec = validate_spec(dummy_doc()["spec"], name="tiny", local_files=True)
    assert spec.method == "dummy"
    assert ("format", "default") in CALLS  # the door asked the dummy's row how to check its format
    with pytest.raises(SpecError) as err:
        validate_spec(dummy_doc(spec={"format": {"preset": "rcl-default"}})["spec"], name="tiny", local_files=True)
    assert "spec.format.preset: not a usable dummy format (no dummy prompts in 'rcl-default')" in str(err.value)


def test_a_registered_method_runs_only_its_own_stages(dummy):
    from rlt.checks.validation import validate_spec

    with pytest.raises(SpecError) as err:
        validate_spec(dummy_doc(spec={"stages": {"rl": {"enabled": True}}})["spec"], name="tiny")
    assert "stages: method dummy has no rl stage; set stages.rl.enabled: false (dummy runs sft, evaluate)" in str(
        err.value
    )
    assert method_stages("dummy") == ("sft", "evaluate")
    assert stage_function("sft", "dummy") is run_dummy_sft
    with pytest.raises(ValueError, match=r"method dummy has no stage 'distill' \(stages: sft, evaluate\)"):
        stage_function("distill", "dummy")


def test_an_unregistered_method_is_refused_naming_the_table():
    from rlt.checks.validation import validate_spec

    doc = tiny_doc()
    doc["spec"]["method"] = "dummy"
    with pytest.raises(SpecError) as err:
        validate_spec(doc["spec"], name="tiny")
    assert "spec.method: unknown teaching method 'dummy' (methods: rlt, rcl)" in str(err.value)


def test_a_methods_settings_field_shapes_every_stage_fingerprint(dummy):
    from rlt.checks.validation import validate_spec
    from rlt.spec.fingerprint import stage_fields

    spec = validate_spec(dummy_doc()["spec"], name="tiny")
    assert any(k.startswith("rcl.") for k in stage_fields(spec, "sft"))
    plain = validate_spec(tiny_doc()["spec"], name="tiny")  # method rlt has no settings field
    assert not any(k.startswith("rcl.") for k in stage_fields(plain, "sft"))


def test_compare_and_eval_ask_the_row(dummy, tmp_path, capsys):
    from rlt.cli.run_commands import cmd_eval
    from rlt.contract.exitcodes import ExitCode
    from rlt.run.compare import compare_stages
    from rlt.spec.loading import parse_run

    run = parse_run(dummy_doc(), "dummy")
    with pytest.raises(SpecError, match="spec.method: 'dummy' cannot be compared"):
        compare_stages(run)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(dummy_doc()))
    args = argparse.Namespace(file=str(path), output=str(tmp_path), teacher=None, label=None, device="cpu")
    assert cmd_eval(args) == ExitCode.CONFIG_ERROR
    assert "this run has method dummy" in capsys.readouterr().err


def test_a_registered_method_runs_locally_through_the_table(dummy, tmp_path):
    from rlt.run.runner import run_local
    from rlt.spec.loading import parse_run

    run = parse_run(dummy_doc(spec={"stages": {"evaluate": {"enabled": False}}}), "dummy")
    summary = run_local(run, tmp_path, metrics_port=None, device="cpu", show_progress=False)
    assert ("stage", "sft") in CALLS
    assert (tmp_path / "tiny" / "dummy-sft.txt").read_text() == "method dummy\n"
    assert json.dumps(summary)  # the run's summary names the stage the dummy ran
    assert "sft" in json.dumps(summary)


# --------------------------------------------------------------------------- the suite check


def method_name_comparisons(root: Path) -> list[str]:
    """Every comparison against a method's name (a string constant of the table, alone or in a tuple/list/set),
    and every CEL rule that reads self.method, under the shipped packages, outside the table itself."""
    names = set(methods.METHOD_NAMES)
    table = REPO / "training/rlt/contract/method_registry.py"
    found = []
    for base in ("training/rlt", "operator/rlt_operator"):
        for path in sorted((root / base).rglob("*.py")):
            if path.resolve() == table:
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                where = f"{path.relative_to(root)}:{getattr(node, 'lineno', 0)}"
                if isinstance(node, ast.Compare):
                    for side in [node.left, *node.comparators]:
                        items = side.elts if isinstance(side, ast.Tuple | ast.List | ast.Set) else [side]
                        if any(isinstance(i, ast.Constant) and i.value in names for i in items):
                            found.append(where)
                            break
                elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "self.method" in node.value:
                    found.append(where)
    return found


def test_no_module_but_the_table_compares_a_methods_name():
    found = method_name_comparisons(REPO)
    assert found == [], "branch on the method's row (rlt.contract.method_registry), not its name: " + ", ".join(found)


def test_the_count_sees_a_branch_on_a_methods_name(tmp_path):
    # the check itself: a planted branch is counted (the scan is not vacuous)
    pkg = tmp_path / "training/rlt"
    pkg.mkdir(parents=True)
    (tmp_path / "operator/rlt_operator").mkdir(parents=True)
    (pkg / "x.py").write_text('def f(spec):\n    return spec.method == "rcl" or spec.method in ("rlt",)\n')
    (pkg / "y.py").write_text("RULE = \"self.method == 'rlt'\"\n")
    assert method_name_comparisons(tmp_path) == ["training/rlt/x.py:2", "training/rlt/x.py:2", "training/rlt/y.py:1"]


def test_every_row_names_stages_and_functions_that_are_there():
    for name, row in METHODS.items():
        assert row.name == name
        assert row.stages is None or set(row.stages) <= set(STAGE_ORDER), name
        for ref in (row.format_check, *(filter(None, [row.teaching_eval]))):
            assert callable(methods.load_function(ref)), ref
