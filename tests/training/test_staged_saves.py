"""Saves off the critical path (rlt.stages.staged_saves, RLT_LOCAL_CHECKPOINTS set): the restart tests of
test_reference_resume pass when the Trainer writes to local storage and a background copy makes the checkpoint
durable (the synced reference kept, every file fsynced before the marker, a torn checkpoint set aside for the one
before, a stop at a phase boundary restarting to the uninterrupted result), the checkpoints really went through
the local folder, and a crash during the durable copy leaves no marker: the resume falls back to the previous one."""

from __future__ import annotations

import pytest
import test_reference_resume as rr

from rlt.contract.env import LOCAL_CHECKPOINTS
from rlt.contract.layout import CHECKPOINT_COMPLETE, RunLayout

pytestmark = pytest.mark.slow
_whole: dict = {}


@pytest.fixture
def copies(tmp_path_factory, monkeypatch):
    """Saves staged under a local folder; records every (local, durable) copy the background made."""
    from rlt.stages import staged_saves

    local = tmp_path_factory.mktemp("local-disk")
    monkeypatch.setenv(LOCAL_CHECKPOINTS.name, str(local))
    made: list = []
    real = staged_saves.copy_fsynced

    def recorded(src, dst):
        made.append((src, dst))
        return real(src, dst)

    monkeypatch.setattr(staged_saves, "copy_fsynced", recorded)
    return local, made


@pytest.fixture
def uninterrupted(tmp_path_factory, monkeypatch, copies):
    def get(method: str, lora: bool) -> dict:
        if (method, lora) not in _whole:
            root = tmp_path_factory.mktemp(f"staged-{method}-{'lora' if lora else 'full'}")
            _whole[(method, lora)] = rr.train_rl(rr.rl_spec(method, lora), root, monkeypatch) | {"copies": copies}
        return _whole[(method, lora)]

    return get


def test_checkpoints_go_through_local_storage(uninterrupted):
    whole = uninterrupted("rlt", False)
    local, made = whole["copies"]
    layout = whole["layout"]
    want = [(local / "rank-0" / f"checkpoint-{s}", layout.checkpoint_dir("rl", s)) for s in (rr.SAVE_EVERY, rr.STEPS)]
    assert made == want
    assert not any((local / "rank-0").iterdir())  # the local copies are given back once durable
    for _src, dst in made:
        assert (dst / CHECKPOINT_COMPLETE).exists() and (dst / "rlt-reference.safetensors").exists()


def test_staged_resume_keeps_the_synced_reference(uninterrupted, tmp_path, monkeypatch):
    rr.test_a_run_resumed_after_a_sync_keeps_the_synced_reference("rlt", False, uninterrupted, tmp_path, monkeypatch)


def test_staged_every_file_is_fsynced_before_the_marker(uninterrupted):
    rr.test_every_file_of_a_checkpoint_is_fsynced_before_its_marker(uninterrupted)


@pytest.mark.parametrize("shard", ["model.safetensors", "rlt-reference.safetensors"])
def test_staged_torn_checkpoint_is_set_aside(shard, uninterrupted, tmp_path, caplog):
    rr.test_a_checkpoint_that_cannot_be_loaded_is_set_aside_for_the_previous_one(shard, uninterrupted, tmp_path, caplog)


@pytest.mark.parametrize("phase", ["rollout", "sync"])
def test_staged_stop_restarts_to_the_uninterrupted_result(
    phase,
    uninterrupted,
    tmp_path,
    monkeypatch,
    capsys,
    sigterm_restored,
):
    rr.test_a_stop_at_any_phase_abandons_the_step_and_the_restart_changes_nothing(
        phase, uninterrupted, tmp_path, monkeypatch, capsys, sigterm_restored
    )


def test_a_crash_during_the_durable_copy_leaves_no_marker_and_the_resume_falls_back(copies, tmp_path, monkeypatch):
    """The copy of the last checkpoint dies half-way (a node lost while copying): the stage fails, the checkpoint
    has some files but no marker, and the resume takes the previous one (setting the torn one aside)."""
    from rlt.stages import staged_saves
    from rlt.stages.checkpoints import last_checkpoint

    real = staged_saves.copy_fsynced

    def dies_on_the_last(src, dst):
        if dst.name == f"checkpoint-{rr.STEPS}":
            (dst / "model.safetensors").parent.mkdir(parents=True, exist_ok=True)
            (dst / "model.safetensors").write_bytes(b"half")
            raise OSError("node lost during the copy")
        return real(src, dst)

    monkeypatch.setattr(staged_saves, "copy_fsynced", dies_on_the_last)
    with pytest.raises(RuntimeError, match="durable copy of a checkpoint failed: node lost"):
        rr.train_rl(rr.rl_spec("rlt", False), tmp_path, monkeypatch)
    directory = RunLayout(tmp_path).checkpoints_dir("rl")
    torn = directory / f"checkpoint-{rr.STEPS}"
    assert (torn / "model.safetensors").exists() and not (torn / CHECKPOINT_COMPLETE).exists()
    assert last_checkpoint(directory) == str(directory / f"checkpoint-{rr.SAVE_EVERY}")
