"""What a preemption costs, from the plan (rlt.checks.step_time): a paper-scale GRPO step takes tens of minutes, so
the plan says the step and save times, warns when saveSteps × step is far past the interval that costs least or when
the grace period cannot cover a stop at a micro-batch boundary plus a save, and the sized examples heed it."""

from __future__ import annotations

import pytest
import yaml
from suite_helpers import EXAMPLES

from rlt.checks.capacity import plan_for_run
from rlt.checks.step_time import checkpoint_interval, trainer_step_times
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
    # the review's estimate from FLOPs and decode rates: 20-45 min on 2 × 8 H100 in turn; one step off (this
    # example's mode), the longer of the rollout (~11 min) and the trainers' phases (~14 min)
    assert 10 < minutes < 60, rl
    save = next(w for w in plan.warnings if "saveSteps 25" in w)
    suggested = int(save.rsplit("stages.rl.saveSteps: ", 1)[1])
    assert 2 <= suggested <= 10  # Young's interval for a ~2 min blocked save and one loss a day: ~75 min of steps
    assert suggested * minutes * 60 <= 2 * checkpoint_interval(2 * 60, 24 * 3600)  # a 2-min local write
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
    need = max(t.grace for t in trainer_step_times(parse_run(doc).spec, plan.shapes))
    short = [w for w in plan.warnings if "grace period, 600 s (the default" in w]
    assert any(f"set resources.trainer.terminationGracePeriodSeconds: {need}" in w for w in short), plan.warnings


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


def _rl(doc, prompts=None):
    """The rl step of `doc` from the published shapes (pure arithmetic, as the operator sizes it)."""
    from rlt.checks.model_shape import Shapes, known_shape

    spec = parse_run(doc).spec
    shapes = Shapes(known_shape(spec.teacher.model), known_shape(spec.student.model), None)
    return next(t for t in trainer_step_times(spec, shapes, prompts=prompts) if t.stage == "rl")


def test_the_paper_step_counts_real_prompt_lengths_not_max_prompt_length():
    """The update, the passes and the scoring run over prompt + completion: a teacher prompt is 1-2k tokens, not
    the 16k maxPromptLength. Raising the limit changes nothing; a measured prompt changes the step in proportion."""
    from rlt.checks.step_time import DEFAULT_PROMPT_TOKENS, PromptTokens

    doc = _doc()
    # the layers checkpointed are fixed here: the plan's own choice keeps fewer for a longer allowed row (memory)
    doc["spec"]["stages"]["rl"]["uncheckpointedLayers"] = 2
    base = _rl(doc)
    doc["spec"]["stages"]["rl"]["maxPromptLength"] = 32768  # a limit, not the rows' length
    assert _rl(doc).update == pytest.approx(base.update)
    fixed = _doc()
    fixed["spec"]["stages"]["rl"]["uncheckpointedLayers"] = 2  # the plan's own choice varies with the rows' length
    shorter = _rl(fixed, PromptTokens(1024, 1500, "measured"))
    tokens = DEFAULT_PROMPT_TOKENS + 16384 / 2
    assert shorter.update / base.update == pytest.approx((1024 + 16384 / 2) / tokens)
    assert shorter.scoring / base.scoring == pytest.approx((1024 + 16384 / 2) / tokens)


def test_the_update_counts_recompute_imbalance_and_no_old_policy_pass():
    from rlt.checks.step_time import rank_imbalance

    doc = _doc()
    doc["spec"]["stages"]["rl"]["generation"].update(overlap="none", importanceSampling="off")
    base = _rl(doc)
    # rl deals its rows across the 4 ranks by tokens (loss grpo): they still wait a little at every micro-step
    assert base.imbalance == rank_imbalance(4, dealt=True) == pytest.approx(1.07)
    doc["spec"]["stages"]["rl"]["lossType"] = "bnpo"  # a row's weight depends on its micro-batch: no deal
    assert _rl(doc).imbalance == rank_imbalance(4) > 1.4
    del doc["spec"]["stages"]["rl"]["lossType"]
    assert base.update == pytest.approx((base.update_work + base.recompute) * base.imbalance)
    # 2 FLOPs of 6 per parameter, of the checkpointed decoder layers' parameters only (rlt.checks.checkpoint_layers)
    from rlt.checks.model_shape import known_shape

    shape = known_shape(parse_run(doc).spec.teacher.model)
    kept = 2
    doc["spec"]["stages"]["rl"]["uncheckpointedLayers"] = kept
    share = shape.layer_params / shape.params * (shape.layers - kept) / shape.layers
    assert _rl(doc).recompute == pytest.approx(base.update_work * 2 / 6 * share)
    del doc["spec"]["stages"]["rl"]["uncheckpointedLayers"]
    doc["spec"]["stages"]["rl"]["gradientCheckpointing"] = False
    assert _rl(doc).recompute == 0
    assert base.passes_name == "reference pass"  # paper-7b: beta 0.04, importance sampling off
    doc = _doc()
    doc["spec"]["stages"]["rl"]["generation"].update(overlap="none", importanceSampling="tokenTruncate")
    both = _rl(doc)
    # TRL's old-policy pass for its importance ratio is folded into the update's forward (rlt.stages.folded_ratio)
    assert both.passes_name == "reference pass" and both.passes == pytest.approx(base.passes)


