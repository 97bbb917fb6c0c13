"""rlt.stages.staged_saves without a model: two ranks' staged saves meet through their `rank-R.copied` files, the
marker comes only after both, and the durable folder keeps saveTotalLimit. The trainer is a stand-in (FakeTrainer)
with the two methods the staged save uses of transformers' Trainer: `_save_checkpoint` and `_get_output_dir`."""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from rlt.contract.layout import CHECKPOINT_COMPLETE
from rlt.stages.checkpoints import rotate
from rlt.stages.staged_saves import COPIED, StagedSaves


class FakeTrainer:
    """Stand-in for transformers' Trainer: saves `files` into <output dir>/checkpoint-<step>."""

    def __init__(self, durable: Path, files: dict[str, bytes], limit: int | None = None) -> None:
        self.args = SimpleNamespace(output_dir=str(durable), save_total_limit=limit)
        self.state = SimpleNamespace(global_step=0)
        self.files = files

    def _get_output_dir(self, trial):
        return self.args.output_dir

    def _save_checkpoint(self, model, trial):
        out = Path(self._get_output_dir(trial)) / f"checkpoint-{self.state.global_step}"
        out.mkdir(parents=True, exist_ok=True)
        for name, data in self.files.items():
            (out / name).write_bytes(data)


def test_the_marker_waits_for_every_rank_and_comes_last(tmp_path):
    durable = tmp_path / "volume"
    done: list = []
    t0 = FakeTrainer(durable, {"model.safetensors": b"0" * 100, "rng_state_0.pth": b"r0"})
    t1 = FakeTrainer(durable, {"rng_state_1.pth": b"r1"})
    s0 = StagedSaves(t0, tmp_path / "local0", 0, 2, lambda step, path: done.append((0, step)), timeout=30)
    s1 = StagedSaves(t1, tmp_path / "local1", 1, 2, lambda step, path: done.append((1, step)), timeout=30)
    s0.install()
    s1.install()
    t0.state.global_step = t1.state.global_step = 5
    gate = threading.Event()
    import rlt.stages.staged_saves as mod

    real = mod.copy_fsynced

    def slow_on_rank_1(src, dst):
        if "local1" in str(src):
            gate.wait(30)  # rank 1's copy held back
        return real(src, dst)

    mod.copy_fsynced = slow_on_rank_1
    try:
        t0._save_checkpoint(None, None)  # returns at once: the local write only
        t1._save_checkpoint(None, None)
        ckpt = durable / "checkpoint-5"
        assert (tmp_path / "local1" / "rank-1" / "checkpoint-5" / "rng_state_1.pth").exists()
        s0.thread.join(0.5)
        assert (ckpt / COPIED.format(0)).exists() and not (ckpt / CHECKPOINT_COMPLETE).exists()  # waits for rank 1
        gate.set()
        s1.wait()
        s0.wait()
    finally:
        mod.copy_fsynced = real
    assert (ckpt / CHECKPOINT_COMPLETE).exists()
    assert sorted(p.name for p in ckpt.iterdir()) == sorted(
        [
            CHECKPOINT_COMPLETE,
            "model.safetensors",
            "rng_state_0.pth",
            "rng_state_1.pth",
            "rank-0.copied",
            "rank-1.copied",
        ]
    )
    assert sorted(done) == [(0, 5), (1, 5)]
    assert not (tmp_path / "local0" / "rank-0" / "checkpoint-5").exists()  # the local space is given back


def test_a_complete_checkpoint_is_never_rewritten(tmp_path):
    durable = tmp_path / "volume"
    t = FakeTrainer(durable, {"model.safetensors": b"new"})
    (durable / "checkpoint-3").mkdir(parents=True)
    (durable / "checkpoint-3" / "model.safetensors").write_bytes(b"old")
    (durable / "checkpoint-3" / CHECKPOINT_COMPLETE).write_text("x")
    s = StagedSaves(t, tmp_path / "local", 0, 1, lambda step, path: None)
    s.install()
    t.state.global_step = 3
    t._save_checkpoint(None, None)
    s.wait()
    assert (durable / "checkpoint-3" / "model.safetensors").read_bytes() == b"old"


def test_a_failed_copy_is_raised_at_the_next_wait(tmp_path, monkeypatch):
    import rlt.stages.staged_saves as mod

    t = FakeTrainer(tmp_path / "volume", {"a": b"1"})
    s = StagedSaves(t, tmp_path / "local", 0, 1, lambda step, path: None)
    s.install()
    monkeypatch.setattr(mod, "copy_fsynced", lambda src, dst: (_ for _ in ()).throw(OSError("volume gone")))
    t._save_checkpoint(None, None)
    with pytest.raises(RuntimeError, match="durable copy of a checkpoint failed: volume gone"):
        s.wait()
    assert not (tmp_path / "volume" / "checkpoint-0" / CHECKPOINT_COMPLETE).exists()


