"""Built-in tasks: arithmetic, countdown and the calibrated `basic` family, with worked reasoning, from a seed.

Every row has `question`, `reasoning_trace` (a worked solution a student could follow) and `solution`
(the final answer sentence). Same seed, same rows, on any machine.
"""

from __future__ import annotations

import ast
import itertools
import random
import re
from collections.abc import Callable

from rlt.data.task_rows import BasicRow, TaskRow

BASIC_LEVELS = (1, 2, 3, 4)
TASKS = ("arithmetic", "countdown", "mixed", "basic", "sums", "sums-detour") + tuple(f"basic-{n}" for n in BASIC_LEVELS)
_OPS: dict[str, Callable[[int, int], int]] = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


def arithmetic_problem(rng: random.Random) -> TaskRow:
    """(a op1 b) op2 c with small integers, solved in two written steps."""
    a, b, c = rng.randint(2, 30), rng.randint(2, 30), rng.randint(2, 12)
    op1, op2 = rng.choice("+-*"), rng.choice("+-*")
    first = _OPS[op1](a, b)
    result = _OPS[op2](first, c)
    question = f"What is ({a} {op1} {b}) {op2} {c}?"
    trace = (
        f"Work inside the parentheses first: {a} {op1} {b} = {first}.\n"
        f"Then apply the remaining operation: {first} {op2} {c} = {result}."
    )
    return {"question": question, "reasoning_trace": trace, "solution": f"The answer is {result}."}


def _countdown_solutions(nums: list[int]) -> list[tuple[str, int, str, int]]:
    """All ((x op y) op z) expressions over a permutation of three numbers, with intermediate values."""
    out = []
    for x, y, z in itertools.permutations(nums):
        for op1, op2 in itertools.product("+-*", repeat=2):
            first = _OPS[op1](x, y)
            out.append((f"{x} {op1} {y}", first, f"({x} {op1} {y}) {op2} {z}", _OPS[op2](first, z)))
    return out


def countdown_problem(rng: random.Random) -> TaskRow:
    """Reach a target with three numbers, each used once, and + - *."""
    nums = [rng.randint(1, 15) for _ in range(3)]
    candidates = [c for c in _countdown_solutions(nums) if c[3] > 0]
    inner, first, expr, target = rng.choice(candidates)
    question = f"Using each of the numbers {nums[0]}, {nums[1]} and {nums[2]} exactly once with + - *, make {target}."
    trace = (
        f"Look for an intermediate value that gets close to {target}.\n"
        f"{inner} = {first}.\n"
        f"Combining {first} with the last number: {expr} = {target}, which is the target."
    )
    return {"question": question, "reasoning_trace": trace, "solution": f"{expr} = {target}"}


# ---- the calibrated family `basic`: one small-number question per row, sized for a ~135M student.
# Levels (measured accuracies in docs/data-formats.md, script benchmarks/task_calibration.py):
#   1 add two one-digit numbers, 2 the larger of two two-digit numbers, 3 the smallest of three two-digit numbers,
#   4 a times-table product. Tried and left out for levels 2-3, because the untrained student was outside the
#   20-60 % band a teaching effect needs: two-digit sums and differences (0-11 %: it copies the first number) and
#   the smaller of two numbers (73 %: it leans to the smaller one). The solution is the bare number, so the RLT
#   reward's r_SS measures the student's confidence in the answer digits and nothing else.
_BASIC_Q = re.compile(r"^What is (\d+) ([+*]) (\d+)\?$")
_BASIC_LARGER = re.compile(r"^Which is larger, (\d+) or (\d+)\?$")
_BASIC_SMALLEST = re.compile(r"^Which is the smallest of (\d+), (\d+) and (\d+)\?$")


