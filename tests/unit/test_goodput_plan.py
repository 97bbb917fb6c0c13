"""The plan's goodput per rl mode (issue 51): separate generators, one step off, partial rollouts and colocated side by
side, colocated
refused where its memory does not fit, saves that block for the local write only, a saveSteps far from Young/Daly's
interval flagged both ways, sft dealt by tokens, and `rlt plan --calibration` replacing exactly what the GPU check
measured. Pure arithmetic over the published shapes (rlt.checks.model_shape.KNOWN_CONFIGS)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import yaml
from suite_helpers import EXAMPLES, ROOT

from rlt.checks.capacity import plan_for_run
from rlt.checks.goodput import goodput
from rlt.checks.model_shape import Shapes, known_shape
from rlt.checks.step_time import trainer_step_times
from rlt.cli import main
from rlt.spec.loading import parse_run

GPU_CHECK = ROOT / "benchmarks" / "gpu-runs" / "2026-11-27-h200" / "gpu_check.json"
GiB = 2**30


def _doc(name="rltrun-paper-7b.yaml"):
    return yaml.safe_load((EXAMPLES / name).read_text())


def _shapes(spec):
    return Shapes(known_shape(spec.teacher.model), known_shape(spec.student.model), None)


def _step(doc, stage="rl"):
    spec = parse_run(doc).spec
    return next(t for t in trainer_step_times(spec, _shapes(spec)) if t.stage == stage)


def _modes(doc, gpu_memory=80 * GiB):
    from rlt.checks.rl_modes import mode_steps

    spec = parse_run(doc).spec
    return {m.name: m for m in mode_steps(spec, _shapes(spec), gpu_memory, None, 8)}


def test_one_step_off_lasts_the_longer_side_plus_the_sync_and_every_mode_accounts_for_every_gpu_second():
    doc = _doc()
    doc["spec"]["stages"]["rl"]["generation"]["overlap"] = "oneStepOff"
    off = _step(doc)
    assert off.one_step_off and not off.partial_rollouts
    assert off.step == pytest.approx(max(off.generating, off.scoring + off.passes + off.update) + off.transfer)
    doc["spec"]["stages"]["rl"]["generation"]["overlap"] = "none"
    turns = _step(doc)
    assert turns.step == pytest.approx(turns.rollout + turns.scoring + turns.passes + turns.update)
    assert off.step < 0.6 * turns.step  # paper-7b: the rollout (~11 min) and the trainer's phases (~14 min) overlap
    for m in _modes(_doc()).values():
        if m.result is not None:
            assert m.result.share + sum(v for _, v in m.result.losses) == pytest.approx(1.0), m.name


def test_one_step_off_in_process_overlaps_nothing_and_counts_each_gpu_second_once():
    """inprocess decodes on the trainers' own GPUs: generating and training cannot both be useful work over the same
    GPU-seconds (counted as overlapping, the share and the losses summed to more than 1)."""
    doc = _doc()
    doc["spec"]["stages"]["rl"]["generation"] = {"mode": "inprocess", "overlap": "oneStepOff"}
    step = _step(doc)
    assert not step.one_step_off
    assert step.step == pytest.approx(step.rollout + step.scoring + step.passes + step.update)
    g = goodput(step)
    assert g.share + sum(v for _, v in g.losses) == pytest.approx(1.0)


def test_partial_rollouts_decode_at_full_slots_and_pay_the_kv_recompute():
    """Partial rollouts (2x8, the trainers the longer side): the step is the trainers' phases plus the sync, never
    shorter than the step's tokens at full slots plus the KV recompute or half a lone rollout's decoding; no decode
    tail of its own; the recompute a loss of its own."""
    doc = _doc("rltrun-2x8.yaml")
    part = _step(doc)
    assert part.partial_rollouts and part.kv_recompute > 0
    trainers = part.scoring + part.passes + part.update
    assert part.step == pytest.approx(max(part.busy_generation + part.kv_recompute, trainers, part.generating / 2)
                                      + part.transfer)  # fmt: skip
    assert part.step == pytest.approx(trainers + part.transfer)  # 2x8: the trainers are the longer side
    losses = dict(goodput(part).losses)
    assert "decode slots empty (the longest completions' tail)" not in losses
    assert losses["KV cache recomputed after each weight push (partial rollouts)"] > 0
    doc["spec"]["stages"]["rl"]["generation"]["overlap"] = "oneStepOff"
    off = _step(doc)
    assert off.kv_recompute == 0 and part.step < off.step and goodput(part).share > goodput(off).share + 0.1


def test_a_lone_rollouts_tail_setting_a_partial_step_is_named_the_tail_not_the_generators_wait():
    """Partial rollouts whose step half a lone rollout's decoding sets (its longest rows outlast both sides): the
    time past the longer side is that rollout's tail (decode slots empty), not generators waiting for the trainers;
    the generators' wait is only the trainers' lead over the decoding at full slots."""
    from rlt.checks.plan_terms import StepTime

    def step(trainers: float) -> StepTime:
        return StepTime(stage="rl", micro_batches=1, update_work=trainers, recompute=0.0, imbalance=1.0,
                        longest_micro=1.0, save=0.0, save_steps=100, trainer_gpus=4, generator_gpus=4,
                        longest_bound=1000.0, busy_generation=100.0, kv_recompute=5.0, transfer=10.0,
                        partial_rollouts=True)  # fmt: skip

    lone = step(trainers=160.0)
    assert lone.step == pytest.approx(500.0 + 10.0)  # half the lone rollout's 1000 s decoding sets it
    g = goodput(lone)
    losses, held = dict(g.losses), 8 * lone.step
    assert losses["decode slots empty (the longest completions' tail)"] == pytest.approx(4 * (500 - 160) / held)
    assert losses["generators idle while the trainers score, pass and update"] == pytest.approx(4 * (160 - 105) / held)
    assert losses["trainers idle while the generators decode"] == pytest.approx(4 * (500 - 160) / held)
    assert g.share + sum(losses.values()) == pytest.approx(1.0)
    trainer_bound = goodput(step(trainers=600.0))  # the trainers set the step: no tail, the generators wait
    assert "decode slots empty (the longest completions' tail)" not in dict(trainer_bound.losses)


def test_the_chosen_modes_of_paper_7b_and_2x8_and_the_old_terms_are_printed(capsys):
    """The issue's figures: paper-7b's rl ≥ 0.75 (0.81 with partial rollouts; 0.33 before, strict terms) and its sft
    ≥ 0.8 (0.81: selective layers under ZeRO-3); 2x8's rl ≥ 0.7 (0.73 with partial rollouts, whose engines' slots
    stay full across steps; one step off 0.61, the decode tail its largest loss)."""
    assert main(["plan", str(EXAMPLES / "rltrun-paper-7b.yaml")]) == 0
    out = capsys.readouterr().out
    chosen = next(x for x in out.splitlines() if "goodput: rl: the plan chooses " in x)
    assert "chooses partialRollouts" in chosen and "a row is at most 2 optimizer steps off-policy" in chosen, chosen
    assert "goodput: rl mode oneStepOff (" in out  # the other modes' terms, beside
    assert goodput(_step(_doc())).share >= 0.75
    sft = goodput(_step(_doc(), "sft"))
    assert sft.share >= 0.8 and sft.losses[0][0] == "gradient-checkpoint recompute", sft
    assert "goodput: rl before (saves on the critical path, generators separate)" in out
    assert "goodput: sft before (saves on the critical path, rows dealt at random)" in out
    assert "rl mode colocated (stages.rl.generation.mode: colocate): refused: " in out
    two = _doc("rltrun-2x8.yaml")
    assert goodput(_step(two)).share >= 0.7
    two["spec"]["stages"]["rl"]["generation"]["overlap"] = "oneStepOff"
    off = goodput(_step(two))
    assert 0.5 < off.share < 0.7 and off.losses[0][0] == "decode slots empty (the longest completions' tail)"


def test_colocated_is_refused_when_the_engine_cannot_fit_beside_the_trainer():
    """paper-7b without distill: 8 colocated GPUs of 80 GiB leave the engine a KV cache of ~64 rows. With short rows
    and a small reward student the update fits 40 GiB GPUs, but the ~27 GiB the trainer keeps leave too little for
    the 14 GiB engine and one row: refused, with the figures; on 80 GiB the same run fits."""
    doc = _doc()
    doc["spec"]["stages"]["distill"]["enabled"] = False
    fits = _modes(doc)["colocated"]
    assert fits.result is not None and "gpuMemoryUtilization: 0.6" in fits.setting, fits
    assert "the update alone needs" in _modes(doc, 40 * GiB)["colocated"].refused
    doc["spec"]["student"]["model"] = "Qwen/Qwen2.5-0.5B-Instruct"
    doc["spec"]["stages"]["rl"].update(maxCompletionLength=1024, maxPromptLength=1024)
    tight = _modes(doc, 40 * GiB)["colocated"]
    assert tight.result is None and "cannot hold the engine's weights" in tight.refused, tight
    assert _modes(doc)["colocated"].result is not None
    doc = _doc()  # distill would generate in process without generator pods: 95 GiB of 80
    assert "distill generates in process" in _modes(doc)["colocated"].refused


def test_a_colocated_spec_whose_engine_share_overflows_does_not_fit_naming_the_field():
    doc = _doc()
    doc["spec"]["stages"]["distill"]["enabled"] = False
    doc["spec"]["resources"]["trainer"]["gpus"] = 8
    gen = doc["spec"]["stages"]["rl"]["generation"]
    gen.update(mode="colocate", overlap="none", gpuMemoryUtilization=0.6)
    assert plan_for_run(parse_run(doc).spec).failures == []
    gen["gpuMemoryUtilization"] = 0.9  # the engine's share and the trainer's states: more than the GPU
    errors = plan_for_run(parse_run(doc).spec).errors()
    assert any("stages.rl.generation.gpuMemoryUtilization" in e for e in errors), errors


def test_overlap_with_colocate_is_refused_naming_the_field():
    from rlt.spec.loading import SpecError

    doc = _doc()
    doc["spec"]["resources"]["trainer"]["gpus"] = 8
    doc["spec"]["stages"]["rl"]["generation"]["mode"] = "colocate"  # overlap partialRollouts from the example
    with pytest.raises(
        (SpecError, ValueError), match="stages.rl.generation.overlap: partialRollouts with mode colocate"
    ):
        parse_run(doc)


def test_one_step_off_without_the_importance_ratio_is_refused_naming_the_field():
    from rlt.spec.loading import SpecError

    doc = _doc()
    doc["spec"]["stages"]["rl"]["generation"]["importanceSampling"] = "off"
    with pytest.raises((SpecError, ValueError), match="stages.rl.generation.importanceSampling: off with overlap"):
        parse_run(doc)


def _save_warning(save_steps):
    from rlt.checks.step_time import checkpoint_interval, save_interval_warning

    spec = parse_run(_doc()).spec
    t = _step(_doc())
    best = checkpoint_interval(t.save_blocked(True), spec.resources.trainer.mtbf_hours * 3600)
    steps = max(1, round(save_steps * best / t.step))
    return save_interval_warning(spec, replace(t, save_steps=steps)), steps


def test_young_daly_flags_an_interval_three_times_off_either_way_and_not_one_near_it():
    near, _ = _save_warning(1.0)
    assert near is None
    often, _ = _save_warning(1 / 3)
    assert often is not None and "under half" in often and "saves blocking" in often, often
    rare, _ = _save_warning(3.0)
    assert rare is not None and "over twice" in rare and "work redone after a loss" in rare, rare
    assert "costs" in rare and "resources.trainer.mtbfHours" in rare


def test_a_rarer_failure_rate_moves_the_interval():
    from rlt.checks.step_time import save_interval_warning

    doc = _doc()
    t = _step(doc)
    doc["spec"]["resources"]["trainer"]["mtbfHours"] = 24 * 16  # sqrt(16) = 4 × the interval
    spec = parse_run(doc).spec
    assert save_interval_warning(spec, t) is not None and "saveSteps" in save_interval_warning(spec, t)
    assert save_interval_warning(spec, replace(t, save_steps=4 * t.save_steps)) is None


def test_a_save_blocks_for_the_local_write_and_the_durable_copy_only_when_it_outlasts_the_interval():
    t = _step(_doc())
    assert t.save_blocked(True) == pytest.approx(t.save_local) and t.save_local < t.durable_copy < t.save
    slow = replace(t, durable_copy=t.save_steps * t.step + 100)
    assert slow.save_blocked(True) == pytest.approx(t.save_local + 100)
    # without the local tier the whole write to the volume blocks, not the ranks' exit a stop's save adds
    assert t.save_blocked(False) == t.durable_copy < t.save


def test_sft_is_dealt_by_tokens_in_the_plan():
    from rlt.checks.step_time import rank_imbalance

    sft = _step(_doc(), "sft")
    # a window of steps dealt (rlt.stages.sft_balance): the simulated and measured 1.02 at 4 ranks, below rl's deal
    assert sft.imbalance == rank_imbalance(4, dealt=True, window=True) == pytest.approx(1.02)
    assert rank_imbalance(4, dealt=True, window=True) < rank_imbalance(4, dealt=True) < rank_imbalance(4)
    assert "WINDOW_DEALT_IMBALANCE" in sft.imbalance_source


def test_the_gpu_product_the_spec_selects_sets_the_peak_memory_and_decode_rate():
    from rlt.checks.gpu_figures import GPU_MODELS
    from rlt.checks.gpu_memory import spec_gpu_memory

    h100 = _step(_doc())
    doc = _doc()
    doc["spec"]["scheduling"] = {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}}
    a100 = _step(doc)
    assert a100.update_work / h100.update_work == pytest.approx(989 / 312)
    assert a100.longest_bound / h100.longest_bound == pytest.approx(3.35 / 2.039)  # decode: bandwidth-bound
    doc["spec"]["scheduling"] = {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H200"}}
    assert spec_gpu_memory(parse_run(doc).spec)[0] == GPU_MODELS["H200"].memory_mib * 2**20


def test_calibration_replaces_exactly_what_the_gpu_check_measured(capsys):
    from rlt.checks import step_time
    from rlt.checks.gpu_figures import calibrated, figures, read_calibration
    from rlt.checks.gpu_memory import spec_gpu_memory

    measured = json.loads(GPU_CHECK.read_text())["parts"]
    cal = read_calibration(str(GPU_CHECK))
    spec = parse_run(_doc()).spec
    before = figures(spec)
    volume = step_time.write_rate(spec)
    with calibrated(cal):
        after = figures(spec)
        assert after.peak_flops == measured["peak"]["bf16_matmul_flops"]
        assert step_time.local_write_rate(spec)[0] == measured["grpo"]["save_bytes_per_s"]
        assert step_time.write_rate(spec) == volume  # the volume's rate: not the pod's local disk the check measured
        assert spec_gpu_memory(spec)[0] == 143771 * 2**20
        assert after.decode_tokens_per_s == pytest.approx(step_time.DECODE_TOKENS_PER_S * 4.8 / 3.35)  # H200
        t = _step(_doc())
    assert before.peak_flops == 989e12 and step_time.UTILISATION == 0.35  # the MFU measured on 0.5B: kept
    assert t.update_work == pytest.approx(_step(_doc()).update_work * 989e12 / after.peak_flops)
    assert main(["plan", "--calibration", str(GPU_CHECK), str(EXAMPLES / "rltrun-paper-7b.yaml")]) == 0
    out = capsys.readouterr().out
    assert "replaced: GPU model NVIDIA H200; GPU memory 143771 MiB; PEAK_FLOPS 797 TFLOP/s" in out
    assert "measured, not applied: MFU 0.23" in out and "measured, not applied: decode 11.6" in out


def test_a_file_that_is_not_a_gpu_check_is_refused(tmp_path, capsys):
    bad = tmp_path / "x.json"
    bad.write_text(json.dumps({"rehearsal": True}))
    assert main(["plan", "--calibration", str(bad), str(EXAMPLES / "rltrun-paper-7b.yaml")]) == 2
    assert "not a GPU check's JSON" in capsys.readouterr().err


def test_distill_shows_its_layouts_and_chooses_the_fewest_gpu_hours():
    """Served, the trainer GPUs only score (a small share of distill's work); the plan puts beside it moving the
    spare scorers to the decoding and colocating an engine on every GPU, and chooses the shortest."""
    import re

    lines = [x for x in plan_for_run(parse_run(_doc()).spec).goodput if x.startswith("distill")]
    walls = {m[1]: float(m[2]) for x in lines if (m := re.match(r"distill layout (\w+): .*: ([\d.]+) min", x))}
    assert set(walls) == {"served", "moved", "colocated"}, lines
    served = next(x for x in lines if x.startswith("distill layout served"))
    assert int(served.rsplit("goodput ", 1)[1].rstrip("%")) < 70  # the trainer GPUs wait on the decoding
    best = min(walls, key=walls.__getitem__)
    assert any(x.startswith(f"distill: the plan chooses {best} (the fewest GPU-hours") for x in lines), lines


def test_the_plan_never_chooses_an_overlap_the_spec_refuses_for_the_method():
    """RCL samples the frozen student during rl (its probes) on the rollout's thread and the reward's: the spec
    refuses overlap for it, so the plan refuses those modes too, naming why, and does not ask for them."""
    doc = _doc()
    doc["spec"]["method"] = "rcl"
    doc["spec"]["stages"]["distill"]["enabled"] = False
    doc["spec"]["stages"]["rl"]["generation"]["overlap"] = "none"
    modes = _modes(doc)
    for name in ("oneStepOff", "partialRollouts"):
        assert modes[name].result is None and "samples the frozen student" in modes[name].refused, modes[name]
    assert modes["separate"].result is not None


def test_generators_on_mig_slices_get_no_rl_goodput_rather_than_one_above_the_whole():
    """Mode server with resources.generator.gpus 0 (MIG slices named in extra): the plan does not know the slices'
    share of a GPU. Counting none made the trainer GPUs the decoders: a share above 100 %. No figure, one line."""
    doc = _doc()
    gen = doc["spec"]["resources"]["generator"]
    gen.update(gpus=0, extra={"nvidia.com/mig-3g.71gb": "1"})
    gen.pop("dataParallelSize", None)
    plan = plan_for_run(parse_run(doc).spec)
    assert "rl" not in plan.stage_goodput and "sft" in plan.stage_goodput, plan.stage_goodput
    assert all(0 < g.share <= 1 for g in plan.stage_goodput.values())
    text = "\n".join(plan.goodput)
    assert "rl: goodput not planned: the generators hold MIG slices (resources.generator.gpus: 0)" in text, text
    assert not any(line.startswith(("rl:", "rl ")) and "GPU-seconds" in line for line in plan.goodput), text
    assert not any("the plan chooses" in w for w in plan.warnings), plan.warnings


def test_a_one_gpu_colocated_run_is_not_told_to_train_on_no_gpu():
    """Split in half for the modes with generator pods, one GPU leaves the trainer none: those modes are refused,
    naming why, instead of a plan over an invented trainer GPU that says to set resources.trainer.gpus: 0."""
    doc = _doc()
    doc["spec"]["stages"]["distill"]["enabled"] = False
    doc["spec"]["resources"]["trainer"].update(nodes=1, gpus=1)
    doc["spec"]["stages"]["rl"]["generation"].update(mode="colocate", overlap="none")
    modes = _modes(doc)
    for name in ("separate", "oneStepOff", "partialRollouts"):
        assert modes[name].result is None, name
        assert "1 GPU does not split into a trainer GPU and a generator GPU" in modes[name].refused, modes[name]
    plan = plan_for_run(parse_run(doc).spec)
    assert not any("resources.trainer.gpus: 0" in w for w in plan.warnings), plan.warnings


def test_generator_gpus_vllm_does_not_run_on_are_a_named_loss_and_a_warning():
    """paper-7b's generator pod holds 4 GPUs; with dataParallelSize 1 vLLM runs one engine on one of them. The other
    three were credited with decoding; they are held for nothing: 3 of the 8 GPUs' period, named, and the plan says
    which value to set."""
    doc = _doc()
    doc["spec"]["resources"]["generator"]["dataParallelSize"] = 1
    g = goodput(_step(doc))
    lost = dict(g.losses)
    idle = "generator GPUs with no engine (tensorParallelSize × dataParallelSize < gpus)"
    assert lost[idle] == pytest.approx(3 / 8), g.losses
    assert g.share + sum(lost.values()) == pytest.approx(1.0)
    assert g.share < goodput(_step(_doc())).share
    warnings = plan_for_run(parse_run(doc).spec).warnings
    assert any("Set resources.generator.dataParallelSize: 4" in w and "3 hold no engine" in w for w in warnings)
    assert idle not in dict(goodput(_step(_doc())).losses)  # the example's 4 engines leave none idle


def test_distill_served_decodes_on_the_engines_vllm_runs_and_is_not_planned_on_mig_slices():
    """Served distill decodes on tensorParallelSize × dataParallelSize GPUs of each generator pod, as rl: one engine
    of paper-7b's 4 GPUs decodes 4 times longer. On MIG slices (gpus 0) the layouts are not planned, rather than
    described as an in-process run on the trainer GPUs."""
    import re

    def served(doc) -> tuple[float, str]:
        line = next(x for x in plan_for_run(parse_run(doc).spec).goodput if x.startswith("distill layout served"))
        return float(re.search(r": ([\d.]+) min", line)[1]), line

    four, _ = served(_doc())
    doc = _doc()
    doc["spec"]["resources"]["generator"]["dataParallelSize"] = 1
    one, line = served(doc)
    assert "1 generator GPUs (of 4 held) decode" in line, line
    assert one > 3 * four, (one, four)
    gen = doc["spec"]["resources"]["generator"]
    gen.update(gpus=0, extra={"nvidia.com/mig-3g.71gb": "1"})
    lines = [x for x in plan_for_run(parse_run(doc).spec).goodput if x.startswith("distill")]
    assert lines == ["distill layouts: not planned (the generators hold MIG slices: resources.generator.gpus is 0)"]


def test_a_generator_gpu_no_engine_can_use_is_named_with_the_gpus_to_ask_for():
    """A 72B teacher on 141 GiB GPUs takes tensorParallelSize 4; with gpus 5 one engine of 4 GPUs runs and no second
    fits: the warning asks for 4 GPUs, not for the dataParallelSize the spec already has."""
    doc = _doc()
    doc["spec"]["teacher"]["model"] = "Qwen/Qwen2.5-72B-Instruct"
    doc["spec"]["resources"]["generator"].update(gpus=5, tensorParallelSize=4, dataParallelSize=1)
    from rlt.checks.capacity import generator_parallelism
    from rlt.checks.model_shape import known_shape

    spec = parse_run(doc).spec
    _, warning = generator_parallelism(spec, known_shape(spec.teacher.model), 141 * GiB, None)
    assert warning is not None and "1 hold no engine" in warning and "Set resources.generator.gpus: 4" in warning
