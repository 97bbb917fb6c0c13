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


@pytest.mark.parametrize(
    ("output", "reference", "right"),
    [
        # an answer block that is the answer itself is compared whole, not by its last number
        ("<answer>\\frac{1}{2}</answer>", "\\frac{1}{2}", True),
        ("<answer>$\\dfrac{1}{2}$</answer>", "1/2", True),
        ("<answer>\\frac{3}{2}</answer>", "2", False),  # not the denominator
        ("<answer>2\\pi</answer>", "2", False),
        ("<answer>2\\pi</answer>", "2\\pi", True),
        ("<answer>10^{3}</answer>", "3", False),  # not the exponent
        # a block with a sentence, a box or a unit is still read inside
        ("<answer>5 apples</answer>", "5", True),
        ("<answer>5 \\text{cm}</answer>", "5", True),
        ("<answer>so \\boxed{5}</answer>", "5", True),
        ("<answer>x = 5</answer>", "5", True),
        # a decimal point does not end the sentence
        ("The answer is 3.5", "3.5", True),
        ("The answer is 3.5", "3", False),
        ("<answer>The final answer is 0.75.</answer>", "0.75", True),
        ("<answer>The final answer is 0.75.</answer>", "0", False),
        ("The answer is 57. Then we stop.", "57", True),
        ("**The answer is 42.**", "42", True),  # a full stop before markup ends the sentence
        ("(the answer is 42.)", "42", True),
        # graded right before the whole-block rule, still right: delimiters, spacing, currency, derivations
        ("<answer>\\$18</answer>", "18", True),
        ("<answer>\\$18.00</answer>", "18", True),
        ("<answer>\\( 5 \\)</answer>", "5", True),
        ("<answer>\\[5\\]</answer>", "5", True),
        ("<answer>5 \\, \\text{cm}</answer>", "5", True),
        ("<answer>3 \\cdot 4 = 12</answer>", "12", True),
        ("<answer>2^{10} = 1024</answer>", "1024", True),
        ("<answer>x^2=9 \\implies x = 3</answer>", "3", True),
        # a list of numbers is one answer: a hedge is not paid by its last number, a tuple or interval is right whole
        ("<answer>3 or 4</answer>", "4", False),
        ("<answer>1, 3</answer>", "3", False),
        ("<answer>x = 2 or x = 3</answer>", "3", False),
        ("<answer>2, 3</answer>", "2, 3", True),
        ("<answer>(3, 4)</answer>", "(3, 4)", True),
        ("<answer>[2, 5)</answer>", "[2, 5)", True),
        ("<answer>1,234</answer>", "1234", True),  # a thousands separator is not a list
        # a reference in answer tags is read as an output's block is
        ("<answer>18</answer>", "<answer>18 dollars</answer>", True),
        ("<answer>1024</answer>", "<answer>2^{10} = 1024</answer>", True),
    ],
)
def test_an_answer_is_read_whole_where_it_is_whole(output, reference, right):
    assert is_correct(output, reference, TAGS) is right


def test_the_sums_checker_reads_what_it_read_before():
    """The built-in sums checker (the teaching comparison's grader) reads an answer block without tags: the
    whole-block rule above does not reach it, and integer answers read as before."""
    from rlt.data.tasks import check_sums

    assert check_sums("What is 23 + 34?", "57") is True
    assert check_sums("What is 23 + 34?", "The answer is 57.") is True
    assert check_sums("What is 23 + 34?", "23 + 34 = 57") is True
    assert check_sums("What is 23 + 34?", "56") is False
    assert check_sums("What is 23 + 34?", "56 or 57") is True  # its last number, as before the list rule
