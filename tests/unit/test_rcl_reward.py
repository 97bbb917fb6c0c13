"""RCL reward table, efficiency, answer-leak and format rules, APG/NDR/TES, guidance extraction (pure, no model)."""

import math

import pytest

from rlt.rcl.protocol import Protocol, load_rcl_format
from rlt.rcl.reward import RCLReward, RewardParams, efficiency, rcl_reward, states_answer
from rlt.rcl.summary import apg, ndr, summarize_problems, tes
from rlt.spec.loading import SpecError, parse_spec

P = RewardParams()  # defaults: penalty 2, w 0.5, L0 200, maintain 0.1, strong ≥ 0.75, leak 0, format 1


# (perf_base, perf_with, teaching tokens) -> hand-computed reward with the defaults
@pytest.mark.parametrize(
    "base, with_, tokens, expected",
    [
        # baseline wrong (0/4)
        (0.0, 1.0, 0, 1.5),  # full gain, no teaching: 1·(1 + 0.5·1)
        (0.0, 1.0, 200, 1.25),  # full gain, L0 tokens: eff = 1/2 -> 1·(1 + 0.25)
        (0.0, 0.5, 600, 0.5625),  # half gain, eff = 200/800 = 0.25 -> 0.5·(1 + 0.125)
        (0.0, 0.0, 50, 0.0),  # no change, weak student: nothing
        # baseline partly right (2/4): weak
        (0.5, 0.75, 200, 0.3125),  # +0.25·1.25
        (0.5, 0.5, 10, 0.0),  # no change, weak
        (0.5, 0.25, 10, -0.5),  # −0.25 × 2
        (0.5, 0.0, 0, -1.0),  # −0.5 × 2
        # baseline strong (≥ 0.75)
        (0.75, 0.75, 200, 0.025),  # maintained: 0.5 · 0.5 · 0.1
        (1.0, 1.0, 0, 0.05),  # maintained, no teaching: 0.5 · 1 · 0.1
        (1.0, 0.75, 0, -0.5),  # −0.25 × 2 (conciseness never offsets a loss)
        (1.0, 0.0, 0, -2.0),  # right → wrong costs twice a wrong → right gain (before the bonus)
        (0.75, 1.0, 600, 0.28125),  # +0.25·(1 + 0.5·0.25)
    ],
)
def test_reward_table(base, with_, tokens, expected):
    assert rcl_reward(base, with_, tokens, p=P) == pytest.approx(expected)


def test_missing_guidance_gets_the_format_penalty_whatever_the_baseline():
    for base in (0.0, 0.5, 1.0):
        assert rcl_reward(base, None, 0, p=P) == -1.0
    assert rcl_reward(1.0, None, 0, p=RewardParams(format_penalty=0.3)) == -0.3


def test_answer_leak_penalty_and_configured_numbers():
    p = RewardParams(answer_leak_penalty=0.5)
    assert rcl_reward(0.0, 1.0, 0, leaked=True, p=p) == pytest.approx(1.0)
    assert rcl_reward(0.0, 0.0, 0, leaked=True, p=p) == pytest.approx(-0.5)
    p = RewardParams(degradation_penalty=3.0, efficiency_weight=0.0)
    assert rcl_reward(1.0, 0.5, 0, p=p) == pytest.approx(-1.5)
    assert rcl_reward(0.0, 0.5, 0, p=p) == pytest.approx(0.5)
    assert rcl_reward(1.0, 1.0, 0, p=p) == 0.0  # w = 0: no maintain bonus
    p = RewardParams(strong_threshold=0.5, maintain_bonus=1.0)
    assert rcl_reward(0.5, 0.5, 200, p=p) == pytest.approx(0.25)


def test_efficiency():
    assert efficiency(0, 200) == 1.0
    assert efficiency(200, 200) == 0.5
    assert efficiency(50, 50) == 0.5


@pytest.mark.parametrize(
    "guidance, solution, leaked",
    [
        ("The result is 42.", "The answer is 42.", True),
        ("First compute 6 * 7.", "The answer is 42.", False),
        ("Half of it: \\boxed{\\frac{1}{2}}", "1/2", True),
        ("It is 1,000 in total", "The answer is 1000.", True),
        ("Add 10 and 4", "The answer is 104.", False),
        ("Try (3 + 4) * 5 = 35", "(3 + 4) * 5 = 35", True),
        # text and choice answers: case-folded, as a phrase (not inside another word), a letter only as an option
        ("The answer is (C).", "C", True),
        ("The answer is (C).", "\\text{(C)}", True),
        ("Think about option c first", "C", True),
        ("Let c be the third side", "C", False),
        ("Seven is odd", "even", False),
        ("You know the rule", "no", False),
        ("So the number is Even.", "even", True),
    ],
)
def test_states_answer(guidance, solution, leaked):
    assert states_answer(guidance, solution) is leaked


