"""Distill ranks candidates by the reward RL optimised, at one temperature. Sampling gives the teacher's log-probs at
stages.distill.temperature; the reward compares them with the student's at the reward's temperature
(stages.rl.reward.studentTemperature, else stages.rl.temperature). Where the two differ the in-process stage has the
teacher score its explanations itself at the reward's temperature; served, the spec is refused. Before, the ranking
mixed two temperatures (as the reference scorer's 0.9 against 0.7, which rlt must not copy)."""

import pytest
from suite_helpers import tiny_doc

from rlt.spec.loading import parse_run


def distill_doc(distill_temperature: float, rl_temperature: float, mode: str = "inprocess") -> dict:
    doc = tiny_doc()
    st = doc["spec"]["stages"]
    st["sft"] = {"enabled": False}
    st["rl"].update(enabled=False, temperature=rl_temperature, generation={"mode": mode})
    st["distill"].update(samplesPerQuestion=2, temperature=distill_temperature, maxNewTokens=12, limit=3)
    return doc


def test_in_process_distill_scores_the_teacher_at_the_rewards_temperature(tmp_path, monkeypatch):
    from rlt.contract.layout import RunLayout
    from rlt.data.models import load_model, load_tokenizer
    from rlt.method.reward import RLTReward
    from rlt.stages.context import StageContext
    from rlt.stages.distill import run_distill

    run = parse_run(distill_doc(0.7, 1.0))
    ctx = StageContext(run, RunLayout.for_run(tmp_path, run.name), show_progress=False)
    calls = []
    score = RLTReward.score

    def spying(self, questions, solutions, completions, *rest, **kw):
        out = score(self, questions, solutions, completions, *rest, **kw)
        calls.append((list(questions), list(solutions), list(completions), list(out.total)))
        return out

    monkeypatch.setattr(RLTReward, "score", spying)
    run_distill(ctx)
    assert calls, "distill scored nothing"

    # the same completions scored independently: the teacher's forward and the student's, both at 1.0
    spec = run.spec
    teacher_tok = load_tokenizer(spec.teacher, padding_side="left")
    teacher, student = load_model(spec.teacher, "cpu"), load_model(spec.student, "cpu")
    reference = RLTReward(
        student,
        load_tokenizer(spec.student, padding_side="right"),
        ctx.formatter,
        temperature=1.0,
        teacher=teacher,
        teacher_tokenizer=teacher_tok,
    )
    monkeypatch.setattr(RLTReward, "score", score)
    for questions, solutions, completions, totals in calls:
        want = reference.score(questions, solutions, completions).total
        assert totals == pytest.approx(want, abs=1e-4), "the ranking's reward is not the reward at one temperature"


def test_served_distill_at_another_temperature_than_the_reward_is_refused():
    from rlt.checks.validation import SpecError, validate_spec

    with pytest.raises(
        SpecError, match=r"stages\.distill\.temperature: 0\.7 differs from the reward's temperature 1\.0"
    ):
        validate_spec(distill_doc(0.7, 1.0, mode="server")["spec"])
    validate_spec(distill_doc(1.0, 1.0, mode="server")["spec"])  # equal: taken
    validate_spec(distill_doc(0.7, 1.0)["spec"])  # in process: taken (the teacher rescoring)
