"""Scoring micro-batches are capped by padded tokens, not only rows: a long completion cannot blow the batch."""

import torch

from rlt.method.prompts import Span
from rlt.method.scoring import ScoreRequest, SpanScorer


def _requests(tok):
    texts = [("word " * n).strip() for n in (3, 5, 40, 41, 6, 60)]
    return [ScoreRequest(t, [Span(0, len(t))], group=None) for t in texts]


def test_token_cap_bounds_every_micro_batch_and_changes_no_score(tiny):
    model, tok = tiny
    reqs = _requests(tok)
    rows_only = SpanScorer(model, tok, temperature=0.7, batch_size=8)
    capped = SpanScorer(model, tok, temperature=0.7, batch_size=8, max_batch_tokens=90)
    plan = capped._plan(reqs, capped._prepare(reqs))
    longest = max(len(s.ids) for _, b in plan for s in b)
    for _, batch in plan:
        width = max(len(s.ids) for s in batch)
        assert len(batch) * width <= 90 or len(batch) == 1  # a row longer than the cap runs alone
    assert longest > 45 and len(plan) > 1  # the cap split what 8 rows would have taken in one batch
    assert len(rows_only._plan(reqs, rows_only._prepare(reqs))) == 1
    for a, b in zip(rows_only.score(reqs), capped.score(reqs), strict=True):
        torch.testing.assert_close(a[0].logprobs, b[0].logprobs, atol=1e-5, rtol=1e-5)
