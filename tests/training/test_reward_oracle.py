"""RLTReward against an independent oracle (tests/training/reward_oracle.py) on unicode-heavy text, with SmolLM2's real
byte-level BPE tokenizer, in every way the teacher log-probs can arrive, with share_prefix on and off.

The models are tiny random Llamas over the real 49,152-token vocabulary: the numbers differ from SmolLM2's, the
tokenisation (characters split over byte tokens, merges at tags, whitespace runs) is exactly SmolLM2's.
"""

from __future__ import annotations

import pytest
from reward_oracle import oracle_reward, plain_logprobs, tiny_lm, token_bytes

from rlt.method.generation import sample_with_logprobs
from rlt.method.reward import RLTReward

TAU, TOL = 0.7, 1e-4
FIELDS = (
    "total",
    "r_ss",
    "r_kl",
    "format_penalty",
    "solution_logprob_mean",
    "solution_logprob_min",
    "kl_mean",
    "kl_max",
    "pairing_coverage",
)

Q1, S1 = "Prove that √(a·b) ≤ (a + b)/2 for a, b ≥ 0.", "Since (√a − √b)² ≥ 0, we get a + b ≥ 2√(ab). ∎"
Q2, S2 = "计算 (3 + 4) × 2 等于多少？", "答案是 14。"
Q3, S3 = "What does </explain> mean inside <answer>?", "It is <think>a tag</think> text: <answer>14</answer> </explain>"
CASES = [
    (Q1, S1, "We have x ≤ y, y ≥ 0, √2 ≈ 1.414 ≠ 1.5; ∑ᵢ aᵢ → ∫₀¹ f(x) dx < ∞ ± ε.</explain>"),
    (Q1, S1, "LaTeX: $\\frac{a+b}{2} \\geq \\sqrt{ab}$ and \\[ \\int_0^1 x^2\\,dx = \\tfrac{1}{3} \\].</explain>"),
    (Q1, S1, "Combining marks: e\u0301 a\u0308 n\u0303 Z\u0351\u0310\u0328 café naïve; RTL مرحبا שלום.</explain>"),
    (Q1, S1, "  spaced   out\n\n\n\tthen tabs\t\t and\r\n  nbsp\u00a0em\u2003space\n\n</explain>"),
    (Q2, S2, "首先计算 3 + 4 = 7。然后乘以 2，得到 14。日本語のテキスト、한국어도。</explain>"),
    (Q2, S2, "Emoji 🎉👍🏽 family 👨\u200d👩\u200d👧 flag 🇯🇵 ✅ done.</explain> and text after the tag 漢字 😀"),
    (Q2, S2, "</explain>"),  # empty explanation, closed
    (Q2, S2, ""),  # empty and unclosed
    (Q3, S3, "The solution holds <answer> and <explain> tags ≤ here, never closed 😀"),  # unclosed: all of c is E
    (Q3, S3, "Tags: <think> inside </think> the explanation ∞.</explain></explain> twice"),
]


@pytest.fixture(scope="module")
def models(smol_tok):
    """(teacher, student) over SmolLM2's vocabulary; the teacher's generation_config asks for repetition penalty
    1.05, as Qwen2.5-Instruct's does, which clean sampling must override."""
    return tiny_lm(len(smol_tok), seed=1, repetition_penalty=1.05), tiny_lm(len(smol_tok), seed=2)


def generated(tok, teacher, fmt, qs, ss, cs, split: bool):
    """(prompt ids, completion ids, tempered log-probs) as a generation path hands them over: canonical ids,
    or the text tokenised one character at a time (ids a sampler may produce but the tokenizer never would)."""
    prompts, ids, lps = [], [], []
    for q, s, c in zip(qs, ss, cs, strict=True):
        p = tok(fmt.teacher_prompt(tok, q, s), add_special_tokens=False).input_ids
        c_ids = (
            [i for ch in c for i in tok(ch, add_special_tokens=False).input_ids]
            if split
            else tok(c, add_special_tokens=False).input_ids
        )
        assert tok.decode(c_ids, skip_special_tokens=True) == c
        prompts.append(p)
        ids.append(c_ids)
        lps.append(plain_logprobs(teacher, p + c_ids, TAU)[len(p) :])
    return prompts, ids, lps


