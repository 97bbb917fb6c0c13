"""The capacity plan's mode table of a colocated run (found by benchmarks/door_fuzz.py, seed 55, run:1180): the plan
prices each server mode by splitting the colocated GPUs between trainer and one generator, whatever generator
resources the file holds for the mode it does not use; a generator of 3 GPUs with tensorParallelSize 3 made that
split a pydantic traceback out of `rlt validate`."""

from __future__ import annotations

import pytest
import yaml
from suite_helpers import EXAMPLES

from rlt.cli import main


@pytest.mark.parametrize(("gpus", "tp"), [(3, 3), (4, 2), (2, 2), (4, 4)])
def test_a_colocated_runs_plan_answers_whatever_its_unused_generator_holds(tmp_path, capsys, gpus, tp):
    doc = yaml.safe_load((EXAMPLES / "rltrun-lora-tracked.yaml").read_text())  # colocated, 2 trainer GPUs
    assert doc["spec"]["stages"]["rl"]["generation"]["mode"] == "colocate"
    doc["spec"]["resources"]["generator"] = {"gpus": gpus, "tensorParallelSize": tp}
    run_file = tmp_path / "run.yaml"
    run_file.write_text(yaml.safe_dump(doc))
    code = main(["validate", "--no-data", str(run_file)])
    out = capsys.readouterr()
    assert code in (0, 1), out
    assert "Traceback" not in out.err
