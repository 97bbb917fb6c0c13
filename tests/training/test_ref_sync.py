"""The GRPO reference soft-sync under ZeRO-3 gathers one (policy, reference) parameter pair at a time, not both
models at once as TRL's callback does, and computes what TRL computes."""

import copy

import pytest
import torch


@pytest.mark.parametrize("zero3", [True, False])
def test_pairwise_sync_matches_trl_and_gathers_two_tensors_at_a_time(tiny, monkeypatch, zero3):
    import deepspeed
    from trl.trainer.callbacks import SyncRefModelCallback

    from rlt.stages.rl import pairwise_ref_sync

    policy, _ = tiny
    policy = copy.deepcopy(policy)
    ref = copy.deepcopy(policy)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(torch.randn_like(p))
    want = copy.deepcopy(ref)
    SyncRefModelCallback._sync_target_model(policy, want, 0.9)  # TRL's own update, all at once

    gathered = []

    class GatherSpy:  # hand-written spy: records what each gather would materialise (no ZeRO world here)
        def __init__(self, params, modifier_rank=None):
            gathered.append(len(params))

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(deepspeed.zero, "GatheredParameters", GatherSpy)
    monkeypatch.setattr(deepspeed.comm, "get_rank", lambda: 0)
    cb = pairwise_ref_sync(SyncRefModelCallback(ref_model=ref, accelerator=None), zero3=zero3)
    cb.sync_target_model(policy, ref, 0.9)
    for got, exp in zip(ref.parameters(), want.parameters(), strict=True):
        torch.testing.assert_close(got, exp)
    if zero3:
        assert gathered and max(gathered) == 2 and len(gathered) == len(list(ref.parameters()))
    else:
        assert gathered == []
