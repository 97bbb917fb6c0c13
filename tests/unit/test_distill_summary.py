"""The distill part of `rlt run`'s summary reads whatever distillation dataset the run folder holds: the distill
stage's (scored rows) or one put there for the student stage alone (no rewards), without crashing the run's end."""

from rlt.contract.layout import RunLayout
from rlt.data.jsonl import write_jsonl
from rlt.run.summaries import distill


def test_scored_and_unscored_datasets(tmp_path):
    layout = RunLayout.for_run(tmp_path, "r")
    assert distill.summarize(layout, []) is None
    layout.distill_dataset.parent.mkdir(parents=True)
    scored = [
        {"question": "q1", "reward": -1.0, "closed": True, "candidate_rewards": [-1.0, -3.0]},
        {"question": "q2", "reward": -2.0, "closed": False, "candidate_rewards": [-2.0]},
    ]
    write_jsonl(layout.distill_dataset, scored)
    part = distill.summarize(layout, [])
    assert (part["rows"], part["keptRewardMean"], part["candidateRewardMean"], part["closedFraction"]) == (
        2,
        -1.5,
        -2.0,
        0.5,
    )
    assert "mean reward of the kept rows -1.500 (all candidates -2.000)" in distill.lines(part)[0]
    write_jsonl(layout.distill_dataset, [{"question": "q1", "reasoning_trace": "t", "solution": "1"}])
    part = distill.summarize(layout, [])
    assert part["rows"] == 1 and part["keptRewardMean"] is None
    assert "1 rows, not scored by the distill stage" in distill.lines(part)[0]


def test_the_summary_says_how_many_explanations_reach_the_solution_and_are_closed(tmp_path):
    """A reader of the demo's rows sees at once that a small teacher's arithmetic is often wrong."""
    layout = RunLayout.for_run(tmp_path, "r")
    layout.distill_dataset.parent.mkdir(parents=True)
    rows = [
        # the solution forms of the built-in tasks: a bare number, a sentence, an expression with its value
        {"solution": "264", "reasoning_trace": "98 + 166 = 264", "reward": -1.0, "closed": True},
        {"solution": "264", "reasoning_trace": "98 + 166 = 239", "reward": -2.0, "closed": True},
        {
            "solution": "The answer is 12.",
            "reasoning_trace": "3 * 4 = 12, so the answer is 12",
            "reward": -1.0,
            "closed": False,
        },
        {"solution": "3 + 5 * 2 = 13", "reasoning_trace": "5 * 2 = 10; 10 + 3 = 13", "reward": -1.0, "closed": True},
        {"solution": "7", "reasoning_trace": "We start with", "reward": -3.0, "closed": False},
    ]
    write_jsonl(layout.distill_dataset, rows)
    part = distill.summarize(layout, [])
    assert (part["reachesSolutionRows"], part["closedRows"], part["scoredRows"]) == (3, 3, 5)
    said = distill.lines(part)[1]
    assert "solution's answer in 3 of 5 rows" in said and "3 of 5 explanations are closed" in said
