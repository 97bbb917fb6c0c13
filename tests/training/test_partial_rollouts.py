"""Partial rollouts' hold (rlt.stages.overlap.held_engine) on the real vLLM CPU server: rows sampled by rlt's client
(server_generate, seeded as a rollout is) are paused with the engine, preempted by the KV reset and resumed around a
push, and go on as if nothing happened. The push itself is a stand-in that waits a second (the CPU build cannot take
TRL's weight transfer), so the tokens and log-probs must be exactly those of an uninterrupted run; on a GPU the same
hold lets the rows go on under the pushed weights."""

from __future__ import annotations

import threading
import time

import pytest

pytestmark = pytest.mark.slow
ROWS, TOKENS = 8, 400  # --max-model-len 512: a 20-token prompt and 400 new tokens


def running(base: str) -> float:
    """vLLM's gauge of the requests its scheduler is running now (/metrics)."""
    import requests

    text = requests.get(f"{base}/metrics", timeout=30).text
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("vllm:num_requests_running")
    )


def preempted(base: str) -> float:
    import requests

    text = requests.get(f"{base}/metrics", timeout=30).text
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("vllm:num_preemptions_total")
    )


def sample(base: str, seed: int):
    from rlt.method.generation import server_generate

    s = server_generate(
        base, [list(range(5, 25))], n=ROWS, temperature=1.0, top_p=1.0, max_new_tokens=TOKENS, seed=seed
    )
    return s.completion_ids, s.logprobs


def test_rows_held_through_a_push_go_on_token_for_token(vllm_server):
    from rlt.stages.overlap import held_engine

    base = vllm_server.base
    hold = held_engine(base, timeout=60)
    t0 = time.monotonic()
    whole_ids, whole_lps = sample(base, seed=77)  # rows end at EOS or TOKENS: some run longer than others
    whole = time.monotonic() - t0
    # The hold comes a share of an uninterrupted rollout's time after the request (no polling of the server while
    # the rows run: on a loaded machine a poll could outlast them); when no row was running then, a smaller share.
    shares = (0.3, 0.15, 0.45, 0.08, 0.6, 0.04, 0.25, 0.02)
    for share in shares:
        answer: dict = {}
        rollout = threading.Thread(target=lambda got=answer: got.update(rows=sample(base, seed=77)), daemon=True)
        before = preempted(base)
        rollout.start()
        time.sleep(share * whole)
        with hold():
            held = running(base)  # paused (keep): the rows stay, not aborted
            time.sleep(1.0)  # the push (a stand-in)
        rollout.join(timeout=300)
        assert "rows" in answer, "the held rollout did not end"
        if held:
            break
    else:
        pytest.fail(f"no row was running when the hold came, {len(shares)} tries ({whole:.1f} s a rollout)")
    assert preempted(base) - before == held  # the KV reset preempted every running row
    ids, lps = answer["rows"]
    assert ids == whole_ids  # each row went on token for token after its KV cache was recomputed
    assert max(abs(a - b) for x, y in zip(lps, whole_lps, strict=True) for a, b in zip(x, y, strict=True)) < 1e-4


def test_a_failed_push_still_resumes_the_engine(vllm_server):
    from rlt.stages.overlap import held_engine

    base = vllm_server.base
    with pytest.raises(RuntimeError, match="push failed"), held_engine(base, timeout=60)():
        raise RuntimeError("push failed")
    ids, _ = sample(base, seed=5)  # served: the engine is not left paused
    assert len(ids) == ROWS and all(ids)


def test_a_stage_resumes_generators_a_killed_run_left_paused(vllm_server):
    """A trainer killed inside the hold leaves the server paused (keep): rlt.stages.overlap.resume_engine, sent before
    a partial-rollouts stage's first step, lets it serve again."""
    import requests

    from rlt.stages.overlap import resume_engine

    base = vllm_server.base
    requests.post(f"{base}/pause", params={"mode": "keep", "clear_cache": "false"}, timeout=60).raise_for_status()
    assert requests.get(f"{base}/is_paused", timeout=30).json().get("is_paused") is True
    resume_engine(base, timeout=60)
    resume_engine(base, timeout=60)  # idempotent
    ids, _ = sample(base, seed=6)
    assert len(ids) == ROWS and all(ids)
