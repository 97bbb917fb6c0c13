"""Built-in tasks: arithmetic and countdown problems with worked reasoning, generated from a seed.

Every row has `question`, `reasoning_trace` (a worked solution a student could follow) and `solution`
(the final answer sentence). Same seed, same rows, on any machine.
"""

from __future__ import annotations

import ast
import itertools
import random
import re

TASKS = ("arithmetic", "countdown", "mixed")
_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


def arithmetic_problem(rng: random.Random) -> dict[str, str]:
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


def countdown_problem(rng: random.Random) -> dict[str, str]:
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


def generate(task: str, size: int, seed: int = 0) -> list[dict[str, str]]:
    if task not in TASKS:
        raise ValueError(f"spec.dataset.source: unknown built-in task {task!r} (choose from {', '.join(TASKS)})")
    rng = random.Random(f"rlt-{task}-{seed}")
    makers = {"arithmetic": [arithmetic_problem], "countdown": [countdown_problem]}.get(
        task, [arithmetic_problem, countdown_problem]
    )
    return [makers[i % len(makers)](rng) for i in range(size)]


_COUNTDOWN_Q = re.compile(r"Using each of the numbers (\d+), (\d+) and (\d+) exactly once with \+ - \*, make (-?\d+)\.")


def _eval_int_expr(node) -> tuple[int, list[int]]:
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