def assert_matches(got, want_rows, label):
    worst = {f: max(abs(getattr(got, f)[i] - w[f]) for i, w in enumerate(want_rows)) for f in FIELDS}
    assert max(worst.values()) <= TOL, f"{label}: max |RLTReward − oracle| per field {worst}"


ORACLE: dict[str, list] = {}  # path -> oracle rows (one oracle per path, compared with both share_prefix settings)


def oracle_rows(path, fmt, teacher, student, tok, qs, ss, cs, generated_inputs=None):
    if path not in ORACLE:
        if generated_inputs is None:
            ORACLE[path] = [
                oracle_reward(fmt, student, tok, teacher, tok, q, s, c) for q, s, c in zip(qs, ss, cs, strict=True)
            ]
        else:
            prompts, ids, _ = generated_inputs
            ORACLE[path] = [
                oracle_reward(fmt, student, tok, teacher, tok, q, s, c, completion_ids=i, prompt_ids=p)
                for q, s, c, i, p in zip(qs, ss, cs, ids, prompts, strict=True)
            ]
    return ORACLE[path]


@pytest.mark.parametrize("path", ["teacher_forward", "generated_canonical", "generated_split"])
def test_reward_equals_oracle_on_unicode_text(smol_tok, models, formatter, path):
    teacher, student = models
    qs, ss, cs = map(list, zip(*CASES, strict=True))
    inputs = (
        None
        if path == "teacher_forward"
        else generated(smol_tok, teacher, formatter, qs, ss, cs, split=path == "generated_split")
    )
    want = oracle_rows(path, formatter, teacher, student, smol_tok, qs, ss, cs, inputs)
    for share_prefix in (True, False):
        reward = RLTReward(
            student,
            smol_tok,
            formatter,
            temperature=TAU,
            batch_size=3,
            share_prefix=share_prefix,
            teacher=teacher if path == "teacher_forward" else None,
            teacher_tokenizer=smol_tok,
        )
        got = (
            reward.score(qs, ss, cs)
            if inputs is None
            else reward.score(qs, ss, cs, teacher_logprobs=inputs[2], completion_ids=inputs[1])
        )
        assert_matches(got, want, f"{path}, share_prefix={share_prefix}")
        assert got.format_penalty == [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0]
        assert (reward.student.stats.prefix_tokens_saved > 0) == share_prefix
    if path != "generated_split":  # one tokenizer, one tokenisation: (nearly) every explanation token pairs up
        assert min(c for c, e in zip(got.pairing_coverage, got.explanation_tokens, strict=True) if e) > 0.9


def test_reward_equals_oracle_on_sampled_completions(smol_tok, models, formatter):
    """In-process sampling: the sampler's own log-probs feed the reward, the oracle re-derives them by a plain
    forward at τ. The teacher's generation_config has repetition_penalty 1.05; clean sampling ignores it."""
    import torch

    teacher, student = models
    q, s = Q2, S2
    prompt = smol_tok(formatter.teacher_prompt(smol_tok, q, s), add_special_tokens=False).input_ids
    torch.manual_seed(0)
    sampled = sample_with_logprobs(teacher, smol_tok, [prompt] * 12, temperature=TAU, top_p=1.0, max_new_tokens=24)
    keep = []
    for ids, lps in zip(sampled.completion_ids, sampled.logprobs, strict=True):
        try:  # the oracle places tokens by their bytes, so it needs completions that are valid UTF-8
            text = b"".join(token_bytes(smol_tok, ids, skip_special=True)).decode("utf-8")
        except UnicodeDecodeError:
            continue
        keep.append((ids, lps, text))
    assert len(keep) >= 4
    for share_prefix in (True, False):
        reward = RLTReward(
            student,
            smol_tok,
            formatter,
            temperature=TAU,
            teacher_tokenizer=smol_tok,
            batch_size=4,
            share_prefix=share_prefix,
        )
        got = reward.score(
            [q] * len(keep),
            [s] * len(keep),
            [t for _, _, t in keep],
            teacher_logprobs=[lp for _, lp, _ in keep],
            completion_ids=[i for i, _, _ in keep],
        )
        want = [
            oracle_reward(formatter, student, smol_tok, teacher, smol_tok, q, s, t, completion_ids=i, prompt_ids=prompt)
            for i, _, t in keep
        ]
        assert_matches(got, want, f"sampled, share_prefix={share_prefix}")


