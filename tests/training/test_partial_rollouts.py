"""Partial rollouts' hold (rlt.stages.overlap.held_engine) on the real vLLM CPU server: rows sampled by rlt's rollout
client (ClientProcess, seeded groups as a rollout's) are paused with the engine, preempted by the KV reset and resumed
around a push, and go on as if nothing happened. The push itself is a stand-in that waits a moment (the CPU build
cannot take TRL's weight transfer), so the tokens and log-probs must be exactly those of an uninterrupted run; on a GPU
the same hold lets the rows go on under the pushed weights."""

from __future__ import annotations

import threading
import time

import pytest

pytestmark = pytest.mark.slow
ROWS, TOKENS = 8, 400  # --max-model-len 512: a 20-token prompt and 400 new tokens
GROUPS = 4


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
    from rlt.stages.overlap import ClientProcess, Request, held_engine

    base = vllm_server.base
    hold = held_engine(base, timeout=60)
    client = ClientProcess()  # partial rollouts' client: its own process, so its streamed rows take no GIL from here
    # GROUPS groups of ROWS rows, each group its own prompt and seed as a rollout's are: a few seconds of rows to hold
    rollout = [Request(list(range(5 + g, 25 + g)), ROWS, 77 + g) for g in range(GROUPS)]
    kw = {"temperature": 1.0, "top_p": 1.0, "max_new_tokens": TOKENS, "timeout": 600.0}
    client(base, rollout, **kw)  # the server's first rollout also warms it up (10+ s here, then 2-5 s a rollout)
    before = preempted(base)
    whole = client(base, rollout, **kw)  # rows end at EOS or TOKENS: some run longer than others
    assert preempted(base) == before  # an uninterrupted rollout preempts nothing: what follows is the holds' doing
    # Holds one after another while a rollout runs, until one comes with rows running; a loaded machine can still keep
    # this thread from its next hold until every row has ended (seen: 1.5 s late), so rollouts until one was held with
    # rows running. Every rollout, held or not, must give the uninterrupted rollout's rows.
    tries, holds = 10, 0
    for _ in range(tries):
        answer: dict = {}
        thread = threading.Thread(target=lambda got=answer: got.update(rows=client(base, rollout, **kw)), daemon=True)
        thread.start()
        while thread.is_alive() and preempted(base) == before:  # once rows were held running, the rest runs free
            time.sleep(0.05)
            with hold():
                time.sleep(0.2)  # the push (a stand-in)
            holds += 1
        thread.join(timeout=300)
        assert "rows" in answer, "the held rollout did not end"
        for rows, alone in zip(answer["rows"], whole, strict=True):
            assert rows.completion_ids == alone.completion_ids  # each row went on token for token after a KV reset
            pairs = zip(rows.logprobs, alone.logprobs, strict=True)
            assert max(abs(a - b) for x, y in pairs for a, b in zip(x, y, strict=True)) < 1e-4
        if preempted(base) > before:  # the KV reset after a push preempted the rows running then
            break
    else:
        pytest.fail(f"no row was running at any of {holds} holds in {tries} rollouts")


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
