"""LoRA and the reward path: the same weights give the same numbers, whether the adapter is live (PeftModel, what
the GRPO rollout samples from) or merged (the plain model handed to distill, the generators and the student)."""

from __future__ import annotations

import copy

import pytest
import torch

from rlt.data import tasks
from rlt.method.generation import sample_with_logprobs
from rlt.method.reward import RLTReward


@pytest.fixture(scope="module")
def adapted(tiny):
    from peft import LoraConfig, get_peft_model

    model, _ = tiny
    torch.manual_seed(0)  # init_lora_weights=False: a random, non-zero update (a fresh LoRA is a no-op)
    live = get_peft_model(
        copy.deepcopy(model), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False)
    ).eval()
    merged = copy.deepcopy(live).merge_and_unload().eval()
    return live, merged


def test_sampled_tokens_and_logprobs_match(adapted, tiny, formatter):
    live, merged = adapted
    base, tok = tiny
    rows = list(tasks.generate("arithmetic", 3, seed=2))
    prompts = [
        tok(formatter.teacher_prompt(tok, r["question"], r["solution"]), add_special_tokens=False).input_ids
        for r in rows
        for _ in range(2)
    ]
    out = {}
    for name, m in (("live", live), ("merged", merged), ("base", base)):
        torch.manual_seed(7)
        out[name] = sample_with_logprobs(m, tok, prompts, temperature=0.7, top_p=1.0, max_new_tokens=12)
    assert out["live"].completion_ids == out["merged"].completion_ids
    for a, b in zip(out["live"].logprobs, out["merged"].logprobs, strict=False):
        assert a == pytest.approx(b, abs=1e-5)
    # the adapter changes the model: the same seed gives other log-probs without it
    assert any(
        a != pytest.approx(b, abs=1e-3) for a, b in zip(out["live"].logprobs, out["base"].logprobs, strict=False)
    )


def test_reward_parts_match(adapted, tiny, formatter):
    live, merged = adapted
    student, tok = tiny
    rows = list(tasks.generate("arithmetic", 3, seed=4))
    q, s = [r["question"] for r in rows], [r["solution"] for r in rows]
    texts = [f"Work it out: {r['reasoning_trace']}" + formatter.fmt.tags.explanation_end for r in rows]
    scores = {}
    for name, teacher in (("live", live.get_base_model()), ("merged", merged)):  # LoRA layers live in the former
        reward = RLTReward(student, tok, formatter, temperature=0.7, teacher=teacher, teacher_tokenizer=tok)
        scores[name] = reward.score(q, s, texts)
    for part in ("total", "r_ss", "r_kl"):
        assert getattr(scores["live"], part) == pytest.approx(getattr(scores["merged"], part), abs=1e-5)
