"""What a finished stage remembers of its spec, and what a re-run decides from it (pure: no training here)."""

import json

import pytest
from suite_helpers import tiny_doc

from rlt.contract.layout import CHECKPOINT_COMPLETE, RunLayout, atomic_write_text
from rlt.spec import fingerprint as fp
from rlt.spec.run import RLTRun


def tiny(**edits) -> RLTRun:
    doc = tiny_doc()
    for path, value in edits.items():
        node = doc["spec"]
        *parents, last = path.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    return RLTRun.model_validate(doc)


def finish(layout: RunLayout, run: RLTRun, stage: str, checkpoint: bool = True) -> None:
    """What Recorder.done() leaves: the fingerprint, then DONE (and a checkpoint, as the trainers leave)."""
    fp.record(layout, run.spec, stage)
    atomic_write_text(layout.stage_done(stage), "now\n")
    if checkpoint:
        ckpt = layout.checkpoint_dir(stage, 2)
        ckpt.mkdir(parents=True, exist_ok=True)
        (ckpt / CHECKPOINT_COMPLETE).write_text("now\n")


def plan(layout, run, stages=("sft", "rl", "distill"), **kw):
    ckpt = layout.has_complete_checkpoint
    return [(p.stage, p.action) for p in fp.plan_stages(layout, run.spec, list(stages), has_checkpoint=ckpt, **kw)]


def test_fields_name_what_a_stage_depends_on_and_leave_out_what_does_not():
    fields = fp.stage_fields(tiny().spec, "rl")
    assert fields["stages.rl.steps"] == 3 and fields["stages.sft.maxSteps"] == 2 and fields["teacher.model"]
    assert "stages.distill.limit" not in fields  # a later stage cannot change rl's output
    assert not any(k.startswith(("resources", "images", "storage")) for k in fields)
    # speed and placement settings do not change what the stage produces
    same = tiny(**{"stages.rl.saveSteps": 1, "stages.rl.gradientCheckpointing": True, "resources.trainer.gpus": 1})
    assert fp.stage_fingerprint(same.spec, "rl") == fp.stage_fingerprint(tiny().spec, "rl")
    assert fp.stage_fingerprint(tiny(**{"stages.rl.beta": 0.0}).spec, "rl") != fp.stage_fingerprint(tiny().spec, "rl")
    assert fp.stage_fingerprint(tiny(**{"dataset.size": 8}).spec, "sft") != fp.stage_fingerprint(tiny().spec, "sft")


def test_unchanged_spec_skips_and_more_rl_steps_continue(tmp_path):
    layout = RunLayout.for_run(tmp_path, "tiny")
    run = tiny()
    for stage in ("sft", "rl", "distill"):
        finish(layout, run, stage)
    assert plan(layout, run) == [("sft", "skip"), ("rl", "skip"), ("distill", "skip")]
    more = tiny(**{"stages.rl.steps": 5})
    # rl trains on from its checkpoint; distill read rl's model, which changes: it is done again
    assert plan(layout, more) == [("sft", "skip"), ("rl", "continue"), ("distill", "start_over")]


def test_other_edits_refuse_in_one_line_naming_fields_and_flag(tmp_path):
    layout = RunLayout.for_run(tmp_path, "tiny")
    run = tiny()
    for stage in ("sft", "rl"):
        finish(layout, run, stage)
    edited = tiny(**{"stages.rl.learningRate": 0.001, "stages.rl.beta": 0.0})
    with pytest.raises(fp.StaleStageError) as err:
        plan(layout, edited, ("sft", "rl"))
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith(
        "[rl] finished under a different spec (stages.rl.beta 0.04 -> 0.0, stages.rl.learningRate 0.0001 -> 0.001)"
    )
    assert "re-run with --from-stage rl" in msg
    # fewer steps cannot be un-trained; more steps without a complete checkpoint cannot continue
    with pytest.raises(fp.StaleStageError, match="stages.rl.steps 3 -> 2"):
        plan(layout, tiny(**{"stages.rl.steps": 2}), ("sft", "rl"))
    for ckpt in layout.checkpoints_dir("rl").iterdir():
        (ckpt / CHECKPOINT_COMPLETE).unlink()  # partial now: a pod killed mid-save
    with pytest.raises(fp.StaleStageError, match="stages.rl.steps 3 -> 4"):
        plan(layout, tiny(**{"stages.rl.steps": 4}), ("sft", "rl"))
    # the pod's command names its own flag
    with pytest.raises(fp.StaleStageError, match="re-run with --restart to"):
        fp.plan_stages(layout, edited.spec, ["rl"], restart_flag="--restart")
    # asked to start over: allowed, and the old outputs are moved, not deleted
    assert plan(layout, edited, ("sft", "rl"), restart={"rl"}) == [("sft", "skip"), ("rl", "start_over")]
    rows = [{"stage": "sft", "step": 1}, {"stage": "rl", "step": 1}, {"stage": "rl", "step": 2}]
    layout.metrics_file.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"stage": "rl", "st')
    moved = fp.start_over(layout, "rl")
    assert (
        moved.parent == layout.root / "replaced" and (moved / "DONE").exists() and not layout.stage_dir("rl").exists()
    )
    # its metric rows go with it (the summary and plots show the new run, not both merged); others stay, as written
    assert [json.loads(x) for x in (moved / "metrics.jsonl").read_text().splitlines()] == rows[1:]
    assert layout.metrics_file.read_text() == json.dumps(rows[0]) + '\n{"stage": "rl", "st'


