"""Answer extraction and normalisation (shared by RCL rewards and evaluation)."""

import pytest

from rlt.data.answers import boxed_contents, extract_answer, is_correct, normalize

TAGS = ("<answer>", "</answer>")


@pytest.mark.parametrize(
    "text,want",
    [
        ("so the result is \\boxed{42}.", "42"),
        ("first \\boxed{1} then \\boxed{\\frac{3}{4}}", "\\frac{3}{4}"),
        ("nested \\boxed{\\sqrt{\\frac{1}{2}}} end", "\\sqrt{\\frac{1}{2}}"),
        ("<think>7 * 2</think><answer>The answer is 14.</answer>", "14"),
        ("Therefore, the final answer is: 1,234.", "1,234"),
        ("we get 3 and then 5 and finally 8", "8"),
        ("no digits here at all", None),
        ("unclosed \\boxed{12", "12"),
    ],
)
def test_extract(text, want):
    assert extract_answer(text, TAGS) == want


@pytest.mark.parametrize(
    "raw,want",
    [
        ("1,234", "1234"),
        ("1,234,567", "1234567"),
        ("\\frac{6}{8}", "3/4"),
        ("\\dfrac{10}{5}", "2"),
        ("0.50", "1/2"),
        ("-3", "-3"),
        ("x = 5", "5"),
        ("\\boxed{7}", "7"),
        ("50\\%", "50"),
        ("(B)", "B"),
        ("C. Paris", "C"),
        ("  Paris ", "paris"),
        ("3/0", "3/0"),
        ("1,2", "1,2"),
        (None, None),
    ],
)
def test_normalize(raw, want):
    assert normalize(raw) == want


def test_is_correct():
    assert is_correct("... so \\boxed{0.75}", "\\frac{3}{4}")
    assert is_correct("<answer>The answer is 98.</answer>", "The answer is 98.", TAGS)
    assert not is_correct("<answer>97</answer>", "The answer is 98.", TAGS)
    assert not is_correct("I do not know", "98")
    assert is_correct("The answer is (b)", "B") is False  # lowercase letters are not choices
    assert boxed_contents("\\boxed{a{b}c}") == ["a{b}c"]
