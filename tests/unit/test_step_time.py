"""What a preemption costs, from the plan (rlt.checks.step_time): a paper-scale GRPO step takes tens of minutes, so
the plan says the step and save times, warns when saveSteps × step is far past the interval that costs least or when
the grace period cannot cover a stop at a micro-batch boundary plus a save, and the sized examples heed it."""

from __future__ import annotations

import pytest
import yaml
from suite_helpers import EXAMPLES

from rlt.checks.capacity import plan_for_run
from rlt.checks.step_time import checkpoint_interval
from rlt.cli import main
from rlt.spec.loading import parse_run

SIZED = [
    "rltrun-paper-7b.yaml",
    "rltrun-multinode.yaml",
    "rltrun-2x8.yaml",
    "rltrun-small-2gpu.yaml",
    "rltrun-lora-tracked.yaml",
]


def _doc(name="rltrun-paper-7b.yaml"):
    return yaml.safe_load((EXAMPLES / name).read_text())


@pytest.mark.parametrize("name", SIZED)
def test_sized_examples_save_often_enough_and_give_a_stop_its_grace(name):
    plan = plan_for_run(parse_run(_doc(name)).spec)
    assert plan.stopping and plan.warnings == [], plan.warnings


def test_the_paper_step_is_tens_of_minutes_and_25_save_steps_are_flagged_with_the_fix():
    doc = _doc()
    doc["spec"]["stages"]["rl"]["saveSteps"] = 25
    doc["spec"]["resources"]["trainer"]["terminationGracePeriodSeconds"] = 600
    plan = plan_for_run(parse_run(doc).spec)
    rl = next(line for line in plan.stopping if line.startswith("rl: one step ≈ "))
    minutes = float(rl.removeprefix("rl: one step ≈ ").split(" min")[0])
    assert 15 < minutes < 60, rl  # the review's estimate from FLOPs and decode rates: 20-45 min on 2 × 8 H100
    save = next(w for w in plan.warnings if "saveSteps 25" in w)
    suggested = int(save.rsplit("stages.rl.saveSteps: ", 1)[1])
    assert 2 <= suggested <= 10  # Young's interval for a ~8 min save and one loss a day: ~2.5 h of steps
    assert suggested * minutes * 60 <= 2 * checkpoint_interval(8 * 60 + 60)
    assert any(
        "grace period, 600 s (resources.trainer.terminationGracePeriodSeconds), is below" in w for w in plan.warnings
    ), plan.warnings


def test_a_model_the_operator_cannot_size_gets_600_s_and_the_plan_says_what_to_set(tmp_path):
    """The plan reads any model's config (here a local folder: Qwen2.5-7B's config.json, no weights); the operator
    only the published shapes it carries. Where they part, the pods get 600 s and the plan warns with the value."""
    import json

    from rlt.checks.model_shape import KNOWN_CONFIGS

    folder = tmp_path / "my-7b"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(KNOWN_CONFIGS["Qwen/Qwen2.5-7B-Instruct"]))
    doc = _doc()
    doc["spec"]["resources"]["trainer"].pop("terminationGracePeriodSeconds", None)
    doc["spec"]["teacher"]["model"] = str(folder)
    plan = plan_for_run(parse_run(doc).spec)
    assert any(f"grace period: 600 s (the default: {folder} not among the shapes" in x for x in plan.stopping)
    short = [w for w in plan.warnings if "grace period, 600 s (the default" in w]
    assert short and "set resources.trainer.terminationGracePeriodSeconds: 7" in short[0], plan.warnings


def test_rlt_plan_prints_the_stop_costs_and_warns_on_stderr(tmp_path, capsys):
    doc = _doc()
    doc["spec"]["stages"]["rl"]["saveSteps"] = 25
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["plan", str(path)]) == 0  # a warning, not a misfit
    out = capsys.readouterr()
    assert "stopping: rl: one step ≈ " in out.out
    assert "warning: rl: saveSteps 25 × step" in out.err


def test_the_2x8_example_places_and_a_read_write_once_run_over_one_node_is_refused(tmp_path, capsys):
    """2 × 8 GPUs: the trainer on one node, the generator on the other, so the volume must be ReadWriteMany. The
    same run on a ReadWriteOnce volume cannot be placed (every pod on one 8-GPU node): the plan and `rlt validate`
    refuse it, naming storage.accessMode, instead of the gang re-placing forever."""
    from rlt.checks.capacity import capacity_problems

    doc = _doc("rltrun-2x8.yaml")
    res = doc["spec"]["resources"]
    assert res["trainer"]["nodes"] * res["trainer"]["gpus"] == 8 and res["generator"]["gpus"] == 8
    plan = plan_for_run(parse_run(doc).spec)
    assert plan.failures == [] and plan.unplaceable == [] and plan.warnings == [], plan.errors() + plan.warnings
    doc["spec"]["storage"]["accessMode"] = "ReadWriteOnce"
    refused = plan_for_run(parse_run(doc).spec).errors()
    assert any("asks for 16 GPUs" in e and "storage.accessMode: ReadWriteMany" in e for e in refused), refused
    assert capacity_problems(parse_run(doc).spec)  # what `rlt validate` and the pods' preflight report
    path = tmp_path / "rwo.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["plan", str(path)]) == 1
    assert "a ReadWriteOnce volume holds every pod of the run to one node" in capsys.readouterr().err
    doc["spec"]["scheduling"] = {"nodeSelector": {"nvidia.com/gpu.count": "16"}}  # one 16-GPU node: it fits
    assert plan_for_run(parse_run(doc).spec).unplaceable == []
