"""A cluster run reads its files inside the trainer pod: a path on the user's machine is refused at the door (the
operator and `rlt validate --server`) with one line that says so and how to get the file there; `rlt validate` on a
pod's path that is not on this machine says how to check the rest."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from suite_helpers import tiny_doc

from rlt.checks.validation import pod_path_problems, validate_spec
from rlt.spec.loading import SpecError, parse_spec


def spec_with(**parts):
    doc = tiny_doc()
    for dotted, value in parts.items():
        holder = doc["spec"]
        *path, last = dotted.split("__")
        for key in path:
            holder = holder.setdefault(key, {})
        holder[last] = value
    return doc["spec"]


@pytest.mark.parametrize(
    ("parts", "field"),
    [
        ({"dataset": {"source": "units.jsonl"}}, "spec.dataset.source"),
        ({"dataset": {"source": "./data/units"}}, "spec.dataset.source"),
        ({"dataset": {"source": "~/units.parquet"}}, "spec.dataset.source"),
        ({"teacher": {"model": "./my-teacher"}}, "spec.teacher.model"),
        ({"format": {"file": "format.yaml"}}, "spec.format.file"),
        ({"stages__evaluate__dataset": {"source": "../heldout.csv"}}, "spec.stages.evaluate.dataset.source"),
    ],
)
def test_a_path_on_the_users_machine_is_refused_in_the_cluster_with_the_way_to_the_pod(parts, field):
    raw = spec_with(**parts)
    with pytest.raises(SpecError) as refused:
        validate_spec(raw, "laptop")  # the operator's entry point (no local files)
    said = [p for p in refused.value.problems if p.startswith(field + ":")]
    assert len(said) == 1, refused.value.problems
    assert "inside the trainer pod" in said[0] and "/data/" in said[0] and "hub id" in said[0]


@pytest.mark.parametrize(
    "parts",
    [
        {"dataset": {"source": "/data/datasets/units.jsonl"}},  # a path in the pod (the run's volume)
        {"dataset": {"source": "bespokelabs/Bespoke-Stratos-17k"}},  # a hub id
        {"dataset": {"source": "s3://bucket/units.jsonl"}},
        {"teacher": {"model": "Qwen/Qwen2.5-0.5B-Instruct"}},
        {"teacher": {"model": "/data/models/teacher"}},
    ],
)
def test_pod_paths_hub_ids_and_urls_are_not_local_paths(parts):
    assert pod_path_problems(parse_spec(spec_with(**parts), "<test>")) == []


def test_validate_says_how_to_check_a_spec_whose_data_is_in_the_pod(tmp_path):
    doc = tiny_doc()
    doc["spec"]["dataset"] = {"source": "/data/datasets/not-here.jsonl"}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(doc))
    out = subprocess.run([sys.executable, "-m", "rlt.cli", "validate", str(path)], capture_output=True, text=True)
    assert out.returncode != 0
    assert "file /data/datasets/not-here.jsonl does not exist here" in out.stdout + out.stderr
    assert "rlt validate --no-data" in out.stdout + out.stderr
    spec_only = subprocess.run(
        [sys.executable, "-m", "rlt.cli", "validate", "--no-data", str(path)], capture_output=True, text=True
    )
    assert spec_only.returncode == 0, spec_only.stdout + spec_only.stderr


LOCAL_EXAMPLE = Path(__file__).resolve().parents[2] / "manifests" / "examples" / "local" / "rltrun-own-data.yaml"


def test_the_own_data_example_runs_locally_from_any_folder_and_is_refused_in_a_cluster(tmp_path):
    """The example that reads a local file: `rlt validate` (what `rlt run` checks first) reads the file beside the
    run file whatever the working directory; the operator's door refuses the same spec with the pod-path line."""
    out = subprocess.run(
        [sys.executable, "-m", "rlt.cli", "validate", str(LOCAL_EXAMPLE)],
        capture_output=True,
        text=True,
        cwd=tmp_path,  # not the example's folder: the path is the run file's, not the shell's
    )
    assert out.returncode == 0, out.stdout + out.stderr
    rows = sum(1 for line in (LOCAL_EXAMPLE.parent / "units.jsonl").read_text().splitlines() if line.strip())
    assert f"{rows} usable rows" in out.stdout + out.stderr, out.stdout + out.stderr
    with pytest.raises(SpecError) as refused:
        validate_spec(yaml.safe_load(LOCAL_EXAMPLE.read_text())["spec"], "own-data-local")
    assert any(
        p.startswith("spec.dataset.source: units.jsonl is a path on your machine") for p in refused.value.problems
    ), refused.value.problems