def test_apg_ndr_tes():
    problems = [(0.0, 1.0, 20), (1.0, 1.0, 0), (1.0, 0.25, 40), (0.5, 0.5, 20)]  # (without, with, tokens)
    assert apg(problems) == pytest.approx((1.0 + 0 - 0.75 + 0) / 4)
    assert ndr(problems) == pytest.approx(0.75)  # one problem right without (1.0) and wrong with (0.25)
    assert tes(apg(problems), 20) == pytest.approx(0.0625 / 0.2)
    assert math.isnan(tes(0.1, 0))
    s = summarize_problems(problems)
    assert s["acc_without"] == pytest.approx(0.625) and s["acc_with"] == pytest.approx(0.6875)
    assert s["teaching_tokens"] == 20 and s["problems"] == 4
    assert ndr([(0.5, 0.25, 0)]) == 0.0  # "right" = at least half the answers correct
    assert math.isnan(apg([]))


# --------------------------------------------------------------------------- protocol and the scorer, no model


class WordTokenizer:
    """Stand-in tokenizer: one token per word; chat template = the messages joined."""

    def __call__(self, text, add_special_tokens=False):
        class Out:
            input_ids = text.split()

        return Out()

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False):
        return "\n".join(f"[{m['role']}] {m['content']}" for m in messages) + (
            "\n[assistant] " if add_generation_prompt else ""
        )


@pytest.fixture
def protocol():
    return Protocol(load_rcl_format("rcl-default"))


@pytest.mark.parametrize(
    "output, guidance",
    [
        ("<diagnosis>ok</diagnosis>\n<guidance>Add first.</guidance>", "Add first."),
        ("<guidance> Multiply 3 by 4. </guidance> trailing", "Multiply 3 by 4."),
        ("<guidance>never closed", None),  # unclosed: nothing is passed on
        ("Just the answer: 12", None),  # no tags: never the whole output
        ("<guidance>   </guidance>", ""),  # closed and empty: zero-length guidance, not missing
    ],
)
def test_extract_guidance(protocol, output, guidance):
    assert protocol.extract_guidance(output) == guidance


@pytest.mark.parametrize(
    "output, solution, ok",
    [
        ("so <answer>\\boxed{\\frac{3}{4}}</answer>", "3/4", True),  # nested braces in a box inside the tags
        ("<answer>1,250</answer>", "The answer is 1250.", True),  # thousands separator
        ("<answer>0.5</answer>", "1/2", True),  # decimal = fraction
        ("I do not know", "The answer is 7.", False),  # no answer at all
        ("<answer>8</answer> but maybe 7", "The answer is 7.", False),  # the tagged answer wins
    ],
)
def test_student_answers_are_checked_with_the_shared_normaliser(protocol, output, solution, ok):
    assert protocol.correct(output, "What is the answer?", solution) is ok


def test_countdown_answers_are_verified_from_the_question_as_the_evaluate_stage_does(protocol):
    """A countdown reference is one expression of many: rcl grades the student's expression against the question
    (numbers used once, the target reached), the same verdict as the evaluate stage, not by comparing texts."""
    from rlt.data.tasks import generate
    from rlt.stages.evaluate import grade

    row = generate("countdown", 1, seed=3)[0]
    expr = row["solution"].split("=")[0].strip()
    target = row["solution"].split("=")[1].strip()
    cases = {
        f"<answer>{row['solution']}</answer>": True,
        f"<answer>{expr}</answer>": True,
        f"<answer>{target}</answer>": False,
    }
    for output, ok in cases.items():
        assert protocol.correct(output, row["question"], row["solution"]) is ok, output
        assert grade(dict(row), output, "builtin", protocol.answer_tags)[1] is ok, output

    def answers(prompts, n):  # the student writes the reference expression with guidance, a bare number without
        return [[f"<answer>{expr}</answer>" if "hint" in p else f"<answer>{target}</answer>"] * n for p in prompts]

    reward = RCLReward(protocol, WordTokenizer(), answers, samples=2)
    batch = reward.score([row["question"]], [row["solution"]], ["<guidance>a hint</guidance>"])
    assert batch.perf_base == [0.0] and batch.means()["rcl_apg"] == 1.0


