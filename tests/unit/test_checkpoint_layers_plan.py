"""The plan's selective gradient checkpointing (issue 51, rlt.checks.checkpoint_layers): with uncheckpointedLayers
unset it keeps as many decoder layers' activations as the GPU's memory holds beside the terms held through the
step, so more memory keeps more layers and too little keeps none, and it charges the recompute of the checkpointed
layers only; it prints the choice with its figures; a value the model cannot take is a plan error naming the
field, and the spec refuses the others. Pure arithmetic over the published shapes (KNOWN_CONFIGS)."""

from __future__ import annotations

import pytest
import yaml
from suite_helpers import EXAMPLES

from rlt.checks.capacity import plan_run
from rlt.checks.checkpoint_layers import CHECKPOINT_MARGIN, spread_checkpointed_share, update_room
from rlt.checks.goodput import goodput
from rlt.checks.model_shape import Shapes, known_shape
from rlt.checks.stage_terms.sft import TERMS as SFT
from rlt.checks.step_time import trainer_step_times
from rlt.cli import main
from rlt.spec.loading import SpecError, parse_run

GiB = 2**30
RECOMPUTE = "gradient-checkpoint recompute"


def _spec(name="rltrun-paper-7b.yaml", **sft):
    doc = yaml.safe_load((EXAMPLES / name).read_text())
    doc["spec"]["stages"]["sft"].update(sft)
    return parse_run(doc).spec


def _shapes(spec):
    return Shapes(known_shape(spec.teacher.model), known_shape(spec.student.model), None)


def _sft(spec, gpu_memory):
    """(the choice, the sft step, its recompute loss share) on GPUs of `gpu_memory` bytes."""
    shapes = _shapes(spec)
    choice = SFT.layer_choice(spec, shapes, True, gpu_memory)
    step = next(t for t in trainer_step_times(spec, shapes, gpu_memory=gpu_memory) if t.stage == "sft")
    return choice, step, dict(goodput(step).losses).get(RECOMPUTE, 0.0)


def test_the_layers_kept_follow_from_memory_and_the_recompute_charged_shrinks_with_them():
    spec = _spec(deepspeedZeroStage=2)  # one count from choose alone (ZeRO-3 adds selective layers: below)
    shape = known_shape(spec.teacher.model)
    small, h100, larger, h200, huge = (_sft(spec, g * GiB) for g in (48, 80, 100, 141, 200))
    assert small[0].kept == 0 and 0 < h100[0].kept < larger[0].kept < h200[0].kept < huge[0].kept == shape.layers
    assert small[2] > h100[2] > larger[2] > h200[2] > huge[2] == 0
    assert all(c.selective == 0 for c, _, _ in (small, h100, larger, h200, huge))

    # the most layers that fit: the update with one more kept would pass the GPU less the margin
    for gpu in (80, 100, 141):
        memory = gpu * GiB
        choice = SFT.layer_choice(spec, _shapes(spec), True, memory)
        plan = plan_run(spec, _shapes(spec), memory)
        check = next(c for c in plan.checks if c.stage == "sft" and c.resource == "GPU memory per trainer process")
        held = sum(size for _, size in check.terms)
        ref = spec.teacher
        update = SFT.update_phase(spec, shape, ref, True, choice.kept)[1]
        one_more = SFT.update_phase(spec, shape, ref, True, choice.kept + 1)[1]
        assert held + update <= (1 - CHECKPOINT_MARGIN) * memory < held + one_more, gpu
        assert check.fits and f"checkpointing {choice.checkpointed} of {shape.layers} layers" in check.phases[0][0]


def test_under_zero_3_selective_layers_recompute_the_fewest_forwards_that_fit_and_are_charged_so():
    """paper-7b (ZeRO-3, one count for every micro-batch): the plan trades kept layers for selective ones (about
    half the bytes, SELECTIVE cost of a forward each) where that recomputes less; the pair it takes is the best of
    every (kept, selective) pair that fits, found here by enumerating them all; the recompute charged is the whole
    forward's times the recomputed layers' share, and falls as the memory grows."""
    spec = _spec()
    shape, ref = known_shape(spec.teacher.model), spec.teacher
    every = _sft(spec, 48 * GiB)[1].recompute  # nothing but full recompute fits: every layer's forward
    assert every == pytest.approx(_sft(spec, 48 * GiB)[1].update_work / 3 * shape.layer_params / shape.params)
    last = None
    for gpu in (64, 80, 100, 141):
        memory = gpu * GiB
        choice, step, lost = _sft(spec, memory)
        plan = plan_run(spec, _shapes(spec), memory)
        check = next(c for c in plan.checks if c.stage == "sft" and c.resource == "GPU memory per trainer process")
        room = (1 - CHECKPOINT_MARGIN) * memory - sum(size for _, size in check.terms)
        pairs = [
            (k, s)
            for k in range(shape.layers + 1)
            for s in range(shape.layers - k + 1)
            if SFT.update_phase(spec, shape, ref, True, k, selective=s)[1] <= room
        ]
        cost = choice.selective_cost
        best = min(shape.layers - k - s + s * cost for k, s in pairs)
        assert choice.recomputed == pytest.approx(best), gpu
        assert (choice.kept, choice.selective) in pairs and check.fits
        assert step.recompute == pytest.approx(every * choice.recomputed / shape.layers), gpu
        assert last is None or lost < last
        last = lost
    assert 0.1 < cost < 0.3  # the ops between the matmuls, memory-bound (SELECTIVE_BANDWIDTH_SHARE of 3.35 TB/s)
    assert _sft(spec, 80 * GiB)[0].selective > 0
    # with LoRA TRL checkpoints reentrantly under ZeRO-3, which cannot keep chosen outputs: no selective layers
    doc = yaml.safe_load((EXAMPLES / "rltrun-paper-7b.yaml").read_text())
    doc["spec"]["teacher"]["lora"] = {"r": 64, "alpha": 128}
    lora = parse_run(doc).spec
    assert SFT.layer_choice(lora, _shapes(lora), True, 80 * GiB).selective == 0


