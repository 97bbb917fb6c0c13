"""The calibrated built-in task `basic`: seeded, levelled, its traces reach its answers, and its own checker."""

import pytest

from rlt import tasks
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


def test_comparison_levels_ask_for_the_larger_or_smaller_of_two_distinct_two_digit_numbers():
    # levels 2 and 3 replaced two-digit sums/differences, where the untrained student copies the first number
    for level, word, pick in ((2, "larger", max), (3, "smaller", min)):
        rows = tasks.generate(f"basic-{level}", 200, seed=0)
        firsts = 0
        for row in rows:
            q = row["question"]
            assert q.startswith(f"Which is {word}, ")
            a, b = (int(x) for x in q.removeprefix(f"Which is {word}, ").rstrip("?").split(" or "))
            assert a != b and 10 <= a <= 99 and 10 <= b <= 99
            assert row["solution"] == str(pick(a, b))
            assert tasks.check_basic(q, f"<answer>{pick(a, b)}</answer>") is True
            other = a + b - pick(a, b)
            assert tasks.check_basic(q, f"<answer>{other}</answer>") is False
            firsts += row["solution"] == str(a)
        # copying the first number must not be a winning strategy: the answer is first about half the time
        assert 70 <= firsts <= 130


def test_checker_ignores_other_questions():
    assert tasks.check_basic("What is (2 + 3) * 4?", "20") is None
    assert tasks.check_basic("What is 42 - 5?", "37") is None  # subtraction is no longer a basic level
    assert tasks.check_basic("Which is larger, 47 or 52?", "<answer>52</answer>") is True
    assert tasks.check_basic("Which is smaller, 47 or 52?", "<answer>52</answer>") is False
    assert tasks.check_builtin("What is 7 * 8?", "56") is True
    with pytest.raises(ValueError, match="unknown built-in task 'basic-9'"):
        tasks.generate("basic-9", 1)