@pytest.mark.parametrize("path", ["teacher_forward", "generated_split"])
def test_reward_equals_oracle_with_a_different_student_tokenizer(smol_tok, tiny, models, formatter, path):
    """Teacher on SmolLM2's tokenizer, student on the tiny Qwen2's 512-token byte-level BPE: multi-token segments
    pair summed log-probs. (That tokenizer NFC-normalises, which moves combining marks, so the oracle, which places
    tokens by their bytes, skips the combining-marks case.)"""
    teacher, _ = models
    _, s_tok = tiny
    student = tiny_lm(len(s_tok), seed=3)
    qs, ss, cs = map(list, zip(*[case for case in CASES if "\u0301" not in case[2]], strict=True))
    reward = RLTReward(
        student, s_tok, formatter, temperature=TAU, teacher=teacher, teacher_tokenizer=smol_tok, batch_size=4
    )
    if path == "teacher_forward":
        got = reward.score(qs, ss, cs)
        want = [
            oracle_reward(formatter, student, s_tok, teacher, smol_tok, q, s, c)
            for q, s, c in zip(qs, ss, cs, strict=True)
        ]
    else:
        prompts, ids, lps = generated(smol_tok, teacher, formatter, qs, ss, cs, split=True)
        got = reward.score(qs, ss, cs, teacher_logprobs=lps, completion_ids=ids)
        want = [
            oracle_reward(formatter, student, s_tok, teacher, smol_tok, q, s, c, completion_ids=i, prompt_ids=p)
            for q, s, c, i, p in zip(qs, ss, cs, ids, prompts, strict=True)
        ]
    assert_matches(got, want, f"different tokenizers, {path}")
    assert min(c for c, e in zip(got.pairing_coverage, got.explanation_tokens, strict=True) if e) > 0.5


def test_dict_pairing_by_offsets_fails_the_oracle(smol_tok, models, formatter, monkeypatch):
    """The pairing this replaced (one teacher log-prob per character range, in a dict) is measurably wrong on
    split characters: the unicode set above can tell them apart."""
    import rlt.method.reward
    from rlt.method.pairing import Pairing

    def dict_pairing(teacher, student, same_vocab):
        by_offset = {o: lp for o, lp in zip(teacher.offsets, teacher.logprobs, strict=True)}
        deltas = [by_offset[o] - lp for o, lp in zip(student.offsets, student.logprobs, strict=True) if o in by_offset]
        return Pairing(deltas, len(deltas) * 2, len(teacher) + len(student))

    monkeypatch.setattr(rlt.method.reward, "pair_explanation", dict_pairing)
    teacher, student = models
    qs, ss, cs = map(list, zip(*CASES, strict=True))
    got = RLTReward(student, smol_tok, formatter, temperature=TAU, teacher=teacher, teacher_tokenizer=smol_tok).score(
        qs, ss, cs
    )
    want = oracle_rows("teacher_forward", formatter, teacher, student, smol_tok, qs, ss, cs)
    assert max(abs(g - w["r_kl"]) for g, w in zip(got.r_kl, want, strict=True)) > 1e-2
