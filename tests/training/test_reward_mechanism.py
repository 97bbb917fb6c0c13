"""Does the RLT reward price a leaked answer? The mechanism check of issue 24, with the real SmolLM2-135M-Instruct
as both the frozen student and the (untrained) teacher, on `builtin:sums` (two-digit + two-digit: the answer is not in
the question and the untrained student does not guess it).

What each side sees when r_KL scores an explanation token (rlt/method/reward.py, rlt/method/prompts.py):
  student: system prompt, question, `<think>`, the explanation so far (its own thought); never the solution, which
           comes after the thought;
  teacher: teacher system prompt, question, the solution block, `<explain>`, the explanation so far.
That is the reference's context (SakanaAI/RLT teacher_rewards.py; see docs/experiments.md "Mechanism").

The ordering the paper's design intends: a worked explanation scores above a bare "The answer is X." (same r_SS,
the leak is paid for in r_KL) and above a wrong-reasoning one (paid for in r_SS)."""

import statistics

import pytest
import torch

from rlt.data import tasks
from rlt.method.reward import RLTReward
from rlt.spec.inputs import ModelRef

N_QUESTIONS = 8


def wrong_reasoning(row: dict) -> str:
    """The worked trace's shape with slips in both partial sums, ending on a wrong total."""
    a, b = (int(x) for x in row["question"].removeprefix("What is ").rstrip("?").split(" + "))
    tens, ones = a // 10 * 10 + b // 10 * 10 + 10, a % 10 + b % 10 + 1
    return (
        f"Add the tens: {a // 10 * 10} + {b // 10 * 10} = {tens}.\nAdd the ones: {a % 10} + {b % 10} = {ones}.\n"
        f"Together: {tens} + {ones} = {tens + ones}."
    )


EXPLANATIONS = {
    "worked": lambda r: r["reasoning_trace"],
    "bare leak": lambda r: f"The answer is {r['solution']}.",
    "wrong reasoning": wrong_reasoning,
}


@pytest.fixture(scope="module")
def smol_reward(formatter):
    from rlt.data.models import load_model, load_tokenizer

    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    ref = ModelRef(model="builtin:smollm2-135m-instruct")
    model, tok = load_model(ref, "cpu"), load_tokenizer(ref, padding_side="right")
    # the teacher at initialisation is the student's own weights (as in the benchmark before any training)
    return RLTReward(model, tok, formatter, teacher=model, teacher_tokenizer=tok, temperature=0.7)


@pytest.mark.slow
def test_reward_prices_a_leaked_answer_on_sums(smol_reward, formatter):
    rows = tasks.generate("sums", N_QUESTIONS, seed=0)
    qs, sols = [r["question"] for r in rows], [r["solution"] for r in rows]
    got = {}
    for name, make in EXPLANATIONS.items():
        completions = [formatter.teacher_completion(make(r), "") for r in rows]
        got[name] = smol_reward.score(qs, sols, completions)
    print(f"\n{'explanation':16s} {'R':>7s} {'r_SS':>7s} {'r_KL':>7s} tokens   (means over {N_QUESTIONS} sums)")
    for name, b in got.items():
        print(
            f"{name:16s} {statistics.fmean(b.total):+7.3f} {statistics.fmean(b.r_ss):+7.3f} "
            f"{statistics.fmean(b.r_kl):+7.3f} {statistics.fmean(b.explanation_tokens):5.1f}"
        )
    worked, leak, wrong = got["worked"], got["bare leak"], got["wrong reasoning"]
    # the intended ordering, question by question
    assert all(w > lk for w, lk in zip(worked.total, leak.total, strict=True)), (worked.total, leak.total)
    assert all(w > x for w, x in zip(worked.total, wrong.total, strict=True)), (worked.total, wrong.total)
    # and for the intended reason: the leak is as convincing to the student (r_SS within 0.5 nats of the worked
    # one) but costs in r_KL; the wrong reasoning costs in r_SS
    assert abs(statistics.fmean(leak.r_ss) - statistics.fmean(worked.r_ss)) < 0.5
    assert statistics.fmean(leak.r_kl) > 3 * statistics.fmean(worked.r_kl)
    assert statistics.fmean(wrong.r_ss) < statistics.fmean(worked.r_ss) - 2.0


@pytest.mark.slow
def test_student_side_of_r_kl_never_sees_the_solution(smol_reward, formatter):
    """Through the reward itself: with the teacher's log-probs fixed (all 0, as if given by generation), r_KL's mean
    is minus the student's mean log-prob of E, and it is bit-identical whatever the solution; the teacher's own
    forward does change with the solution (it reads it first)."""
    row = tasks.generate("sums", 1, seed=0)[0]
    completion = formatter.teacher_completion(row["reasoning_trace"], "")
    ids = smol_reward.teacher_tokenizer(completion, add_special_tokens=False).input_ids
    zeros = [[0.0] * len(ids)]
    q, other_solution = [row["question"]], str(int(row["solution"]) + 7)
    right = smol_reward.score(q, [row["solution"]], [completion], zeros, [ids])
    other = smol_reward.score(q, [other_solution], [completion], zeros, [ids])
    assert right.explanation_tokens[0] > 40 and right.pairing_coverage[0] == 1.0
    assert right.kl_mean == other.kl_mean and right.kl_mean[0] > 0  # = −mean log π_s(E | question), unchanged
    with_teacher = [smol_reward.score(q, [s], [completion]).kl_mean[0] for s in (row["solution"], other_solution)]
    assert abs(with_teacher[0] - with_teacher[1]) > 1e-3  # the teacher's side did read the solution
