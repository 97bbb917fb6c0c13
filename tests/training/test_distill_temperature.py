"""Distill ranks candidates by the reward RL optimised: the teacher's log-probs at stages.rl.temperature (the
policy's sampling), the student's at the reward's student temperature (stages.rl.reward.studentTemperature, else
stages.rl.temperature). Sampling at stages.distill.temperature gives the teacher's at that temperature instead:
where it is not rl's, the in-process stage has the teacher score its explanations itself at rl's; served, the spec
is refused. Before, the ranking mixed the sampling's temperature into the reward (as the reference scorer's 0.9
against 0.7, which rlt must not copy)."""

import pytest
from suite_helpers import tiny_doc

from rlt.spec.loading import parse_run


def distill_doc(distill_t: float, rl_t: float, student_t: float | None = None, mode: str = "inprocess") -> dict:
    doc = tiny_doc()
    st = doc["spec"]["stages"]
    st["sft"] = {"enabled": False}
    st["rl"].update(enabled=False, temperature=rl_t, generation={"mode": mode})
    if student_t is not None:
        st["rl"].setdefault("reward", {})["studentTemperature"] = student_t
    st["distill"].update(samplesPerQuestion=2, temperature=distill_t, maxNewTokens=12, limit=3)
    return doc


@pytest.mark.parametrize(("rl_t", "student_t"), [(1.0, None), (1.0, 0.8)])
def test_in_process_distill_ranks_by_the_reward_rl_optimises(rl_t, student_t, tmp_path, monkeypatch):
    from rlt.contract.layout import RunLayout
    from rlt.data.models import load_model, load_tokenizer
    from rlt.method.reward import RLTReward
    from rlt.method.scoring import SpanScorer
    from rlt.stages.context import StageContext
    from rlt.stages.distill import run_distill

    run = parse_run(distill_doc(0.7, rl_t, student_t))
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

    # the same completions scored independently: the teacher's forward at rl's temperature, the student's at its own
    spec = run.spec
    teacher, student = load_model(spec.teacher, "cpu"), load_model(spec.student, "cpu")
    teacher_tok = load_tokenizer(spec.teacher, padding_side="left")
    reference = RLTReward(
        student,
        load_tokenizer(spec.student, padding_side="right"),
        ctx.formatter,
        temperature=student_t or rl_t,
        teacher=teacher,
        teacher_tokenizer=teacher_tok,
    )
    reference.teacher = SpanScorer(teacher, teacher_tok, rl_t)  # built here: independent of the reward's own wiring
    monkeypatch.setattr(RLTReward, "score", score)
    for questions, solutions, completions, totals in calls:
        want = reference.score(questions, solutions, completions).total
        assert totals == pytest.approx(want, abs=1e-4), "the ranking's reward is not the reward RL optimises"


def test_served_distill_at_another_temperature_than_rl_is_refused():
    from rlt.checks.validation import SpecError, validate_spec

    with pytest.raises(
        SpecError, match=r"stages\.distill\.temperature: 0\.7 differs from stages\.rl\.temperature 1\.0"
    ):
        validate_spec(distill_doc(0.7, 1.0, mode="server")["spec"])
    validate_spec(distill_doc(1.0, 1.0, 0.8, mode="server")["spec"])  # rl's temperature: the generators' log-probs
    validate_spec(distill_doc(0.7, 1.0)["spec"])  # in process: taken (the teacher rescores)
