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