def test_a_checkpoint_deleted_halfway_is_never_resumed_from(tmp_path, monkeypatch):
    """Retention killed midway (the pod stopped while rmtree ran): the marker goes first, so a resume sets the
    half-deleted checkpoint aside instead of loading it, failing on its missing shards and crash-looping."""
    import shutil

    from rlt.stages.checkpoints import last_checkpoint

    for step in (2, 4):
        folder = tmp_path / f"checkpoint-{step}"
        folder.mkdir()
        (folder / "rng_state.txt").write_text("w")  # a shard unloadable() does not parse
        (folder / CHECKPOINT_COMPLETE).write_text("x")

    def killed(path, ignore_errors=False):  # the kill: one shard gone, then nothing more
        (path / "rng_state.txt").unlink()
        raise KeyboardInterrupt

    monkeypatch.setattr(shutil, "rmtree", killed)
    with pytest.raises(KeyboardInterrupt):
        rotate(tmp_path, 1)  # checkpoint-2 goes: killed while it went
    assert last_checkpoint(tmp_path) == str(tmp_path / "checkpoint-4")
    monkeypatch.undo()
    shutil.rmtree(tmp_path / "checkpoint-4")  # the newest lost too: the half-deleted one must not come back
    assert last_checkpoint(tmp_path) is None


def test_rotate_keeps_the_newest_complete(tmp_path):
    for step, complete in ((2, True), (4, True), (6, False), (8, True), (10, False)):
        (tmp_path / f"checkpoint-{step}").mkdir()
        if complete:
            (tmp_path / f"checkpoint-{step}" / CHECKPOINT_COMPLETE).write_text("x")
    gone = rotate(tmp_path, 2)
    assert sorted(p.name for p in gone) == ["checkpoint-2", "checkpoint-6"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-10", "checkpoint-4", "checkpoint-8"]
    assert rotate(tmp_path, None) == []


def test_a_stop_whose_durable_copy_failed_names_the_checkpoint_before(monkeypatch):
    """A single process stopped by an error after SIGTERM saves the last step; when that save's durable copy fails,
    the stop names the last complete checkpoint, not the one that never became durable."""
    from types import SimpleNamespace

    from rlt.stages import preemption
    from rlt.stages.trainer import TrainerRun

    run = object.__new__(TrainerRun)  # only what stopped_by_error reads
    run.stage, run.stop = "rl", preemption.StopRequest()
    run.recorder = SimpleNamespace(last_checkpoint="/v/rl/checkpoints/checkpoint-4")
    monkeypatch.setattr(preemption, "save_abandoned", lambda trainer, rng: "/v/rl/checkpoints/checkpoint-6")

    def copy_failed():
        raise RuntimeError("durable copy of a checkpoint failed: volume gone")

    trainer = SimpleNamespace(state=SimpleNamespace(global_step=6))
    stopped = run.stopped_by_error(trainer, OSError("peer gone"), None, SimpleNamespace(wait=copy_failed))
    assert (stopped.step, stopped.checkpoint) == (4, "/v/rl/checkpoints/checkpoint-4")
    copied = run.stopped_by_error(trainer, OSError("peer gone"), None, SimpleNamespace(wait=lambda: None))
    assert (copied.step, copied.checkpoint) == (6, "/v/rl/checkpoints/checkpoint-6")


def test_a_rank_waits_while_copies_go_on_and_gives_up_when_they_stall(tmp_path):
    """The wait for the peers' copies (and for rank 0's marker) is bounded by time without progress, not by time:
    a copy that keeps bringing files for longer than the timeout is waited for; one that brings nothing times out,
    naming what is missing."""
    from rlt.stages.staged_saves import tree_size, wait_for

    ckpt = tmp_path / "checkpoint-5"
    ckpt.mkdir()
    done = ckpt / COPIED.format(1)

    def slow_copy() -> None:  # 5 s of steady copying, then the peer's word
        for i in range(50):
            (ckpt / f"shard-{i}").write_bytes(b"x" * 10)
            threading.Event().wait(0.1)
        done.write_text("copied")

    copier = threading.Thread(target=slow_copy, daemon=True)
    copier.start()
    wait_for([done], 2.0, "checkpoint-5", lambda: tree_size(ckpt), every=0.5)  # 5 s, never 2 s without a file
    copier.join()
    assert tree_size(ckpt) == (51, 500 + len("copied"))
    with pytest.raises(TimeoutError, match=r"checkpoint-5: \['rank-2.copied'\] not there, and no copy went on"):
        wait_for([ckpt / COPIED.format(2)], 1.0, "checkpoint-5", lambda: tree_size(ckpt), every=0.5)
