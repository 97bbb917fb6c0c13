"""The rollout's decoding step by step (rlt.checks.decode_tail, issue 51): a step reads the weights and the live
rows' KV cache, calibrated so full slots decode at the plan's constant; a lone sequence runs faster by the bytes a
step reads; freed slots take the next queued row at once; with no KV cache to shrink the tail is the earlier bound.
Pure arithmetic over the published 7B shape; benchmarks/decode_tail.py measures the shape on the vLLM CPU server."""

from __future__ import annotations

from dataclasses import replace

import pytest
import yaml
from suite_helpers import EXAMPLES

from rlt.checks.decode_tail import (
    Engine,
    _one_order,
    completion_lengths,
    live_age,
    rollout,
    step_seconds,
)
from rlt.checks.gpu_figures import DECODE_TOKENS_PER_S, GPU_MODELS
from rlt.checks.model_shape import known_shape

SEVEN_B = known_shape("Qwen/Qwen2.5-7B-Instruct")
# 2x8's engine: one H100 holds the 7B teacher and ~102 rows of 2,048 + 8,192 tokens; 128 rows each, up to 16,384
H100 = Engine(SEVEN_B.params * 2, SEVEN_B.kv_bytes_per_token * 2, 2048, 102, 30.0, GPU_MODELS["H100"].bandwidth)
LONGEST = 16384


def _full_kv(e: Engine, lengths) -> float:
    return e.slots * (e.prompt + live_age(lengths))


def test_the_lengths_average_the_plans_mean_and_reach_the_cap():
    lengths = completion_lengths(128, LONGEST, 0.5)
    assert max(lengths) == LONGEST and sum(lengths) / 128 == pytest.approx(LONGEST / 2, rel=0.01)
    assert live_age(tuple(range(1, 10001))) == pytest.approx(10000 / 3, rel=0.001)  # length-biased: a third
    with pytest.raises(ValueError, match="MEAN_COMPLETION_SHARE"):
        completion_lengths(8, LONGEST, 0.3)


def test_full_slots_decode_at_the_plans_constant():
    lengths = completion_lengths(128, LONGEST, 0.5)
    assert 1 / step_seconds(H100, lengths, _full_kv(H100, lengths)) == pytest.approx(DECODE_TOKENS_PER_S)
    r = rollout(H100, 128, LONGEST, 0.5)
    assert r.full_rate == DECODE_TOKENS_PER_S and 0.3 < r.efficiency < 1  # a plausible share of 3.35 TB/s


def test_a_lone_sequence_runs_faster_by_the_bytes_a_step_reads():
    lengths = completion_lengths(128, LONGEST, 0.5)
    lone_bytes = H100.weight_bytes + (H100.prompt + LONGEST) * H100.kv_bytes_per_token
    full_bytes = H100.weight_bytes + _full_kv(H100, lengths) * H100.kv_bytes_per_token
    bare = rollout(replace(H100, overhead=0.0), 128, LONGEST, 0.5)
    assert bare.lone_rate / bare.full_rate == pytest.approx(full_bytes / lone_bytes)  # the bandwidth ratio, ~4
    r = rollout(H100, 128, LONGEST, 0.5)  # the step overhead caps it below
    assert 2 < r.lone_rate / r.full_rate < full_bytes / lone_bytes


def test_without_a_kv_cache_to_shrink_the_tail_is_the_earlier_bound():
    """Each step then costs the same at any batch size: the longest row at the full batch's rate, as before."""
    flat = replace(H100, kv_bytes_per_token=0.0)
    r = rollout(flat, 64, LONGEST, 0.5)  # 64 rows in 102 slots: no queue
    assert r.seconds == pytest.approx(LONGEST / DECODE_TOKENS_PER_S)
    assert r.lone_rate == pytest.approx(DECODE_TOKENS_PER_S)
    queued = rollout(flat, 256, LONGEST, 0.5)  # a queue: at least both earlier bounds
    assert queued.seconds >= max(LONGEST, 256 * LONGEST / 2 / 102) / DECODE_TOKENS_PER_S


def test_the_tail_shrinks_with_the_kv_the_batch_reads_and_nears_the_bound_as_it_vanishes():
    def relative(e: Engine, longest: int) -> float:  # the rollout in units of the earlier bound
        return rollout(e, 128, longest, 0.5).seconds / (longest / DECODE_TOKENS_PER_S)

    shares = [relative(replace(H100, kv_bytes_per_token=H100.kv_bytes_per_token * k), LONGEST) for k in (0, 0.25, 1)]
    assert shares[0] > shares[1] > shares[2] and shares[2] < 0.85  # 2x8's shape: well under the bound
    short = rollout(H100, 128, 1024, 0.5)  # a short maxCompletionLength: less KV, a shorter tail in seconds
    assert short.tail < rollout(H100, 128, LONGEST, 0.5).tail
    assert relative(H100, 1024) > relative(H100, LONGEST)  # but closer to the earlier bound


def test_a_freed_slot_takes_the_next_queued_row_at_once():
    flat = replace(H100, kv_bytes_per_token=0.0, slots=4)
    lengths = (1, 100, 100, 100, 100)  # the one-token row frees its slot after step 1; the queued row starts then
    seconds, empty, full = _one_order(flat, lengths, list(lengths))
    assert seconds == pytest.approx(101 / DECODE_TOKENS_PER_S)
    assert full == pytest.approx(100 / DECODE_TOKENS_PER_S) and empty == pytest.approx(0.75 / DECODE_TOKENS_PER_S)


def test_the_plan_decodes_2x8s_rollout_step_by_step_and_charges_its_empty_slots():
    from rlt.checks.goodput import goodput
    from rlt.checks.model_shape import Shapes
    from rlt.checks.step_time import trainer_step_times
    from rlt.spec.loading import parse_run

    doc = yaml.safe_load((EXAMPLES / "rltrun-2x8.yaml").read_text())
    doc["spec"]["stages"]["rl"]["generation"]["overlap"] = "oneStepOff"  # partial rollouts have no tail of their own
    spec = parse_run(doc).spec
    shapes = Shapes(SEVEN_B, known_shape(spec.student.model), None)
    t = next(x for x in trainer_step_times(spec, shapes) if x.stage == "rl")
    assert t.decode is not None and t.decode.rows == 128 and t.generating == t.decode.seconds
    assert t.generating < t.longest_bound  # the earlier bound was an upper bound
    g = goodput(t)
    empty = dict(g.losses)["decode slots empty (the longest completions' tail)"]
    assert empty == pytest.approx(t.generator_gpus * t.decode.empty / (g.gpus * g.period))
    assert t.grace >= t.before_update - t.generating + t.longest_bound  # a stop's wait errs long
    from rlt.checks.capacity import plan_for_run

    line = next(x for x in plan_for_run(spec).goodput if x.startswith("rl decode tail: "))
    assert "102 slots decode its 128 rows" in line and "a lone sequence at 88 tokens/s (×2.9" in line, line
