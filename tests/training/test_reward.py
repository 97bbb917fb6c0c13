"""The RLT reward against values computed by hand (full-vocabulary forward, one sequence at a time)."""

import math

import pytest
import torch

from rlt.method.reward import RLTReward

TAU = 0.7
ALPHA, LAM, PEN = 0.01, 3.0, 1.0

QUESTIONS = ["What is (3 + 4) * 2?"] * 3 + ["What is (9 - 2) + 5?"]
SOLUTIONS = ["The answer is 14."] * 3 + ["The answer is 12."]
COMPLETIONS = [
    "First 3 + 4 = 7, then 7 * 2 = 14.</explain>",
    "Add the numbers in parentheses, then double.</explain>",
    "Seven times two is fourteen",  # never closed: penalty
    "9 - 2 = 7 and 7 + 5 = 12.</explain>",
]


def full_logprobs(model, tok, text):
    """Hand reference: one full forward, full-vocabulary fp32 log-softmax at temperature TAU."""
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = torch.tensor([enc["input_ids"]])
    with torch.no_grad():
        logits = model(ids).logits[0].float()
    lp = torch.log_softmax(logits / TAU, dim=-1)
    per_token = [None] + [lp[t - 1, ids[0, t]].item() for t in range(1, ids.shape[1])]
    return enc["offset_mapping"], per_token


def tokens_in(offsets, start, end):
    return [t for t, (s, e) in enumerate(offsets) if e > s >= start and e <= end]


def hand_reward(model, tok, fmt, q, s, c):
    expl = c.split("</explain>")[0]
    closed = "</explain>" in c
    # student: solution and explanation tokens of the student chat
    answer = f"<think>{expl}</think>\n<answer>{s}</answer>"
    chat = tok.apply_chat_template(
        [
            {"role": "system", "content": fmt.fmt.student_system_prompt},
            {"role": "user", "content": q},
            {"role": "assistant", "content": answer},
        ],
        tokenize=False,
    )
    a0 = chat.index(answer)
    e0, s0 = a0 + len("<think>"), a0 + len(f"<think>{expl}</think>\n<answer>")
    offs, lps = full_logprobs(model, tok, chat)
    sol = [lps[t] for t in tokens_in(offs, s0, s0 + len(s))]
    stud_e = {(offs[t][0] - e0, offs[t][1] - e0): lps[t] for t in tokens_in(offs, e0, e0 + len(expl))}
    # teacher: the same model conditioned on question and solution, over the explanation tokens
    prompt = tok.apply_chat_template(
        [
            {"role": "system", "content": fmt.fmt.teacher_system_prompt},
            {"role": "user", "content": q},
            {"role": "assistant", "content": f"<answer>{s}</answer>\n<explain>"},
        ],
        tokenize=False,
        continue_final_message=True,
    )
    toffs, tlps = full_logprobs(model, tok, prompt + c)
    p = len(prompt)
    teach_e = {(toffs[t][0] - p, toffs[t][1] - p): tlps[t] for t in tokens_in(toffs, p, p + len(expl))}
    deltas = [teach_e[k] - v for k, v in stud_e.items() if k in teach_e]
    assert len(deltas) >= 0.8 * len(stud_e)  # shared tokenizer: nearly every token pairs up
    r_ss = sum(sol) / len(sol) + ALPHA * min(sol)
    r_kl = sum(deltas) / len(deltas) + ALPHA * max(deltas)
    return dict(
        r_ss=r_ss,
        r_kl=r_kl,
        pen=0.0 if closed else PEN,
        total=r_ss - LAM * r_kl - (0.0 if closed else PEN),
        sol_mean=sum(sol) / len(sol),
        sol_min=min(sol),
        kl_mean=sum(deltas) / len(deltas),
        kl_max=max(deltas),
        kl_teacher=sum(teach_e[k] for k in stud_e if k in teach_e) / len(deltas),
        kl_student_ce=-sum(v for k, v in stud_e.items() if k in teach_e) / len(deltas),
    )