def test_an_earlier_edit_refuses_at_the_earliest_stage_and_a_redone_upstream_reruns_later_ones(tmp_path):
    layout = RunLayout.for_run(tmp_path, "tiny")
    run = tiny()
    for stage in ("sft", "rl"):
        finish(layout, run, stage)
    edited = tiny(**{"stages.sft.learningRate": 0.01})
    with pytest.raises(fp.StaleStageError, match=r"^\[sft\] .*stages.sft.learningRate"):
        plan(layout, edited, ("sft", "rl"))
    # once sft has been redone under the new spec, rl (whose input it is) starts over by itself
    fp.start_over(layout, "sft")
    finish(layout, edited, "sft")
    assert plan(layout, edited, ("sft", "rl")) == [("sft", "skip"), ("rl", "start_over")]
    # but rl alone, with sft still from the old spec, refuses
    layout2 = RunLayout.for_run(tmp_path / "b", "tiny")
    for stage in ("sft", "rl"):
        finish(layout2, run, stage)
    with pytest.raises(fp.StaleStageError, match=r"^\[rl\] .*stages.sft.learningRate.*--from-stage sft"):
        plan(layout2, edited, ("rl",))  # the advice names the stage to train again: sft, not rl
    # and rl asked to start over (or run for the first time) on sft's old output refuses too, naming sft
    with pytest.raises(fp.StaleStageError, match=r"^\[sft\] .*stage rl would train on its output.*--from-stage sft"):
        plan(layout2, edited, ("rl",), restart={"rl"}, check_inputs=True)
    # the operator's pods run it on the old output (reported there as FinishedStageEdited): no refusal for them
    assert plan(layout2, edited, ("rl",), restart={"rl"}) == [("rl", "start_over")]


def test_stages_finished_before_fingerprints_existed_are_kept(tmp_path):
    layout = RunLayout.for_run(tmp_path, "tiny")
    atomic_write_text(layout.stage_done("sft"), "old\n")
    [p] = fp.plan_stages(layout, tiny().spec, ["sft"])
    assert p.action == "skip" and "assumed unchanged" in p.note


def test_a_field_added_later_at_its_old_behaviour_keeps_finished_stages_current(tmp_path):
    """stages.rl.lossType (was fixed at grpo): a stage recorded before the field existed is still current at grpo, and
    the new value is a named change."""
    layout = RunLayout.for_run(tmp_path, "tiny")
    run = tiny()
    finish(layout, run, "rl")
    recorded = fp.recorded_fields(layout, "rl")
    assert recorded is not None and "stages.rl.lossType" not in recorded
    assert fp.stage_fields(tiny(**{"stages.rl.lossType": "grpo"}).spec, "rl") == recorded
    assert "stages.rl.lossType" in fp.changed_fields(
        recorded, fp.stage_fields(tiny(**{"stages.rl.lossType": "dapo"}).spec, "rl")
    )


