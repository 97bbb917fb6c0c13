"""Evaluation and compare, the pure parts: grading per answer type, pass@1, over-long policies, benchmarks, Pearson."""

import pytest

from rlt.data.benchmarks import benchmark_row, find_benchmark
from rlt.data.dataset import DataError
from rlt.data.eval_set import resolve_answer_type
from rlt.data.tasks import check_countdown, generate
from rlt.method.prompts import Formatter, resolve_format
from rlt.run.compare import compare_stages, pearson
from rlt.spec.inputs import FormatSpec
from rlt.spec.loading import SpecError, parse_run
from rlt.stages.evaluate import grade, pass_at_1
from rlt.stages.student import choose_rows

TAGS = ("<answer>", "</answer>")
COUNTDOWN = "Using each of the numbers 6, 3 and 11 exactly once with + - *, make 69."
FMT = Formatter(resolve_format(FormatSpec()))


@pytest.mark.parametrize(
    "answer_type,row,output,want",
    [
        (
            "math",
            {"question": "What is (2 + 3) * 4?", "solution": "The answer is 20."},
            "<think>5 * 4</think>\n<answer>The answer is 20.</answer>",
            ("20", True),
        ),
        ("math", {"question": "q", "solution": "The answer is 20."}, "<answer>21</answer>", ("21", False)),
        ("math", {"question": "q", "solution": "\\frac{1}{2}"}, "so \\boxed{0.5}", ("0.5", True)),
        ("math", {"question": "q", "solution": "1,234"}, "no answer block, the total is 1234", ("1234", True)),
        ("math", {"question": "q", "solution": "7"}, "I cannot say", (None, False)),
        ("choice", {"question": "q", "solution": "C"}, "<answer>(C)</answer>", ("C", True)),
        ("choice", {"question": "q", "solution": "C"}, "The answer is B.", ("B", False)),
        # an option's text after its letter: the letter, not the option's number (no number fallback in the tags)
        ("choice", {"question": "q", "solution": "C"}, "<answer>C. 4 electrons</answer>", ("C", True)),
        ("choice", {"question": "q", "solution": "B"}, "<answer>(B) 3 bonds</answer>", ("B", True)),
        (
            "choice",
            {"question": "q", "solution": "C"},
            "it costs 3 dollars",
            (None, False),
        ),  # no letter, no number fallback
        (
            "builtin",
            {"question": COUNTDOWN, "solution": "(11 * 6) + 3 = 69"},
            "<answer>(6 * 11) + 3 = 69</answer>",
            ("(6 * 11) + 3 = 69", True),
        ),
        ("builtin", {"question": COUNTDOWN, "solution": "(11 * 6) + 3 = 69"}, "<answer>69</answer>", ("69", False)),
        (
            "builtin",
            {"question": COUNTDOWN, "solution": "(11 * 6) + 3 = 69"},
            "<answer>6 * 11 + 3 + 0 = 69</answer>",
            ("6 * 11 + 3 + 0 = 69", False),
        ),  # 0 is not one of the numbers
        (
            "builtin",
            {"question": "What is (2 + 3) * 4?", "solution": "The answer is 20."},
            "<answer>20</answer>",
            ("20", True),
        ),  # arithmetic rows of the built-in task are math answers
    ],
)
def test_grade(answer_type, row, output, want):
    assert grade(row, output, answer_type, TAGS) == want


@pytest.mark.parametrize(
    "answer",
    [
        "__import__('os').system('true')",
        "(6 ** 11) + 3",
        "6 + 3 + 11",
        "",
        None,
        "(6*11)+3 = 69 = 70",
    ],
)
def test_countdown_checker_rejects(answer):
    assert check_countdown(COUNTDOWN, answer) is False


def test_countdown_checker_accepts_every_generated_solution():
    rows = generate("countdown", 50, seed=3)
    assert all(check_countdown(r["question"], r["solution"]) for r in rows)
    assert check_countdown("What is (2 + 3) * 4?", "20") is None


def test_pass_at_1_averages_samples_then_questions():
    assert pass_at_1([[True, False], [True, True], [False, False]]) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        pass_at_1([])


@pytest.mark.parametrize(
    "requested,source,want",
    [
        ("auto", "builtin:mixed", "builtin"),
        ("auto", "math500", "math"),
        ("auto", "HuggingFaceH4/aime_2024", "math"),
        ("auto", "gpqa-diamond", "choice"),
        ("auto", "org/other", "math"),
        ("choice", "builtin:mixed", "choice"),
    ],
)
def test_answer_type(requested, source, want):
    assert resolve_answer_type(requested, source) == want


def test_benchmarks_by_name_and_hub_id():
    assert find_benchmark("benchmark:math500").hub_id == "HuggingFaceH4/MATH-500"
    assert find_benchmark("Idavidrein/gpqa").name == "gpqa-diamond"
    assert find_benchmark("builtin:mixed") is None
    with pytest.raises(DataError, match="unknown benchmark"):
        find_benchmark("benchmark:nope")


