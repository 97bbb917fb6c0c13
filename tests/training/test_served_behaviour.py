"""A served rollout ahead of the update (rlt.stages.overlap.ServedBehaviour, through its real client process) on the
real vLLM CPU server: every group (a prompt's G repeats) draws from a seed of its own.

vLLM seeds sample j of every prompt of one request with seed + j. On the tiny random model the next-token
distribution is nearly flat, so two prompts sampled under one seed take nearly the same tokens: the agreement
measured here shows whether the groups of a rollout share their random draws, which would correlate their
advantages and rewards across the batch."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow
G, TOKENS = 4, 24


def agreement(a: list[int], b: list[int]) -> float:
    n = min(len(a), len(b))
    return sum(x == y for x, y in zip(a[:n], b[:n], strict=True)) / max(1, n)


def test_each_group_draws_on_a_seed_of_its_own(vllm_server):
    from rlt.spec.stages import RlStage
    from rlt.stages.overlap import ServedBehaviour

    st = RlStage.model_validate({"temperature": 1.0, "maxCompletionLength": TOKENS})
    served = ServedBehaviour(vllm_server.base, st, timeout=120)
    a, b = list(range(5, 25)), list(range(30, 50))
    ids, logprobs = served([a] * G + [b] * G, seed=77)
    assert len(ids) == len(logprobs) == 2 * G and all(
        len(i) == len(lp) > 0 for i, lp in zip(ids, logprobs, strict=True)
    )
    across = [agreement(ids[j], ids[G + j]) for j in range(G)]  # sample j of prompt a against sample j of prompt b
    within = [agreement(ids[j], ids[k]) for j in range(G) for k in range(j + 1, G)]  # a's own samples, apart
    # independent draws from a ~flat distribution over the vocabulary almost never agree; shared draws mostly do
    assert max(within) < 0.3, within
    assert max(across) < 0.3, f"groups share their random draws: token agreement {across}"
    # a group's draws are its own: the same rollout seed gives b the same samples whatever else is in the rollout
    # (its tokens too on this server, whose float32 CPU numerics do not depend on the batch)
    alone, _ = served([b] * G, seed=77)
    assert alone == ids[G:]
    again, _ = served([a] * G + [b] * G, seed=78)
    assert again[:G] != ids[:G]  # and another rollout seed other samples