def test_a_stage_stopped_mid_way_resumes_only_under_the_fields_it_was_started_under(tmp_path):
    """`rlt run` killed during rl, the spec edited, the same command again: rl's checkpoint was trained under the old
    fields. Resuming it would train on under new ones and record them as if it had run under them throughout."""
    layout = RunLayout.for_run(tmp_path, "tiny")
    run = tiny()
    finish(layout, run, "sft")
    fp.record_start(layout, run.spec, "rl")  # rl started, saved a checkpoint, was killed
    ckpt = layout.checkpoint_dir("rl", 2)
    ckpt.mkdir(parents=True)
    (ckpt / CHECKPOINT_COMPLETE).write_text("now\n")

    def planned(r: RLTRun) -> list[tuple[str, str]]:
        return plan(layout, r, ("sft", "rl"), check_resumes=True)

    assert planned(run) == [("sft", "skip"), ("rl", "run")], "the same spec resumes"
    assert planned(tiny(**{"stages.rl.saveSteps": 1})) == [("sft", "skip"), ("rl", "run")], "speed is no edit"
    assert planned(tiny(**{"stages.rl.steps": 5})) == [("sft", "skip"), ("rl", "continue")]
    with pytest.raises(fp.StaleStageError) as err:
        planned(tiny(**{"stages.rl.beta": 0.0}))
    assert str(err.value).startswith("[rl] stopped under a different spec (stages.rl.beta 0.04 -> 0.0); not resuming")
    assert "re-run with --from-stage rl" in str(err.value)
    # the pods resume a gang under the spec it was created with: no check there
    assert plan(layout, tiny(**{"stages.rl.beta": 0.0}), ("sft", "rl")) == [("sft", "skip"), ("rl", "run")]
    # no checkpoint yet: the stage starts from scratch under the new fields anyway
    (ckpt / CHECKPOINT_COMPLETE).unlink()
    assert planned(tiny(**{"stages.rl.beta": 0.0})) == [("sft", "skip"), ("rl", "run")]


@pytest.mark.parametrize("schedule", [{"stages.rl.lrScheduler": "cosine"}, {"stages.rl.warmupRatio": 0.1}])
def test_more_rl_steps_refuse_when_the_schedule_depends_on_the_total(tmp_path, schedule):
    """Continuing equals one longer run only at a constant learning rate: under cosine (or with a warmup) the steps
    after the checkpoint would follow a schedule rebuilt for the new total, so the edit is refused, saying why."""
    layout = RunLayout.for_run(tmp_path, "tiny")
    run = tiny(**schedule)
    for stage in ("sft", "rl"):
        finish(layout, run, stage)
    with pytest.raises(fp.StaleStageError) as err:
        plan(layout, tiny(**schedule, **{"stages.rl.steps": 5}), ("sft", "rl"))
    assert "stages.rl.steps 3 -> 5" in str(err.value) and "depends on the total steps" in str(err.value)


def test_generation_settings_that_change_the_objective_are_fields_and_speed_ones_are_not():
    base = fp.stage_fields(tiny().spec, "rl")
    assert not any(k.startswith("stages.rl.generation") for k in base)  # at the defaults: as recorded before
    assert fp.stage_fields(tiny(**{"stages.rl.generation.gpuMemoryUtilization": 0.5}).spec, "rl") == base
    for edit in (
        {"stages.rl.generation.overlap": "oneStepOff"},
        {"stages.rl.generation.importanceSampling": "tokenTruncate"},
    ):
        assert fp.changed_fields(base, fp.stage_fields(tiny(**edit).spec, "rl")) == [next(iter(edit))]


def test_a_disabled_rl_stage_still_gives_distill_the_reward_it_ranks_by():
    """distill ranks its explanations by rl's reward at rl's temperature even when rl is disabled (an SFT-only
    teacher, `rlt compare`'s sft_teacher arm): those settings are distill's fields, the speed ones are not."""
    off = {"stages.rl.enabled": False}
    base = fp.stage_fields(tiny(**off).spec, "distill")
    assert {k: v for k, v in base.items() if k.startswith("stages.rl.")} == {"stages.rl.enabled": False}
    for edit, field in (
        ({"stages.rl.reward.lambda": 0.0}, "stages.rl.reward.lambda"),
        ({"stages.rl.temperature": 1.0}, "stages.rl.temperature"),
    ):
        assert fp.changed_fields(base, fp.stage_fields(tiny(**off, **edit).spec, "distill")) == [field]
    assert fp.stage_fields(tiny(**off, **{"stages.rl.reward.batchSize": 8}).spec, "distill") == base
    assert fp.stage_fields(tiny(**off, **{"stages.rl.reward.lambda": 0.0}).spec, "sft") == fp.stage_fields(
        tiny(**off).spec, "sft"
    )  # not a field of the stages before rl


