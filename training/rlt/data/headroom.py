"""`builtin:sums-detour` (issue 46): the two-digit sums of `builtin:sums`, but each dataset trace is correct and
unfriendly to a small student, so a teacher has room to teach better than the data.

RLT's advantage in the paper comes from rewriting traces that are right but hard for the student to follow; on
`sums` the worked trace is already near the reward's optimum (the 135M student answers 0.95 with it), so RL can at
best tie SFT there. Here every statement of a trace is true, but the trace takes one of three unfriendly shapes
(chosen per question by the generator's seed):

  check-last  the total is stated, then a subtraction check ends the trace on the first addend;
  digits      ones first with a carry, the total never written as one number (the student must join the digits);
  detour      an overshoot by rounding up, then taking the excess back, with the round number stated last but one.

`friendly_trace` is the rewrite that exists for every question: the `sums` worked trace (tens, ones, together).
benchmarks/headroom_calibration.py measures the student with both; tests check that every statement is true.
"""

from __future__ import annotations

import random
import re

from rlt.data.task_rows import TaskRow

SHAPES = ("check-last", "digits", "detour")
_Q = re.compile(r"^What is (\d+) \+ (\d+)\?$")


def friendly_trace(a: int, b: int) -> str:
    """The friendly rewrite: the `builtin:sums` worked trace."""
    tens, ones = (a // 10 + b // 10) * 10, a % 10 + b % 10
    trace = f"Add the tens: {a // 10 * 10} + {b // 10 * 10} = {tens}.\nAdd the ones: {a % 10} + {b % 10} = {ones}.\n"
    return trace + f"Together: {tens} + {ones} = {a + b}."


def raw_trace(a: int, b: int, shape: str) -> str:
    """A correct, unfriendly trace of a + b in the given shape."""
    total = a + b
    if shape == "check-last":
        return (
            f"Ones: {a % 10} + {b % 10} = {a % 10 + b % 10}. Tens: {a // 10 * 10} + {b // 10 * 10} = "
            f"{(a // 10 + b // 10) * 10}. So the sum is {total}.\nCheck by taking {b} back: {total} - {b} = {a}."
        )
    if shape == "digits":
        ones = a % 10 + b % 10
        carry = ones // 10
        tens = a // 10 + b // 10 + carry
        return (
            f"Ones digits: {a % 10} + {b % 10} = {ones}; write {ones % 10}, carry {carry}.\n"
            f"Tens digits: {a // 10} + {b // 10} + {carry} = {tens}.\nSo the tens part is {tens} and the ones digit "
            f"is {ones % 10}."
        )
    if shape == "detour":
        up = (b // 10 + 1) * 10
        over = a + up
        return (
            f"{b} is close to {up}, so first add {up}: {a} + {up} = {over}.\nThat was {up - b} too many, so take "
            f"{up - b} away: {over} - {up - b} = {total}.\nThe round number {up} made it easy."
        )
    raise ValueError(f"shape {shape!r}: choose from {', '.join(SHAPES)}")


def detour_problem(rng: random.Random) -> TaskRow:
    a, b = rng.randint(10, 99), rng.randint(10, 89)  # b ≤ 89: the detour rounds b up to at most 90
    shape = SHAPES[rng.randrange(len(SHAPES))]
    return {"question": f"What is {a} + {b}?", "reasoning_trace": raw_trace(a, b, shape), "solution": str(a + b)}


def operands(question: str) -> tuple[int, int]:
    """The two addends of a `sums-detour` (or `sums`) question."""
    m = _Q.match(question.strip())
    if m is None:
        raise ValueError(f"question {question!r}: not of the form 'What is A + B?'")
    return int(m.group(1)), int(m.group(2))


def shape_of(trace: str) -> str:
    """Which unfriendly shape a raw trace has (for per-shape calibration)."""
    if trace.startswith("Ones digits"):
        return "digits"
    if trace.startswith("Ones:"):
        return "check-last"
    if "is close to" in trace:
        return "detour"
    raise ValueError(f"trace {trace[:40]!r}...: not a sums-detour trace")