@pytest.mark.parametrize("share_prefix,batch_size", [(True, 2), (False, 3), (True, 8)])
def test_every_component_matches_hand_computation(tiny, formatter, share_prefix, batch_size):
    model, tok = tiny
    reward = RLTReward(
        model,
        tok,
        formatter,
        alpha=ALPHA,
        kl_weight=LAM,
        format_penalty=PEN,
        temperature=TAU,
        teacher=model,
        teacher_tokenizer=tok,
        batch_size=batch_size,
        share_prefix=share_prefix,
    )
    got = reward.score(QUESTIONS, SOLUTIONS, COMPLETIONS)
    for i, (q, s, c) in enumerate(zip(QUESTIONS, SOLUTIONS, COMPLETIONS, strict=True)):
        want = hand_reward(model, tok, formatter, q, s, c)
        assert got.r_ss[i] == pytest.approx(want["r_ss"], abs=1e-4)
        assert got.r_kl[i] == pytest.approx(want["r_kl"], abs=1e-4)
        assert got.format_penalty[i] == want["pen"]
        assert got.solution_logprob_mean[i] == pytest.approx(want["sol_mean"], abs=1e-4)
        assert got.solution_logprob_min[i] == pytest.approx(want["sol_min"], abs=1e-4)
        assert got.kl_mean[i] == pytest.approx(want["kl_mean"], abs=1e-4)
        assert got.kl_max[i] == pytest.approx(want["kl_max"], abs=1e-4)
        # r_KL's two parts: the teacher's own log-prob of E and the student's cross-entropy on it
        assert got.kl_teacher_logprob[i] == pytest.approx(want["kl_teacher"], abs=1e-4)
        assert got.kl_student_ce[i] == pytest.approx(want["kl_student_ce"], abs=1e-4)
        assert got.kl_teacher_logprob[i] + got.kl_student_ce[i] == pytest.approx(got.kl_mean[i], abs=1e-6)
        assert got.total[i] == pytest.approx(want["total"], abs=1e-4)
    assert got.format_penalty == [0.0, 0.0, PEN, 0.0]
    if share_prefix:
        assert reward.student.stats.prefix_tokens_saved > 0  # the 3 explanations of question 1 shared a prefix


def test_teacher_logprobs_from_generation_equal_a_teacher_forward(tiny, formatter):
    """Sampling returns the tempered log-probs of the sampled tokens; fed back, they replace the teacher forward."""
    model, tok = tiny
    q, s = QUESTIONS[0], SOLUTIONS[0]
    prompt = formatter.teacher_prompt(tok, q, s)
    ids = tok(prompt, add_special_tokens=False, return_tensors="pt").input_ids
    torch.manual_seed(3)
    out = model.generate(
        ids,
        do_sample=True,
        temperature=TAU,
        top_k=0,
        top_p=1.0,
        max_new_tokens=12,
        output_scores=True,
        return_dict_in_generate=True,
    )
    gen = out.sequences[0, ids.shape[1] :]
    sampled = [torch.log_softmax(sc[0].float(), -1)[t].item() for sc, t in zip(out.scores, gen, strict=False)]
    with torch.no_grad():
        forward = torch.log_softmax(model(out.sequences).logits[0].float() / TAU, -1)
    assert sampled == pytest.approx([forward[ids.shape[1] - 1 + i, t].item() for i, t in enumerate(gen)], abs=1e-5)

    # Feed such log-probs (here for a readable completion, teacher-forced) to the reward.
    completion = COMPLETIONS[0]
    comp_ids = tok(completion, add_special_tokens=False).input_ids
    full = torch.tensor([ids[0].tolist() + comp_ids])
    with torch.no_grad():
        lp = torch.log_softmax(model(full).logits[0].float() / TAU, -1)
    teacher_lps = [lp[ids.shape[1] - 1 + i, t].item() for i, t in enumerate(comp_ids)]
    reward = RLTReward(model, tok, formatter, temperature=TAU, teacher=model, teacher_tokenizer=tok)
    by_forward = reward.score([q], [s], [completion])
    by_generation = reward.score([q], [s], [completion], teacher_logprobs=[teacher_lps], completion_ids=[comp_ids])
    assert by_generation.kl_mean[0] == pytest.approx(by_forward.kl_mean[0], abs=1e-4)
    assert by_generation.kl_max[0] == pytest.approx(by_forward.kl_max[0], abs=1e-4)
    assert by_generation.total[0] == pytest.approx(by_forward.total[0], abs=1e-4)


def test_trl_interface_returns_one_float_per_completion(tiny, formatter):
    model, tok = tiny
    reward = RLTReward(model, tok, formatter, teacher=model, teacher_tokenizer=tok)
    logged = {}
    rewards = reward(
        prompts=["p"] * 4,
        completions=COMPLETIONS,
        question=QUESTIONS,
        solution=SOLUTIONS,
        log_metric=logged.__setitem__,
    )
    assert len(rewards) == 4 and all(math.isfinite(r) for r in rewards)
    assert rewards[2] < rewards[0] - 0.5  # the unclosed explanation pays the format penalty
    assert set(logged) >= {"rlt/r_ss", "rlt/r_kl", "rlt/format_penalty"}


def test_missing_teacher_is_a_clear_error(tiny, formatter):
    model, tok = tiny
    with pytest.raises(ValueError, match="teacher log-probs"):
        RLTReward(model, tok, formatter).score(QUESTIONS[:1], SOLUTIONS[:1], COMPLETIONS[:1])
