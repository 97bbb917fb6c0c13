"""`builtin:sums-detour` (issue 46): every raw trace is correct (each stated operation holds and the trace determines
the solution), unfriendly in one of three shapes, with the `sums` worked trace as its friendly rewrite; and the RLT
reward of the real SmolLM2-135M-Instruct ranks the friendly rewrite above the raw trace on ≥ 90 % of questions."""

import re

import pytest
import torch

from rlt.data import headroom, tasks
from rlt.spec.inputs import ModelRef

OPERATION = re.compile(r"(\d+) ([+-]) (\d+)(?: \+ (\d+))? = (\d+)")
BACKWARDS = re.compile(r"(\d+) = (\d+) \+ (\d+)")  # 'z = x + y'
SUM_IS = re.compile(r"sum is (\d+)")


def statements_hold(trace: str, total: int) -> int:
    """Checks every 'x ± y [+ c] = z', 'z = x + y' and 'the sum is z' of a trace; returns how many there were."""
    found = OPERATION.findall(trace)
    for x, op, y, c, z in found:
        value = int(x) + int(y) if op == "+" else int(x) - int(y)
        assert value + int(c or 0) == int(z), f"{trace!r}: {x} {op} {y} {c} = {z} is false"
    for z, x, y in BACKWARDS.findall(trace):
        assert int(x) + int(y) == int(z), f"{trace!r}: {z} = {x} + {y} is false"
    for z in SUM_IS.findall(trace):
        assert int(z) == total, f"{trace!r}: the sum is {z} is false"
    return len(found) + len(BACKWARDS.findall(trace)) + len(SUM_IS.findall(trace))


def test_raw_traces_are_correct_and_unfriendly():
    rows = tasks.generate("sums-detour", 300, seed=0)
    assert rows == tasks.generate("sums-detour", 300, seed=0)  # same seed, same rows
    shapes = [headroom.shape_of(r["question"], r["reasoning_trace"]) for r in rows]
    weight = sum(headroom.MIX.values())
    for shape, w in headroom.MIX.items():  # the mix's weights, within sampling error
        assert abs(shapes.count(shape) / len(rows) - w / weight) < 0.1, (shape, shapes.count(shape))
    assert set(shapes) == set(headroom.MIX)
    for r in rows:
        a, b = headroom.operands(r["question"])
        total, trace = a + b, r["reasoning_trace"]
        assert r["solution"] == str(total) and tasks.check_builtin(r["question"], r["solution"]) is True
        friendly = headroom.friendly_trace(a, b)
        assert friendly != trace and statements_hold(friendly, total) == 3 and friendly.endswith(f"= {total}.")
    # every shape, the dataset's and the others, on many operands: true statements that determine the total
    for a, b in [
        (10, 10),
        (99, 89),
        (47, 38),
        (55, 45),
        (19, 81),
        *[(r * 7 % 90 + 10, r * 13 % 80 + 10) for r in range(60)],
    ]:
        for shape in headroom.SHAPES:
            trace, total = headroom.raw_trace(a, b, shape), a + b
            assert statements_hold(trace, total) >= 2, trace
            numbers = [int(n) for n in re.findall(r"\d+", trace)]
            if shape == "digits":  # the total is never written; its digits are, and they make it
                assert total not in numbers
                tens, ones = re.search(r"tens part is (\d+) and the ones digit is (\d)\.", trace).groups()
                assert int(tens) * 10 + int(ones) == total
            else:  # stated, as the result of a true operation
                assert re.search(rf"= {total}\b|sum is {total}\b|^{total} = ", trace), trace
            assert headroom.shape_of(f"What is {a} + {b}?", trace) == shape
    # the friendly rewrite is the `sums` worked trace
    s = tasks.generate("sums", 4, seed=0)
    assert [headroom.friendly_trace(*headroom.operands(r["question"])) for r in s] == [r["reasoning_trace"] for r in s]


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="'sideways'"):
        headroom.raw_trace(12, 34, "sideways")
    with pytest.raises(ValueError, match="What is A \\+ B"):
        headroom.operands("What is 12 * 34?")
    with pytest.raises(ValueError, match="not a sums-detour trace"):
        headroom.shape_of("What is 12 + 34?", "Add the tens: 10 + 30 = 40.")


@pytest.mark.slow
def test_rlt_reward_ranks_the_friendly_rewrite_above_the_raw_trace(formatter):
    """Headroom proven before RL is spent: over the dataset's whole mix of shapes (which the student follows about
    half the time, docs/experiments.md), the reward RL optimises prefers the friendly rewrite to the raw trace on
    ≥ 90 % of questions (the untrained model as teacher and student, as at the start of RL). The calibration used
    seed 0; this is another seed. The old mix (check-last, digits, detour) fails here: 35/40."""
    from rlt.data.models import load_model, load_tokenizer
    from rlt.method.reward import RLTReward

    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    ref = ModelRef(model="builtin:smollm2-135m-instruct")
    model, tok = load_model(ref, "cpu"), load_tokenizer(ref, padding_side="right")
    reward = RLTReward(model, tok, formatter, teacher=model, teacher_tokenizer=tok, temperature=0.7)
    rows = tasks.generate("sums-detour", 40, seed=1)
    qs, sols = [r["question"] for r in rows], [r["solution"] for r in rows]
    raw = reward.score(qs, sols, [formatter.teacher_completion(r["reasoning_trace"], "") for r in rows]).total
    rewrites = [headroom.friendly_trace(*headroom.operands(q)) for q in qs]
    friendly = reward.score(qs, sols, [formatter.teacher_completion(f, "") for f in rewrites]).total
    wins = sum(f > r for f, r in zip(friendly, raw, strict=True))
    shapes = {headroom.shape_of(r["question"], r["reasoning_trace"]) for r in rows}
    assert shapes == set(headroom.MIX) and wins >= 0.9 * len(rows), f"friendly above raw on {wins}/{len(rows)}"