def test_a_record_from_before_a_field_was_counted_stays_current_whatever_its_value(tmp_path):
    """A stage recorded before rl's overlap (or a disabled rl's reward) counted has no such field: it is read as the
    current value, so an upgrade neither refuses nor redoes it; a record that counted it still sees every edit."""
    import json

    layout = RunLayout.for_run(tmp_path, "tiny")
    run = tiny(**{"stages.rl.generation.overlap": "oneStepOff"})
    for stage in ("sft", "rl"):
        finish(layout, run, stage)
    for stage in ("sft", "rl"):  # as the earlier version wrote them: no version, no overlap field
        path = fp.fingerprint_path(layout, stage)
        doc = json.loads(path.read_text())
        fields = {k: v for k, v in doc["fields"].items() if "generation" not in k}
        path.write_text(json.dumps({"fingerprint": fp.fingerprint_of(fields), "fields": fields}))
    assert plan(layout, run, ("sft", "rl")) == [("sft", "skip"), ("rl", "skip")]
    with pytest.raises(fp.StaleStageError):  # a field counted then is compared as ever
        plan(layout, tiny(**{"stages.rl.generation.overlap": "oneStepOff", "stages.rl.beta": 0.0}), ("sft", "rl"))
    fresh = RunLayout.for_run(tmp_path / "now", "tiny")
    for stage in ("sft", "rl"):
        finish(fresh, tiny(), stage)  # this version's records: overlap at its default, left out, counted
    with pytest.raises(fp.StaleStageError, match="stages.rl.generation.overlap <unset> -> oneStepOff"):
        plan(fresh, run, ("sft", "rl"))


def test_logging_cadence_is_recorded_but_no_edit_of_a_finished_or_a_stopped_stage(tmp_path):
    """loggingSteps changes what is logged, not what a stage produces: editing it must not refuse (nor redo hours of
    training). It stays in the records, so their fingerprints and what an earlier rlt reads (a rollback) are as
    before."""
    layout = RunLayout.for_run(tmp_path, "tiny")
    run = tiny()
    for stage in ("sft", "rl"):
        finish(layout, run, stage)
    assert fp.recorded_fields(layout, "rl")["stages.rl.loggingSteps"] == 1
    logged = tiny(**{"stages.sft.loggingSteps": 4, "stages.rl.loggingSteps": 2})
    assert plan(layout, logged, ("sft", "rl")) == [("sft", "skip"), ("rl", "skip")]
    # a real edit beside it is refused, naming only itself
    with pytest.raises(fp.StaleStageError, match=r"different spec \(stages.rl.beta 0.04 -> 0.0\)"):
        plan(layout, tiny(**{"stages.rl.beta": 0.0, "stages.rl.loggingSteps": 2}), ("sft", "rl"))
    # a stage stopped mid-way resumes under another logging cadence
    stopped = RunLayout.for_run(tmp_path / "stopped", "tiny")
    finish(stopped, run, "sft")
    fp.record_start(stopped, run.spec, "rl")
    ckpt = stopped.checkpoint_dir("rl", 1)
    ckpt.mkdir(parents=True)
    (ckpt / CHECKPOINT_COMPLETE).write_text("now\n")
    assert plan(stopped, logged, ("sft", "rl"), check_resumes=True) == [("sft", "skip"), ("rl", "run")]


def test_distills_part_files_outlive_a_logging_edit_and_an_older_rlts_name(tmp_path):
    """A distill stopped mid-way keeps the rows its ranks wrote (hours of generation at scale) when only the logging
    cadence is edited; a real edit starts a folder of its own; the folder an older rlt named by every field (the same
    rows) is taken over, and a link keeps its name for a rollback."""
    from rlt.stages.distill_parts import parts_dir, parts_folder

    stage_dir = tmp_path / "distill"
    run = tiny()
    folder = parts_folder(stage_dir, run.spec)
    assert parts_folder(stage_dir, tiny(**{"stages.sft.loggingSteps": 4, "stages.rl.loggingSteps": 2}).spec) == folder
    assert parts_folder(stage_dir, tiny(**{"stages.rl.beta": 0.0}).spec) != folder
    older = parts_dir(stage_dir, fp.stage_fingerprint(run.spec, "distill"))
    older.mkdir(parents=True)
    (older / "rank-0.jsonl").write_text('{"index": 0}\n')
    assert parts_folder(stage_dir, run.spec) == folder
    assert (folder / "rank-0.jsonl").read_text() == '{"index": 0}\n'
    # rolled back, the older rlt reads and appends through its own name (a link), and the newer one sees the append
    assert older.is_symlink() and (older / "rank-0.jsonl").read_text() == '{"index": 0}\n'
    with (older / "rank-1.jsonl").open("w") as f:
        f.write('{"index": 1}\n')
    assert parts_folder(stage_dir, run.spec) == folder and sorted(p.name for p in folder.iterdir()) == [
        "rank-0.jsonl",
        "rank-1.jsonl",
    ]