def test_a_set_value_or_checkpointing_off_is_what_the_plan_charges():
    spec = _spec(uncheckpointedLayers=4)
    choice, step, _ = _sft(spec, 141 * GiB)
    assert (choice.kept, choice.how) == (4, "stages.sft.uncheckpointedLayers: 4")
    off, off_step, lost = _sft(_spec(gradientCheckpointing=False), 80 * GiB)
    assert off.kept == off.layers and off_step.recompute == 0 and lost == 0
    zero, zero_step, _ = _sft(_spec(uncheckpointedLayers=0), 141 * GiB)
    assert zero.kept == 0 and zero_step.recompute > step.recompute > 0


def test_rlt_plan_prints_the_choice_with_its_memory_figures(capsys):
    assert main(["plan", str(EXAMPLES / "rltrun-paper-7b.yaml")]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("  checkpointing: sft: "))
    choice = SFT.layer_choice(_spec(), _shapes(_spec()), True, 80 * GiB)
    kept, selective = choice.kept, choice.selective
    assert f"gradient checkpointing on {28 - kept} of 28 decoder layers, {selective} of them selectively" in line
    assert ", the last keeps its activations" in line if kept == 1 else f"the last {kept} keep" in line, line
    assert f"{kept} kept and {selective} selective in the same room recompute" in line, line
    assert "GiB GPU - " in line and "held through the step" in line and "more per layer kept" in line, line


def test_bad_values_are_refused_naming_the_field():
    with pytest.raises(SpecError, match="uncheckpointedLayers"):
        _spec(uncheckpointedLayers=-1)
    with pytest.raises(SpecError, match="uncheckpointedLayers"):
        _spec(uncheckpointedLayers="all")
    with pytest.raises(SpecError, match="uncheckpointedLayers: 3 is set but gradientCheckpointing is false"):
        _spec(uncheckpointedLayers=3, gradientCheckpointing=False)
    spec = _spec(uncheckpointedLayers=29)
    plan = plan_run(spec, _shapes(spec), 80 * GiB)
    assert "sft: stages.sft.uncheckpointedLayers: 29 is more than the 28 decoder layers" in "\n".join(plan.errors())


def test_a_shorter_micro_batch_keeps_the_most_layers_that_fit_the_room_the_longest_leaves():
    """LayerSchedule on paper-7b's sft under ZeRO-2 at 80 GiB: the longest micro-batch keeps the plan's count; each
    count above it is kept up to the largest share of the longest's tokens whose update fits the same room, and not
    at a little more; a micro-batch of half the tokens keeps more than twice the longest's count; the recompute
    charged is each micro-batch's over rows spread from 0 to maxLength, below the fixed count's, which a set
    uncheckpointedLayers still charges."""
    spec, memory = _spec(deepspeedZeroStage=2), 80 * GiB
    shape, ref = known_shape(spec.teacher.model), spec.teacher
    choice = SFT.layer_choice(spec, _shapes(spec), True, memory)
    per_micro = SFT.layer_schedule(spec, _shapes(spec), True, memory)
    plan = plan_run(spec, _shapes(spec), memory)
    check = next(c for c in plan.checks if c.stage == "sft" and c.resource == "GPU memory per trainer process")
    room = update_room(memory, sum(size for _, size in check.terms))[1]
    assert per_micro.floor == choice.kept and per_micro.kept_for(1.0) == choice.kept
    assert per_micro.steps[0][1] == shape.layers  # short enough, every layer keeps its activations
    shares = [most for most, _ in per_micro.steps]
    assert shares == sorted(shares) and len(set(shares)) == len(shares)
    for most, kept in per_micro.steps:
        assert SFT.update_phase(spec, shape, ref, True, kept, most)[1] <= room
        assert SFT.update_phase(spec, shape, ref, True, kept, most + 1 / 512)[1] > room, kept
        assert per_micro.kept_for(most) == kept and per_micro.kept_for(most + 1 / 512) < kept
    assert per_micro.kept_for(0.5) > 2 * choice.kept
    every = _sft(_spec(deepspeedZeroStage=2, uncheckpointedLayers=0), memory)[1].recompute
    adaptive = _sft(spec, memory)[1]
    assert adaptive.recompute == pytest.approx(every * spread_checkpointed_share(per_micro, 0.0, 1.0))
    fixed_spec = _spec(deepspeedZeroStage=2, uncheckpointedLayers=choice.kept)
    assert SFT.layer_schedule(fixed_spec, _shapes(spec), True, memory) is None
    fixed = _sft(fixed_spec, memory)[1]
    assert adaptive.recompute < 0.9 * fixed.recompute  # 0.80 (24 of 28 checkpointed for the longest)
    assert fixed.recompute == pytest.approx(every * choice.checkpointed / shape.layers)


def test_under_zero_3_every_micro_batch_keeps_one_count_and_the_plan_says_why(capsys):
    """ZeRO-3 prefetches parameters along the module order it recorded; a count that changed per micro-batch would
    change that order (the recompute comes and goes), so paper-7b (ZeRO-3) has no schedule, and `rlt plan` says so."""
    spec = _spec()
    assert SFT.layer_schedule(spec, _shapes(spec), True, 80 * GiB) is None
    assert main(["plan", str(EXAMPLES / "rltrun-paper-7b.yaml")]) == 0
    out = capsys.readouterr().out
    assert "sft: one count for every micro-batch under ZeRO-3" in out
    assert "per micro-batch, a shorter one keeps more" not in out
