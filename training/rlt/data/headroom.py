"""`builtin:sums-detour` (issue 46): the two-digit sums of `builtin:sums`, but each dataset trace is correct and
unfriendly to a small student, so a teacher has room to teach better than the data.

RLT's advantage in the paper comes from rewriting traces that are right but hard for the student to follow; on
`sums` the worked trace is already near the reward's optimum (the 135M student answers 0.95 with it), so RL can at
best tie SFT there. Here every statement of a trace is true, but the trace takes an unfriendly shape, chosen per
question by the generator's seed with the weights of `MIX` (shapes the untrained 135M student follows about half the
time, and on which the RLT reward prefers the friendly rewrite; docs/experiments.md):

  check-repeat  ones then tens, the total, a subtraction check, the total again (weight 2);
  check-first   the subtraction check first, then the sum as one statement, no working (weight 1);
  total-first   the total said first, then the tens, ones and their join (weight 1).

Other shapes, calibrated and not in the mix (the student follows them never or seldom, or the reward does not prefer the
rewrite): check-last (ends on the check's first addend), digits (the total never written as one number), detour
(round the second addend up, take the excess back), reversed ('total = tens + ones, because ...'), ones-last
(ends on the ones sum).

`friendly_trace` is the rewrite that exists for every question: the `sums` worked trace (tens, ones, together).
benchmarks/headroom_calibration.py measures the student with both; tests check that every statement is true.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable

from rlt.data.task_rows import TaskRow

_Q = re.compile(r"^What is (\d+) \+ (\d+)\?$")


def _parts(a: int, b: int) -> tuple[int, int, int, int, int]:
    """The tens of a and b (as round numbers), their sum, the ones sum, the total."""
    ta, tb = a // 10 * 10, b // 10 * 10
    return ta, tb, ta + tb, a % 10 + b % 10, a + b


def _check_last(a: int, b: int) -> str:
    ta, tb, tens, ones, total = _parts(a, b)
    return (
        f"Ones: {a % 10} + {b % 10} = {ones}. Tens: {ta} + {tb} = {tens}. So the sum is {total}.\n"
        f"Check by taking {b} back: {total} - {b} = {a}."
    )


def _digits(a: int, b: int) -> str:
    ones = a % 10 + b % 10
    carry = ones // 10
    tens = a // 10 + b // 10 + carry
    return (
        f"Ones digits: {a % 10} + {b % 10} = {ones}; write {ones % 10}, carry {carry}.\n"
        f"Tens digits: {a // 10} + {b // 10} + {carry} = {tens}.\nSo the tens part is {tens} and the ones digit "
        f"is {ones % 10}."
    )


def _detour(a: int, b: int) -> str:
    up = (b // 10 + 1) * 10
    over = a + up
    return (
        f"{b} is close to {up}, so first add {up}: {a} + {up} = {over}.\nThat was {up - b} too many, so take "
        f"{up - b} away: {over} - {up - b} = {a + b}.\nThe round number {up} made it easy."
    )


def _total_first(a: int, b: int) -> str:
    ta, tb, tens, ones, total = _parts(a, b)
    return (
        f"The sum is {total}: the tens give {ta} + {tb} = {tens}, the ones give {a % 10} + {b % 10} = {ones}, "
        f"and {tens} + {ones} = {total}."
    )


def _reversed(a: int, b: int) -> str:
    ta, tb, tens, ones, total = _parts(a, b)
    return f"{total} = {tens} + {ones}, because {ta} + {tb} = {tens} and {a % 10} + {b % 10} = {ones}."


def _check_first(a: int, b: int) -> str:
    total = a + b
    return f"Taking {b} back from {total} leaves {a}: {total} - {b} = {a}.\nSo {a} + {b} = {total}."


def _check_repeat(a: int, b: int) -> str:
    ta, tb, tens, ones, total = _parts(a, b)
    return (
        f"Ones then tens: {a % 10} + {b % 10} = {ones} and {ta} + {tb} = {tens}, so the sum is {total}.\n"
        f"Check by taking {b} back: {total} - {b} = {a}, so the sum is {total}."
    )


def _ones_last(a: int, b: int) -> str:
    ta, tb, tens, ones, total = _parts(a, b)
    return (
        f"Tens: {ta} + {tb} = {tens}. Together with the ones, {tens} + {ones} = {total}, where the ones are "
        f"{a % 10} + {b % 10} = {ones}."
    )


_BUILDERS: dict[str, Callable[[int, int], str]] = {
    "check-last": _check_last,
    "digits": _digits,
    "detour": _detour,
    "total-first": _total_first,
    "reversed": _reversed,
    "check-first": _check_first,
    "check-repeat": _check_repeat,
    "ones-last": _ones_last,
}
SHAPES = tuple(_BUILDERS)
# The dataset's mix: shape -> weight of the generator's choice per question
MIX: dict[str, float] = {"check-repeat": 2.0, "check-first": 1.0, "total-first": 1.0}


def friendly_trace(a: int, b: int) -> str:
    """The friendly rewrite: the `builtin:sums` worked trace."""
    tens, ones = (a // 10 + b // 10) * 10, a % 10 + b % 10
    trace = f"Add the tens: {a // 10 * 10} + {b // 10 * 10} = {tens}.\nAdd the ones: {a % 10} + {b % 10} = {ones}.\n"
    return trace + f"Together: {tens} + {ones} = {a + b}."


def raw_trace(a: int, b: int, shape: str) -> str:
    """A correct, unfriendly trace of a + b in the given shape."""
    if shape not in _BUILDERS:
        raise ValueError(f"shape {shape!r}: choose from {', '.join(SHAPES)}")
    return _BUILDERS[shape](a, b)


def detour_problem(rng: random.Random) -> TaskRow:
    a, b = rng.randint(10, 99), rng.randint(10, 89)  # b ≤ 89: the detour rounds b up to at most 90
    shape = rng.choices(list(MIX), weights=list(MIX.values()))[0]
    return {"question": f"What is {a} + {b}?", "reasoning_trace": raw_trace(a, b, shape), "solution": str(a + b)}


def operands(question: str) -> tuple[int, int]:
    """The two addends of a `sums-detour` (or `sums`) question."""
    m = _Q.match(question.strip())
    if m is None:
        raise ValueError(f"question {question!r}: not of the form 'What is A + B?'")
    return int(m.group(1)), int(m.group(2))


def shape_of(question: str, trace: str) -> str:
    """Which unfriendly shape a raw trace of the question has (for per-shape calibration)."""
    a, b = operands(question)
    for shape in SHAPES:
        if raw_trace(a, b, shape) == trace:
            return shape
    raise ValueError(f"trace {trace[:40]!r}...: not a sums-detour trace of {question!r}")