def test_gpqa_row_gets_lettered_shuffled_options():
    bench = find_benchmark("gpqa-diamond")
    raw = {
        "Question": "Which?",
        "Correct Answer": "right",
        "Incorrect Answer 1": "w1",
        "Incorrect Answer 2": "w2",
        "Incorrect Answer 3": "w3",
        "Explanation": "because",
    }
    rows = [benchmark_row(raw, bench, i) for i in range(8)]
    for r in rows:
        letter = r["solution"]
        assert f"{letter}. right" in r["question"] and r["reasoning_trace"] == "because"
    assert len({r["solution"] for r in rows}) > 1  # the position of the right option varies by row
    assert benchmark_row(raw, bench, 3) == rows[3]  # deterministic
    with pytest.raises(DataError, match="Correct Answer"):
        benchmark_row({"Question": "q"}, bench, 0)
    math500 = benchmark_row({"problem": "2+2?", "answer": "4", "solution": "2+2=4"}, find_benchmark("math500"), 5)
    assert math500 == {"question": "2+2?", "solution": "4", "reasoning_trace": "2+2=4", "row": 5}


def _row(trace, reward, candidates=None):
    return {
        "question": "q",
        "solution": "s",
        "reward": reward,
        "source_row": 0,
        "messages": FMT.student_messages("q", trace, "s"),
        "candidates": candidates,
    }


def _length(messages):
    return len(messages[-1]["content"])  # characters stand in for tokens


@pytest.mark.parametrize(
    "policy,actions,kept",
    [
        ("drop", ["kept", "dropped", "dropped"], 1),
        ("truncate", ["kept", "truncated", "truncated"], 3),
        ("best_fit", ["kept", "replaced", "dropped"], 2),
    ],
)
def test_over_long_policies(policy, actions, kept):
    long, short = "x" * 100, "y" * 5
    rows = [
        _row(short, 1.0),
        _row(long, 2.0, [{"reasoning_trace": long, "reward": 2.0}, {"reasoning_trace": short, "reward": 0.5}]),
        _row(long, 2.0, [{"reasoning_trace": long, "reward": 2.0}]),  # no shorter candidate
    ]
    chats, records = choose_rows(rows, _length, 60, policy, FMT)
    assert [r["action"] for r in records] == actions
    assert len(chats) == kept
    if policy == "best_fit":
        assert records[1]["candidate_rank"] == 1 and records[1]["candidate_reward"] == 0.5
        assert chats[1][-1]["content"].startswith("<think>" + short)


def test_truncate_records_a_row_whose_prompt_fills_max_length_as_dropped():
    """TRL keeps a truncated row's first maxLength tokens and drops a row left with no completion token: such a
    row is recorded dropped, not truncated (rows.json says what the trainer saw)."""
    long = "x" * 100
    rows = [_row(long, 1.0), _row(long, 1.0)]
    rows[1]["messages"][1]["content"] = "q" * 70  # the user turn alone is over the 60 "tokens"
    prompt = lambda messages: len(messages[-1]["content"])  # noqa: E731  # the user turn's characters stand in
    chats, records = choose_rows(rows, _length, 60, "truncate", FMT, prompt)
    assert [r["action"] for r in records] == ["truncated", "dropped"]
    assert records[1]["prompt_tokens"] >= 60 and len(chats) == 1


def test_rows_without_messages_are_rejected_by_index():
    with pytest.raises(DataError, match="row 0"):
        choose_rows([{"question": "q"}], _length, 10, "drop", FMT)


@pytest.mark.parametrize(
    "xs,ys,want",
    [
        ([1, 2, 3, 4], [2, 4, 6, 8], 1.0),
        ([1, 2, 3, 4], [4, 3, 2, 1], -1.0),
        ([1, 2], [1, 2], None),
        ([1, 2, 3], [5, 5, 5], None),
    ],
)
def test_pearson(xs, ys, want):
    got = pearson(xs, ys)
    assert got["n"] == len(xs)
    assert (got["pearson"] is None and want is None and got["reason"]) or got["pearson"] == pytest.approx(want)


def _doc(**stages):
    return {
        "apiVersion": "rlt.dev/v1alpha1",
        "kind": "RLTRun",
        "metadata": {"name": "c"},
        "spec": {
            "teacher": {"model": "t"},
            "student": {"model": "s"},
            "dataset": {"source": "builtin:mixed"},
            "stages": stages,
        },
    }


def test_compare_fills_student_and_evaluate_defaults_and_needs_both_teachers():
    stages = compare_stages(parse_run(_doc()))
    assert stages["student"]["enabled"] and stages["evaluate"]["enabled"] and stages["distill"]["enabled"]
    own = compare_stages(parse_run(_doc(student={"enabled": True, "maxSteps": 3})))
    assert own["student"]["maxSteps"] == 3
    with pytest.raises(SpecError, match=r"spec.stages.rl.enabled: false; rlt compare needs stages sft and rl"):
        compare_stages(parse_run(_doc(rl={"enabled": False})))


def test_spec_rejects_greedy_with_several_samples():
    with pytest.raises(SpecError, match="spec.stages.evaluate.samples"):
        parse_run(_doc(evaluate={"enabled": True, "temperature": 0, "samples": 4}))


def test_wilson_interval_of_compare():
    from rlt.run.compare import wilson_interval

    lo, hi = wilson_interval(0.2, 100)  # textbook value for 20 of 100: [0.133, 0.289]
    assert lo == pytest.approx(0.1334, abs=1e-3) and hi == pytest.approx(0.2888, abs=1e-3)
    assert wilson_interval(0.0, 10)[0] == 0.0 and wilson_interval(1.0, 10)[1] == pytest.approx(1.0)
    assert wilson_interval(0, 0) is None