def test_the_rollout_is_its_decoding_step_by_step_plus_the_transfer():
    """rlt.checks.decode_tail decodes each engine's rows; the earlier bounds stay beside it. paper-7b's engines
    queue 256 rows for ~100 slots: the rows that start last outlast the throughput bound. One question (64 rows, 16
    an engine, no queue): the batch empties as rows finish, so the longest row ends before it would at the full
    batch's rate, and after it would alone."""
    from rlt.checks.step_time import DECODE_TOKENS_PER_S

    doc = _doc()
    t = _rl(doc)
    assert t.longest_bound == 16384 / DECODE_TOKENS_PER_S and t.transfer > 0 and t.decode is not None
    assert t.rollout == pytest.approx(t.decode.seconds + t.transfer) and t.generating > t.throughput_bound
    doc["spec"]["stages"]["rl"]["batchSize"] = 64
    few = _rl(doc)
    assert few.decode is not None and few.decode.rows == 16 and few.decode.full == 0
    assert 16384 / few.decode.lone_rate < few.generating < few.longest_bound


def test_the_grace_covers_every_phase_before_the_update_and_a_save_and_grows_as_writes_slow():
    """A stop may arrive as a step starts: it waits for the rollout (from the longest allowed completion), the
    scoring, the reference pass and a micro-batch, then saves at the volume's write rate, a plan input."""
    from rlt.checks.step_time import trainer_grace_period

    doc = _doc()
    doc["spec"]["resources"]["trainer"].pop("terminationGracePeriodSeconds", None)
    t = _rl(doc)
    assert t.grace >= t.rollout + t.scoring + t.passes + t.longest_micro + t.save
    assert t.rollout > 9 * 60 and t.scoring > 0 and t.passes > 0  # paper-7b: 16k-token completions, beta 0.04
    assert trainer_grace_period(parse_run(doc).spec)[0] == t.grace  # what the operator gives the pods
    doc["spec"]["storage"]["writeBytesPerSecond"] = "50M"
    slow = _rl(doc)
    assert slow.save - t.save == pytest.approx((t.save - 60) * (100 / 50 - 1))  # 100 MB/s is the default
    assert slow.grace > t.grace and trainer_grace_period(parse_run(doc).spec)[0] == slow.grace
    plan = plan_for_run(parse_run(doc).spec)
    assert "write rate: 50 MB/s (storage.writeBytesPerSecond 50M)" in plan.stopping


def test_a_write_rate_of_nothing_is_refused_naming_the_field():
    from rlt.spec.loading import SpecError

    doc = _doc()
    doc["spec"]["storage"]["writeBytesPerSecond"] = "250M"
    assert parse_run(doc).spec.storage.write_bytes_per_second == "250M"
    doc["spec"]["storage"]["writeBytesPerSecond"] = "0"
    with pytest.raises((SpecError, ValueError), match="writeBytesPerSecond"):
        parse_run(doc)


def test_rlt_plan_prints_the_phases_the_grace_and_the_goodput_of_paper_7b_and_2x8(capsys):
    from rlt.checks.goodput import goodput

    for name, gpus in (("rltrun-paper-7b.yaml", 8), ("rltrun-2x8.yaml", 16)):
        assert main(["plan", str(EXAMPLES / name)]) == 0
        out = capsys.readouterr().out
        assert "stopping: rl: one step ≈ " in out and "the step's decoding at full slots " in out, out
        assert "stopping: write rate: 100 MB/s (the default 100M" in out
        assert "stopping: rl: a stop needs " in out and "+ a save " in out
        line = next(x for x in out.splitlines() if x.startswith("  goodput: rl: "))
        assert f"of the {gpus} GPUs' held GPU-seconds do the algorithm's work" in line, line
        g = goodput(_rl(_doc(name)))
        assert 0.5 < g.share < 0.95 and g.share + sum(v for _, v in g.losses) == pytest.approx(1.0)
        before = goodput(_rl(_doc(name)), asynchronous=False)
        assert before.share < g.share  # the save blocks for its local write only


def test_rlt_plan_measures_the_prompts_where_it_can_read_the_rows(capsys):
    assert main(["plan", str(EXAMPLES / "rltrun-tiny.yaml")]) == 0
    assert "stopping: rl prompts: mean " in (out := capsys.readouterr().out) and "tokens (measured on " in out, out


def test_tensor_parallelism_only_where_one_gpu_cannot_hold_the_model_and_its_kv():
    """A 7B teacher and a KV cache of 100 rows fit one 80 GB GPU: TP2 costs two all-reduces per layer per token
    and halves the schedulers, so the plan warns with TP1 x DP. A 72B teacher needs TP: the plan says how much."""
    doc = _doc("rltrun-2x8.yaml")
    plan = plan_for_run(parse_run(doc).spec)
    assert any(x.startswith("generators: TP1 x DP8 chosen by the plan") for x in plan.generation), plan.generation
    doc["spec"]["resources"]["generator"].update(tensorParallelSize=2, dataParallelSize=4)
    warned = [w for w in plan_for_run(parse_run(doc).spec).warnings if "tensorParallelSize 2" in w]
    assert warned and "Set resources.generator.tensorParallelSize: 1, dataParallelSize: 8" in warned[0], warned
    doc["spec"]["teacher"]["model"] = "Qwen/Qwen2.5-72B-Instruct"
    doc["spec"]["resources"]["generator"].update(tensorParallelSize=1, dataParallelSize=8)
    warned = [w for w in plan_for_run(parse_run(doc).spec).warnings if "tensorParallelSize 1" in w]
    assert warned and "tensorParallelSize: 8, dataParallelSize: 1" in warned[0], warned


def test_gpu_cluster_doc_stop_costs_are_the_plan_of_paper_7b_and_2x8():
    from suite_helpers import ROOT, hack_module

    table = hack_module("gen_docs").stop_cost_table(EXAMPLES)
    assert "| grace period `rlt plan` prints |" in table and "| write rate assumed |" in table
    assert table in (ROOT / "docs" / "gpu-cluster.md").read_text(), "docs/gpu-cluster.md is stale: run make generate"
