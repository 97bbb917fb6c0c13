"""The calibrated built-in task `basic`: seeded, levelled, its traces reach its answers, and its own checker."""

import re

import pytest

from rlt.data import tasks
from rlt.stages.evaluate import grade

TAGS = ("<answer>", "</answer>")


def test_basic_is_seeded_levelled_and_consistent():
    rows = tasks.generate("basic", 40, seed=3)
    assert rows == tasks.generate("basic", 40, seed=3) and rows != tasks.generate("basic", 40, seed=4)
    assert [tasks.basic_level(r["question"]) for r in rows[:4]] == [1, 2, 3, 4]
    for row in rows:
        assert tasks.basic_level(row["question"]) == row["level"]
        assert tasks.check_basic(row["question"], row["solution"]) is True
        # the worked reasoning ends on the answer: a student shown it can read the answer off
        assert row["reasoning_trace"].rstrip(".").endswith(f" {row['solution']}")
        assert tasks.check_basic(row["question"], row["reasoning_trace"]) is True
    for level in tasks.BASIC_LEVELS:
        assert {tasks.basic_level(r["question"]) for r in tasks.generate(f"basic-{level}", 20)} == {level}


@pytest.mark.parametrize(
    "output,want",
    [
        ("<think>9 + 6</think>\n<answer>15</answer>", True),
        ("<answer>The answer is 15.</answer>", True),
        ("<answer>16</answer>", False),
        ("no tags, the last number counts: 15", True),
        ("<answer>fifteen</answer>", False),
        ("", False),
    ],
)
def test_basic_checker_recomputes_from_the_question(output, want):
    # the reference solution is deliberately wrong: the checker must not read it
    assert grade({"question": "What is 9 + 6?", "solution": "99"}, output, "builtin", TAGS)[1] is want


def _numbers(question: str) -> list[int]:
    return [int(x) for x in re.findall(r"\d+", question)]


@pytest.mark.parametrize("level,count,pick", [(2, 2, max), (3, 3, min)])
def test_comparison_levels_pick_among_distinct_two_digit_numbers_in_no_fixed_position(level, count, pick):
    # levels 2 and 3 replaced two-digit sums/differences, where the untrained student copies the first number
    rows = tasks.generate(f"basic-{level}", 300, seed=0)
    positions = []
    for row in rows:
        nums = _numbers(row["question"])
        assert len(nums) == count == len(set(nums)) and all(10 <= n <= 99 for n in nums)
        assert row["solution"] == str(pick(nums))
        for n in nums:  # only the right number passes the checker
            assert tasks.check_basic(row["question"], f"<answer>{n}</answer>") is (n == pick(nums))
        assert str(pick(nums)) not in row["reasoning_trace"].splitlines()[0]  # first line: how, not the answer
        positions.append(nums.index(pick(nums)))
    # copying a fixed position is no winning strategy: the answer sits in each position about equally often
    for i in range(count):
        assert abs(positions.count(i) / len(rows) - 1 / count) < 0.1


def test_checker_ignores_other_questions():
    assert tasks.check_basic("What is (2 + 3) * 4?", "20") is None
    assert tasks.check_basic("What is 42 - 5?", "37") is None  # subtraction is no longer a basic level
    assert tasks.check_basic("Which is larger, 47 or 52?", "<answer>52</answer>") is True
    assert tasks.check_basic("Which is the smallest of 47, 52 and 18?", "<answer>18</answer>") is True
    assert tasks.check_basic("Which is the smallest of 47, 52 and 18?", "The answer is 47.") is False
    assert tasks.check_basic("Which is smaller, 47 or 52?", "47") is None  # not a basic question
    assert tasks.check_builtin("What is 7 * 8?", "56") is True
    with pytest.raises(ValueError, match="unknown built-in task 'basic-9'"):
        tasks.generate("basic-9", 1)


def test_sums_are_seeded_two_digit_and_their_traces_add_up():
    rows = tasks.generate("sums", 200, seed=0)
    assert rows == tasks.generate("sums", 200, seed=0) and rows != tasks.generate("sums", 200, seed=1)
    for row in rows:
        a, b = (int(x) for x in re.findall(r"\d+", row["question"]))
        assert 10 <= a <= 99 and 10 <= b <= 99 and row["solution"] == str(a + b)
        # the answer is not one of the question's numbers: stating it is not copying
        assert row["solution"] not in (str(a), str(b))
        # every equation in the trace is true, and the last one ends on the answer
        for left, right in re.findall(r"(\d+ \+ \d+) = (\d+)", row["reasoning_trace"]):
            x, y = map(int, left.split(" + "))
            assert x + y == int(right)
        assert row["reasoning_trace"].endswith(f"= {row['solution']}.")
        assert tasks.check_builtin(row["question"], f"<answer>{row['solution']}</answer>") is True
        assert tasks.check_builtin(row["question"], f"<answer>{a}</answer>") is False


def test_sums_checker_leaves_one_digit_sums_to_basic():
    assert tasks.check_sums("What is 3 + 4?", "7") is None  # basic level 1
    assert tasks.check_builtin("What is 3 + 4?", "7") is True
    assert tasks.check_sums("Which is larger, 67 or 57?", "67") is None
    assert tasks.check_sums("What is 23 + 45?", "The answer is 68.") is True
    assert tasks.check_sums("What is 23 + 45?", None) is False
