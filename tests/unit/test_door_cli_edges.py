"""`rlt validate` and `rlt plan` at the edges a review found (2026-11-30): each input below once ended in a
traceback, a silent fallback or a false line; now each is one line naming the field or flag, or a plan that
holds. The files are the local own-data example and its 24-row units.jsonl, copied and changed one field at a time."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from suite_helpers import EXAMPLES, run_cli, tiny_doc

from rlt.checks.capacity import dataset_rows
from rlt.data.dataset import load_data
from rlt.method.prompts import resolve_format
from rlt.spec.loading import parse_run

OWN_DATA = EXAMPLES / "local" / "rltrun-own-data.yaml"


def own_data(tmp_path: Path, change=None, name: str = "run.yaml") -> Path:
    """The own-data example beside a copy of its rows in tmp_path, with `change(doc)` applied."""
    shutil.copy(OWN_DATA.parent / "units.jsonl", tmp_path / "units.jsonl")
    doc = yaml.safe_load(OWN_DATA.read_text())
    if change:
        change(doc)
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@pytest.mark.parametrize(
    ("rows", "fraction", "limit"),
    [(24, 0.99, None), (24, 0.5, 5), (3, 0.3, None), (100, 0.25, 80), (7, 0.0, 3), (50, 0.1, None)],
)
def test_the_plan_counts_the_training_rows_the_stages_get(tmp_path, rows, fraction, limit):
    """The plan's row count is the split rlt.data.dataset makes: at least one row held out, then the limit (the
    plan once took the limit first and rounded 24 × 0.01 down to no rows, then divided by them)."""
    data = tmp_path / "rows.jsonl"
    data.write_text(
        "".join(
            json.dumps({"question": f"q{i}", "solution": f"s{i}", "reasoning_trace": "t"}) + "\n" for i in range(rows)
        )
    )
    doc = tiny_doc()
    doc["spec"]["dataset"] = {"source": str(data), "evalFraction": fraction, **({"limit": limit} if limit else {})}
    spec = parse_run(doc).spec
    assert dataset_rows(spec) == len(load_data(spec.dataset, resolve_format(spec.format), warn=False).train)


def test_fewer_training_rows_than_one_rl_step_takes_are_refused_at_the_door(tmp_path, capsys):
    """TRL deals rl's questions in whole steps: with fewer usable rows than a step takes, rl would train no step
    (after sft had run). `rlt validate` says so before anything runs."""

    def few_rows(doc):
        doc["spec"]["dataset"] = {"source": "builtin:arithmetic", "size": 3}
        doc["spec"]["stages"]["rl"].update(batchSize=16, numGenerations=4, perDeviceBatchSize=16)

    code, out = run_cli(capsys, "validate", "--no-plan", str(own_data(tmp_path, few_rows)))
    assert code == 1 and "spec.stages.rl.batchSize: a step takes 4 questions" in out and "has 3 usable" in out, out


def test_a_split_that_leaves_no_training_rows_is_refused_and_the_plan_still_holds(tmp_path, capsys):
    def one_row(doc):
        doc["spec"]["dataset"] = {"source": "builtin:arithmetic", "size": 1, "evalFraction": 0.5}

    path = own_data(tmp_path, one_row)
    code, out = run_cli(capsys, "validate", "--no-plan", str(path))
    assert code == 1 and "spec.dataset.evalFraction: 0.5 holds out 1 of builtin:arithmetic's 1 usable rows" in out
    code, out = run_cli(capsys, "plan", str(path))
    assert "Traceback" not in out and "distill layouts: not planned (no training rows: spec.dataset)" in out, out

    def most_held_out(doc):
        doc["spec"]["dataset"]["evalFraction"] = 0.99  # 23 of 24 held out: one row to train on, a valid run

    code, out = run_cli(capsys, "plan", str(own_data(tmp_path, most_held_out)))
    assert code == 0 and "distill layout colocated" in out, out


@pytest.mark.parametrize("label", ["0", "80Gi", "0080.5"])
def test_a_gpu_memory_label_no_node_carries_is_refused_naming_it(tmp_path, capsys, label):
    def select(doc):
        doc["spec"]["scheduling"] = {"nodeSelector": {"nvidia.com/gpu.memory": label}}

    for command in ("validate", "plan"):
        code, out = run_cli(capsys, command, str(own_data(tmp_path, select)))
        assert code == 1 and f"spec.scheduling.nodeSelector: nvidia.com/gpu.memory='{label}' matches no node" in out


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ("abc", "'abc' is not a Kubernetes quantity"),
        ("80GB", "'80GB' is not a Kubernetes quantity"),
        ("", "'' is not a Kubernetes quantity"),
        ("0", "'0' is not a GPU's memory"),
        ("1m", "'1m' is not a GPU's memory"),
        ("1e400", "'1e400' is not a GPU's memory"),
    ],
)
def test_a_gpu_memory_flag_that_is_no_gpus_memory_exits_2_naming_the_flag(tmp_path, capsys, given, says):
    code, out = run_cli(capsys, "plan", f"--gpu-memory={given}", str(own_data(tmp_path)))
    assert code == 2 and f"argument --gpu-memory: {says}" in out, out


def test_the_gpu_memory_flag_is_the_gpu_the_plan_is_for(tmp_path, capsys):
    code, out = run_cli(capsys, "plan", "--gpu-memory=141Gi", str(own_data(tmp_path)))
    assert code == 0 and "capacity plan for 141.0 GiB GPUs" in out


@pytest.mark.parametrize(
    ("parts", "says"),
    [
        ([], "parts: expected an object, got list"),
        ({"peak": []}, "parts.peak: expected an object, got list"),
        ({"grpo": {"save_bytes_per_s": -1}}, "parts.grpo.save_bytes_per_s: -1 is not a number from"),
        ({"driver": {"gpu": "H100", "nvidia_smi": "H100, 0 MiB"}}, "parts.driver.nvidia_smi (MiB): 0 is not"),
        ({"peak": {"bf16_matmul_flops": 1e-300}}, "parts.peak.bf16_matmul_flops: 1e-300 is not a number from"),
        ({"peak": {"bf16_matmul_flops": -5}}, "parts.peak.bf16_matmul_flops: -5 is not a number from"),
        ({"peak": {"bf16_matmul_flops": "fast"}}, "parts.peak.bf16_matmul_flops: 'fast' is not a number from"),
        ({"peak": {"bf16_matmul_flops": True}}, "parts.peak.bf16_matmul_flops: True is not a number from"),
        ({"driver": {"gpu": 7}}, "parts.driver.gpu: expected a GPU name, got 7"),
    ],
)
def test_a_calibration_figure_out_of_range_is_refused_naming_its_field(tmp_path, capsys, parts, says):
    calibration = tmp_path / "check.json"
    calibration.write_text(json.dumps({"parts": parts}))
    code, out = run_cli(capsys, "plan", "--calibration", str(calibration), str(own_data(tmp_path)))
    assert code == 2 and f"rlt plan: --calibration {calibration}: {says}" in out, out


def test_plan_reads_the_rows_beside_the_run_file_from_any_working_directory(tmp_path, capsys, monkeypatch):
    path = own_data(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    code, out = run_cli(capsys, "plan", "../run.yaml")
    assert code == 0 and f"measured on 24 rows of {path.parent / 'units.jsonl'}" in out, out
    assert "distill layouts: not planned" not in out


def test_a_relative_model_folder_that_is_not_there_is_refused(tmp_path, capsys):
    def missing(doc):
        doc["spec"]["teacher"]["model"] = "./no-such-model"

    code, out = run_cli(capsys, "validate", str(own_data(tmp_path, missing)))
    assert code == 1 and f"spec.teacher.model: ./no-such-model: no such folder ({tmp_path}/no-such-model)" in out


@pytest.mark.parametrize(
    ("field", "value", "kept"),
    [
        (("stages", "rl", "numGenerations"), 1, "spec.stages.rl.numGenerations: Input should be greater than 1"),
        (("resources", "trainer", "gpus"), -2, "spec.resources.trainer.gpus: Input should be greater than or equal"),
    ],
)
def test_an_invalid_field_is_the_only_line_not_the_defaults_that_took_its_place(tmp_path, capsys, field, value, kept):
    """batchSize 8 is divisible by the file's numGenerations 4; the line about the default 64 was false."""

    def set_field(doc):
        node = doc["spec"]
        for key in field[:-1]:
            node = node[key]
        node[field[-1]] = value

    code, out = run_cli(capsys, "validate", "--no-data", str(own_data(tmp_path, set_field)))
    problems = [line for line in out.splitlines() if line.startswith("  ")]
    assert code == 1 and len(problems) == 1 and kept in problems[0], out


