"""Resume only from complete checkpoints: a checkpoint-N without the marker (a pod killed mid-save) is set aside."""

from __future__ import annotations

import logging

from rlt.contract.layout import CHECKPOINT_COMPLETE, SET_ASIDE, checkpoint_path
from rlt.stages.checkpoints import last_checkpoint, mark_checkpoint_complete

# The smallest loadable safetensors file: its header's length, then an empty header (no tensors).
EMPTY_SAFETENSORS = (2).to_bytes(8, "little") + b"{}"


def _zip(path, member: str) -> None:
    """A torch.save-like file (a zip): the checkpoint reader checks its central directory."""
    import zipfile

    with zipfile.ZipFile(path, "w") as z:
        z.writestr(member, b"state")


def _checkpoint(root, step, complete):
    path = checkpoint_path(root, step)
    path.mkdir(parents=True)
    (path / "model.safetensors").write_bytes(EMPTY_SAFETENSORS)
    if complete:
        mark_checkpoint_complete(path, is_main=True)
    return path


def test_partial_checkpoint_is_set_aside_and_the_last_complete_one_resumed(tmp_path, caplog):
    _checkpoint(tmp_path, 2, complete=True)
    _checkpoint(tmp_path, 10, complete=True)  # numeric order, not text order
    partial = _checkpoint(tmp_path, 12, complete=False)
    with caplog.at_level(logging.WARNING):
        assert last_checkpoint(tmp_path) == str(tmp_path / "checkpoint-10")
    assert not partial.exists()
    aside = list((tmp_path / SET_ASIDE).iterdir())
    assert len(aside) == 1 and aside[0].name.startswith("checkpoint-12.") and (aside[0] / "model.safetensors").exists()
    assert "checkpoint-12 is incomplete" in caplog.text
    # The Trainer's own listing (rotation, get_last_checkpoint) no longer sees it.
    from transformers.trainer_utils import get_last_checkpoint

    assert get_last_checkpoint(str(tmp_path)) == str(tmp_path / "checkpoint-10")


def test_no_complete_checkpoint_means_a_fresh_start(tmp_path):
    _checkpoint(tmp_path, 1, complete=False)
    assert last_checkpoint(tmp_path) is None
    assert last_checkpoint(tmp_path / "missing") is None


def test_the_marker_is_what_counts(tmp_path):
    path = _checkpoint(tmp_path, 3, complete=True)
    assert (path / CHECKPOINT_COMPLETE).exists()
    assert last_checkpoint(tmp_path) == str(path)


def test_rank_shares_cover_every_row_once_and_the_merge_refuses_gaps():
    import pytest

    from rlt.stages.ranks import gather_shares, my_share

    rows = list("abcdefg")
    shares = [my_share(rows, r, 3) for r in range(3)]
    indices = sorted(i for share in shares for i, _ in share)
    assert indices == list(range(7)) and [len(s) for s in shares] == [3, 2, 2]
    assert gather_shares(sorted(p for s in shares for p in s), 0, 1, 7) == rows
    with pytest.raises(RuntimeError, match="duplicates or gaps"):
        gather_shares(shares[0] + shares[0], 0, 1, 7)


def test_every_reader_agrees_on_what_a_complete_checkpoint_is(tmp_path):
    """Continuing a finished stage (the plan) and resuming it (the Trainer) read the same checkpoints."""
    from rlt.contract.layout import RunLayout

    layout = RunLayout(tmp_path / "run")
    partial = _checkpoint(layout.checkpoints_dir("rl"), 4, complete=False)
    assert partial == layout.checkpoint_dir("rl", 4)
    assert not layout.has_complete_checkpoint("rl")
    assert partial.exists(), "asking is read-only: only a resume sets a partial checkpoint aside"
    assert last_checkpoint(layout.checkpoints_dir("rl")) is None
    complete = _checkpoint(layout.checkpoints_dir("rl"), 2, complete=True)
    assert layout.has_complete_checkpoint("rl")
    assert last_checkpoint(layout.checkpoints_dir("rl")) == str(complete)


def test_the_runner_does_not_continue_a_stage_whose_only_checkpoint_is_partial(tmp_path, monkeypatch):
    """More RL steps continue a finished rl stage from its checkpoint; a partial one is no checkpoint, so the run
    refuses in one line (before it reads data or loads a model) instead of planning to continue from nothing."""
    import pytest
    from suite_helpers import tiny_doc

    from rlt.contract.layout import RunLayout, atomic_write_text
    from rlt.run import runner
    from rlt.spec import fingerprint
    from rlt.spec.run import RLTRun

    doc = tiny_doc()
    run = RLTRun.model_validate(doc)
    layout = RunLayout.for_run(tmp_path, run.name)
    for stage in ("sft", "rl"):
        fingerprint.record(layout, run.spec, stage)
        atomic_write_text(layout.stage_done(stage), "now\n")
    _checkpoint(layout.checkpoints_dir("rl"), 3, complete=False)
    doc["spec"]["stages"]["rl"]["steps"] = 5

    def planned_to_run(*_a, **_k):
        raise AssertionError("the runner planned to continue rl from a partial checkpoint")

    monkeypatch.setattr(runner, "check_run_data", planned_to_run)
    with pytest.raises(fingerprint.StaleStageError, match=r"stages.rl.steps"):
        runner.run_local(RLTRun.model_validate(doc), output=tmp_path, only=["sft", "rl"], metrics_port=None)


def test_a_finished_stage_keeps_its_last_checkpoint_without_optimizer_states(tmp_path):
    from rlt.stages.checkpoints import prune_finished_checkpoints

    old = _checkpoint(tmp_path, 2, complete=True)
    last = _checkpoint(tmp_path, 4, complete=True)
    for ckpt in (old, last):
        _zip(ckpt / "optimizer.pt", "adam")
        (ckpt / "global_step4").mkdir()
        _zip(ckpt / "global_step4" / "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt", "zero")
        (ckpt / "trainer_state.json").write_text("{}")
    prune_finished_checkpoints(tmp_path)
    assert not old.exists()
    assert sorted(p.name for p in last.iterdir()) == [CHECKPOINT_COMPLETE, "model.safetensors", "trainer_state.json"]