def _comparison_problem(rng: random.Random, level: int) -> BasicRow:
    # the first line of a trace says how to compare, without the answer (the rcl warm-up uses it as guidance)
    if level == 2:
        a, b = rng.sample(range(10, 100), 2)
        result, question = max(a, b), f"Which is larger, {a} or {b}?"
        if a // 10 != b // 10:
            how = f"Compare the tens: {a // 10} tens against {b // 10} tens."
        else:
            how = f"Both have {a // 10} tens, so compare the ones: {a % 10} against {b % 10}."
        trace = f"{how}\nSo the larger number is {result}."
    else:
        nums = rng.sample(range(10, 100), 3)
        result, question = min(nums), f"Which is the smallest of {nums[0]}, {nums[1]} and {nums[2]}?"
        tens = [n // 10 for n in nums]
        ties = ", then the ones where the tens are equal" if len(set(tens)) < 3 else ""
        trace = f"Compare the tens digits: {', '.join(map(str, tens))}{ties}.\nSo the smallest number is {result}."
    return {"question": question, "reasoning_trace": trace, "solution": str(result), "level": level}


def basic_problem(rng: random.Random, level: int) -> BasicRow:
    if level in (2, 3):
        return _comparison_problem(rng, level)
    if level == 1:
        a, b, op = rng.randint(1, 9), rng.randint(1, 9), "+"
    elif level == 4:
        a, b, op = rng.randint(2, 9), rng.randint(2, 9), "*"
    else:
        raise ValueError(f"basic task: unknown level {level} (levels {BASIC_LEVELS})")
    result = _OPS[op](a, b)
    if op == "*":
        steps = f"{a} * {b} means {b} added {a} times" if a <= 4 else f"{a} * {b} is {a} times {b}"
        trace = f"{steps}.\n{a} * {b} = {result}."
    else:
        trace = f"Start at {a} and count up {b}.\n{a} + {b} = {result}."
    return {"question": f"What is {a} {op} {b}?", "reasoning_trace": trace, "solution": str(result), "level": level}


def _basic_value(question: str) -> tuple[int, int] | None:
    """(level, value) of a `basic` question, recomputed from its text; None for any other question."""
    q = question.strip()
    m = _BASIC_Q.match(q)
    if m is not None:
        a, op, b = int(m.group(1)), m.group(2), int(m.group(3))
        return (1 if op == "+" else 4), _OPS[op](a, b)
    m = _BASIC_LARGER.match(q)
    if m is not None:
        return 2, max(int(g) for g in m.groups())
    m = _BASIC_SMALLEST.match(q)
    if m is not None:
        return 3, min(int(g) for g in m.groups())
    return None


# ---- `sums`: two-digit + two-digit. The answer is not among the question's numbers and the untrained 135M student
# does not guess it (it copies the first number), but it follows a tens/ones decomposition: a task on which an
# explanation can teach, and on which stating the bare answer is visible to r_KL (see docs/experiments.md).
_SUMS_Q = re.compile(r"^What is (\d+) \+ (\d+)\?$")


def sums_problem(rng: random.Random) -> TaskRow:
    a, b = rng.randint(10, 99), rng.randint(10, 99)
    tens, ones = (a // 10 + b // 10) * 10, a % 10 + b % 10
    trace = f"Add the tens: {a // 10 * 10} + {b // 10 * 10} = {tens}.\nAdd the ones: {a % 10} + {b % 10} = {ones}.\n"
    trace += f"Together: {tens} + {ones} = {a + b}."
    return {"question": f"What is {a} + {b}?", "reasoning_trace": trace, "solution": str(a + b)}


def check_sums(question: str, answer: str | None) -> bool | None:
    """None if `question` is not a `sums` question; else whether the extracted answer is the sum."""
    m = _SUMS_Q.match(question.strip())
    if m is None or max(len(m.group(1)), len(m.group(2))) < 2:
        return None  # one-digit sums are `basic` level 1
    from rlt.data.answers import extract_answer, normalize

    return normalize(extract_answer(answer or "")) == str(int(m.group(1)) + int(m.group(2)))


def basic_level(question: str) -> int | None:
    """The level of a `basic` question, None for any other question."""
    found = _basic_value(question)
    return None if found is None else found[0]


def check_basic(question: str, answer: str | None) -> bool | None:
    """None if `question` is not a `basic` question; else whether `answer` (text whose extracted final
    answer is compared) is the right value, recomputed from the question itself."""
    found = _basic_value(question)
    if found is None:
        return None
    from rlt.data.answers import extract_answer, normalize

    got = normalize(extract_answer(answer or ""))
    return got == str(found[1])


def check_builtin(question: str, answer: str | None) -> bool | None:
    """The built-in checker that knows `question` (countdown or basic), or None when none does."""
    for check in (check_countdown, check_sums, check_basic):
        verdict = check(question, answer)
        if verdict is not None:
            return verdict
    return None


def verify_builtin(question: str, output: str, answer_tags: tuple[str, str]) -> tuple[str, bool | None]:
    """(the answer read from a model's `output`, the built-in checker's verdict on it, or None when no checker knows
    `question`). The answer is the last answer block (open at the end if unclosed), else the output's last line. The
    one reading of built-in answers: the evaluate stage and rcl's student grading both call it."""
    from rlt.data.answers import between

    block = between(output, *answer_tags, last=True, open_end=True)
    lines = [ln for ln in output.strip().splitlines() if ln.strip()]
    answer = block.strip() if block is not None else (lines[-1] if lines else "")
    return answer, check_builtin(question, answer)


def generate(task: str, size: int, seed: int = 0) -> list[TaskRow]:
    if task not in TASKS:
        raise ValueError(f"spec.dataset.source: unknown built-in task {task!r} (choose from {', '.join(TASKS)})")
    rng = random.Random(f"rlt-{task}-{seed}")
    if task == "sums":
        return [sums_problem(rng) for _ in range(size)]
    if task == "sums-detour":  # correct traces unfriendly to the student: room to teach (rlt.data.headroom)
        from rlt.data.headroom import detour_problem

        return [detour_problem(rng) for _ in range(size)]
    if task.startswith("basic"):
        levels = BASIC_LEVELS if task == "basic" else (int(task.removeprefix("basic-")),)
        return [basic_problem(rng, levels[i % len(levels)]) for i in range(size)]
    makers = {"arithmetic": [arithmetic_problem], "countdown": [countdown_problem]}.get(
        task, [arithmetic_problem, countdown_problem]
    )
    return [makers[i % len(makers)](rng) for i in range(size)]


_COUNTDOWN_Q = re.compile(r"Using each of the numbers (\d+), (\d+) and (\d+) exactly once with \+ - \*, make (-?\d+)\.")


def _eval_int_expr(node: ast.AST) -> tuple[int, list[int]]:
    """Value of an integer + - * expression and the literals it uses; anything else raises ValueError."""
    if isinstance(node, ast.Expression):
        return _eval_int_expr(node.body)
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value, [node.value]
    if isinstance(node, ast.BinOp) and type(node.op) in (ast.Add, ast.Sub, ast.Mult):
        (a, la), (b, lb) = _eval_int_expr(node.left), _eval_int_expr(node.right)
        value = a + b if isinstance(node.op, ast.Add) else a - b if isinstance(node.op, ast.Sub) else a * b
        return value, la + lb
    raise ValueError("not an integer + - * expression")


def check_countdown(question: str, answer: str | None) -> bool | None:
    """None if `question` is not a countdown problem; else whether `answer` (an expression, optionally
    followed by '= target') uses each given number exactly once and reaches the target."""
    m = _COUNTDOWN_Q.search(question)
    if m is None:
        return None
    if not answer:
        return False
    *nums, target = (int(g) for g in m.groups())
    expr, *claims = answer.strip().rstrip(".").replace("×", "*").split("=")
    expr = expr.strip()
    if not expr or len(expr) > 100 or any(c.strip() != str(target) for c in claims):
        return False  # a stated result must be the target
    try:
        value, used = _eval_int_expr(ast.parse(expr, mode="eval"))
    except (SyntaxError, ValueError):
        return False
    return sorted(used) == sorted(nums) and value == target