def test_a_split_of_a_file_is_refused_not_ignored(tmp_path, capsys):
    def split(doc):
        doc["spec"]["dataset"]["split"] = "train[:2]"

    code, out = run_cli(capsys, "validate", "--no-data", str(own_data(tmp_path, split)))
    assert code == 1 and "spec.dataset.split: 'train[:2]': units.jsonl is a file, read whole" in out, out


def test_a_jsonl_whose_first_row_is_a_list_names_that_row_and_skip_drops_it(tmp_path, capsys):
    path = own_data(tmp_path)
    rows = tmp_path / "units.jsonl"
    rows.write_text("[1, 2, 3]\n" + rows.read_text())
    code, out = run_cli(capsys, "validate", "--no-plan", str(path))
    assert code == 1 and "units.jsonl line 1: expected a JSON object, got list" in out, out

    def skip(doc):
        doc["spec"]["dataset"]["badRows"] = "skip"

    path = own_data(tmp_path, skip, "skip.yaml")
    rows.write_text("[1, 2, 3]\n" + rows.read_text())
    code, out = run_cli(capsys, "validate", "--no-plan", str(path))
    assert code == 0 and "24 usable rows; badRows: skip drops 1 of 25" in out, out


def test_two_runs_of_one_name_in_a_file_are_refused(tmp_path, capsys):
    path = own_data(tmp_path)
    path.write_text(path.read_text() + "---\n" + path.read_text())
    code, out = run_cli(capsys, "validate", "--no-data", str(path))
    assert code == 1 and "document 1: metadata.name: 'own-data-local' is document 0's run too" in out, out


def test_the_save_interval_advice_fits_the_stage(tmp_path, capsys):
    """A stage shorter than the least-cost interval saves at its end only: no warning when it already does, and a
    saveSteps of its own length (not 310952) when it saves more often."""
    code, out = run_cli(capsys, "plan", str(own_data(tmp_path)))  # sft: 4 steps, saveSteps 500
    assert code == 0 and "warning: sft: saveSteps" not in out, out
    assert "set stages.rl.saveSteps: 4 (the stage's 4 steps" in out, out  # rl: 4 steps, saveSteps 2


def test_a_sampling_batch_too_large_names_the_fields_that_shrink_it(tmp_path, capsys):
    def huge(doc):
        doc["spec"]["stages"]["distill"]["samplesPerQuestion"] = 10**15

    code, out = run_cli(capsys, "plan", str(own_data(tmp_path, huge)))
    assert code == 1, out
    assert "stages.distill.batchSize × samplesPerQuestion (the sequences sampled at once) or maxNewTokens" in out
    assert "resources.trainer.gpus" not in [line for line in out.splitlines() if "distill" in line][-1]