def test_teacher_prompt_holds_question_and_probe_verbatim(protocol):
    tok = WordTokenizer()
    text = protocol.teacher_prompt(tok, "What is {x}?", "I add {y} first")
    assert "What is {x}?" in text and "I add {y} first" in text  # braces survive (no str.format)
    assert protocol.student_prompt(tok, "Q?", "GUIDE-TEXT").count("GUIDE-TEXT") == 1
    assert "teacher" not in protocol.student_prompt(tok, "Q?")


def test_baseline_once_per_question_shared_by_the_group(protocol):
    """G completions of one question reuse one baseline; the student answers baseline prompts once per question."""
    calls = []

    def answers(prompts, n):
        calls.append(list(prompts))
        # the student is right without guidance for q1 only; with guidance it always answers 5
        return [
            ["<answer>5</answer>"] * n if ("hint" in p or "q1" in p) else ["<answer>0</answer>"] * n for p in prompts
        ]

    reward = RCLReward(protocol, WordTokenizer(), answers, samples=4)
    good, bad = "<guidance>a hint</guidance>", "no tags"
    batch = reward.score(["q1", "q1", "q1", "q2", "q2", "q2"], ["5"] * 6, [good, bad, good, good, good, bad])
    assert len(calls[0]) == 2  # baseline: one prompt per question, not per completion
    assert len(calls[1]) == 4  # with guidance: only the well-formed guidances
    assert batch.perf_base == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0]
    eff_bonus = 0.5 * 200 / 202  # "a hint" is 2 tokens
    assert batch.reward == pytest.approx([eff_bonus * 0.1, -1.0, eff_bonus * 0.1, 1 + eff_bonus, 1 + eff_bonus, -1.0])
    m = batch.means()
    assert m["rcl_apg"] == pytest.approx(
        (0 + (2 / 3)) / 2
    )  # q2: 2 of 3 guidances lift 0 -> 1, the missing one = baseline
    assert m["rcl_ndr"] == 1.0 and m["rcl_format_ok"] == pytest.approx(4 / 6)
    assert reward(["q1", "q1"], [good, good], question=["q1", "q1"], solution=["5", "5"]) == pytest.approx(
        [eff_bonus * 0.1] * 2
    )


def test_empty_guidance_is_zero_length_teaching_and_ndr_per_sample_counts_any_drop(protocol):
    """Closed tags around nothing: the student alone (perf_with = baseline, no student call, eff = 1), not a format
    error. NDR per sample counts every guidance after which the student did worse; the per-question NDR does not."""
    calls = []

    def answers(prompts, n):
        calls.append(list(prompts))
        # right alone on q1; the "wrong" hint makes it fail, the "good" one keeps it right
        return [["<answer>0</answer>"] * n if "wrong" in p else ["<answer>5</answer>"] * n for p in prompts]

    reward = RCLReward(protocol, WordTokenizer(), answers, samples=2)
    batch = reward.score(
        ["q1"] * 4,
        ["5"] * 4,
        [
            "<guidance></guidance>",
            "<guidance>good</guidance>",
            "<guidance>good</guidance>",
            "<guidance>wrong</guidance>",
        ],
    )
    assert batch.perf_with[0] == batch.perf_base[0] == 1.0 and batch.teaching_tokens[0] == 0
    assert len(calls[1]) == 3  # the empty guidance asks the student nothing more
    assert batch.reward[0] == pytest.approx(rcl_reward(1.0, 1.0, 0, p=RewardParams()))  # eff = 1: the full bonus
    m = batch.means()
    assert m["rcl_format_ok"] == 1.0
    assert m["rcl_ndr"] == 1.0  # per question: mean with = 3/4 ≥ 0.5, still "right"
    assert m["rcl_ndr_samples"] == pytest.approx(3 / 4)  # per sample: the "wrong" guidance degraded it


def test_rcl_spec_validation():
    base = {
        "method": "rcl",
        "teacher": {"model": "t"},
        "student": {"model": "s"},
        "dataset": {"source": "builtin:arithmetic"},
    }
    with pytest.raises(SpecError, match=r"spec.stages: method rcl has no distill stage"):
        parse_spec(base)
    spec = parse_spec({**base, "stages": {"distill": {"enabled": False}}})
    assert spec.rcl.degradation_penalty == 2.0 and spec.rcl.max_probe_tokens == 50 and spec.rcl.student_samples == 4
    with pytest.raises(SpecError, match=r"spec.rcl.degradationPenalty"):
        parse_spec({**base, "stages": {"distill": {"enabled": False}}, "rcl": {"degradationPenalty": -1}})
    with pytest.raises(ValueError, match=r"spec.rcl.format"):
        load_rcl_format("no-such-format")
