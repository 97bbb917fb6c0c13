"""A resumed GRPO run is the same experiment: the synced reference is part of the checkpoint, every file of a
checkpoint is fsynced before its marker, and a checkpoint that cannot be loaded is set aside for the previous one.

Each case trains the real rl stage of a method (rlt, rcl) in process on the tiny Qwen2, with and without LoRA:
3 steps, refSync every 2 steps (beta > 0), a checkpoint every 2 steps. A second run that starts from a copy of the
first run's checkpoint-2 (taken after the sync of step 2) trains step 3 and must end with the same reference and
policy as the uninterrupted run."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import pytest
import torch
from suite_helpers import EXAMPLES, tiny_doc

from rlt.contract.layout import CHECKPOINT_COMPLETE, SET_ASIDE, RunLayout
from rlt.spec.run import RLTRun
from rlt.stages.context import StageContext

pytestmark = pytest.mark.slow

STEPS, SYNC_EVERY, SAVE_EVERY = 3, 2, 2


def rl_spec(method: str, lora: bool) -> RLTRun:
    import yaml

    doc = tiny_doc() if method == "rlt" else yaml.safe_load((EXAMPLES / "rltrun-rcl-tiny.yaml").read_text())
    spec = doc["spec"]
    spec["stages"]["sft"] = {"enabled": False}
    spec["stages"]["distill"] = {"enabled": False}
    spec["stages"]["rl"].update(
        steps=STEPS,
        saveSteps=SAVE_EVERY,
        saveTotalLimit=None,
        batchSize=4,
        perDeviceBatchSize=2,
        numGenerations=2,
        maxCompletionLength=6,
        beta=0.04,
        refSync={"enabled": True, "alpha": 0.9, "steps": SYNC_EVERY},
    )
    spec["dataset"]["size"] = 16
    if lora:
        spec["teacher"]["lora"] = {"r": 4, "alpha": 8}
    return RLTRun.model_validate(doc)


def reference_params(trainer) -> dict[str, torch.Tensor]:
    """The reference the KL term anchors to: TRL's ref_model, or with LoRA the policy with its adapter off."""
    if trainer.ref_model is not None:
        return {n: p.detach().clone() for n, p in trainer.ref_model.named_parameters()}
    base = trainer.accelerator.unwrap_model(trainer.model)
    return {n: p.detach().clone() for n, p in base.named_parameters() if "lora_" not in n}


def policy_params(trainer) -> dict[str, torch.Tensor]:
    model = trainer.accelerator.unwrap_model(trainer.model)
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def train_rl(run: RLTRun, root: Path, monkeypatch) -> dict:
    """The rl stage of `run` under `root`; what the test compares, read from the trainer when it ends."""
    import rlt.stages.trainer as trainer_mod
    from rlt.stages.rcl import run_rcl_rl
    from rlt.stages.rl import run_rl

    seen: dict = {}
    real_train = trainer_mod.TrainerRun.train

    def train(self, trainer):
        out = real_train(self, trainer)
        seen.update(ref=reference_params(trainer), policy=policy_params(trainer), has_ref=trainer.ref_model is not None)
        return out

    fsynced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd):
        fsynced.append(str(Path(f"/proc/self/fd/{fd}").readlink()))
        return real_fsync(fd)

    with monkeypatch.context() as m:
        m.setattr(trainer_mod.TrainerRun, "train", train)
        m.setattr(os, "fsync", fsync)
        torch.manual_seed(0)
        ctx = StageContext(run, RunLayout(root), device="cpu", show_progress=False)
        (run_rl if run.spec.method == "rlt" else run_rcl_rl)(ctx)
    seen["fsynced"] = fsynced
    seen["layout"] = RunLayout(root)
    return seen


CASES = [("rlt", False), ("rlt", True), ("rcl", False), ("rcl", True)]
_uninterrupted: dict = {}


@pytest.fixture
def uninterrupted(tmp_path_factory, monkeypatch):
    """The uninterrupted run of a case, trained once per case for the tests that read it."""

    def get(method: str, lora: bool) -> dict:
        key = (method, lora)
        if key not in _uninterrupted:
            root = tmp_path_factory.mktemp(f"whole-{method}-{'lora' if lora else 'full'}")
            _uninterrupted[key] = train_rl(rl_spec(method, lora), root, monkeypatch)
        return _uninterrupted[key]

    return get


@pytest.mark.parametrize(("method", "lora"), CASES, ids=[f"{m}-{'lora' if lo else 'full'}" for m, lo in CASES])
def test_a_run_resumed_after_a_sync_keeps_the_synced_reference(method, lora, uninterrupted, tmp_path, monkeypatch):
    whole = uninterrupted(method, lora)
    source = whole["layout"].checkpoint_dir("rl", SAVE_EVERY)
    resumed_root = RunLayout(tmp_path)
    shutil.copytree(source, resumed_root.checkpoint_dir("rl", SAVE_EVERY))
    resumed = train_rl(rl_spec(method, lora), tmp_path, monkeypatch)
    assert whole["has_ref"] is (not lora)  # with LoRA the reference is the frozen base (adapter off)
    start = RLTRun.model_validate(rl_spec(method, lora).model_dump(by_alias=True))
    assert start.spec.stages.rl.beta > 0
    assert set(resumed["ref"]) == set(whole["ref"])
    for name, want in whole["ref"].items():
        assert torch.equal(resumed["ref"][name], want), f"reference parameter {name} differs after the resume"
    for name, want in whole["policy"].items():
        torch.testing.assert_close(resumed["policy"][name], want, rtol=0, atol=1e-6, msg=f"policy {name}")
    from rlt.stages.reference import REFERENCE_FILE

    # with LoRA nothing differs from the start model, so nothing is stored
    assert (source / REFERENCE_FILE).exists() is (not lora)
    if not lora:  # the stored reference is the synced one, not the start model
        from safetensors.torch import load_file

        stored = load_file(str(source / REFERENCE_FILE))
        assert any(not torch.equal(stored[n], resumed["policy"][n]) for n in stored)


def test_every_file_of_a_checkpoint_is_fsynced_before_its_marker(uninterrupted):
    whole = uninterrupted("rlt", False)
    fsynced = whole["fsynced"]
    for step in (SAVE_EVERY, STEPS):
        checkpoint = whole["layout"].checkpoint_dir("rl", step)
        marker_at = max(i for i, p in enumerate(fsynced) if p.startswith(str(checkpoint / f".{CHECKPOINT_COMPLETE}")))
        before = set(fsynced[:marker_at])
        written = {str(p) for p in checkpoint.rglob("*") if p.name != CHECKPOINT_COMPLETE}
        assert len(written) > 5 and any(p.endswith("rlt-reference.safetensors") for p in written)
        # every file and folder, and the checkpoint's own entry in its parent
        assert written | {str(checkpoint), str(checkpoint.parent)} <= before, (
            f"not fsynced before the marker of {checkpoint.name}: {sorted(written - before)}"
        )
        assert str(checkpoint) in fsynced[marker_at + 1 :], "the marker's directory entry is not fsynced"


@pytest.mark.parametrize("shard", ["model.safetensors", "optimizer.pt", "rlt-reference.safetensors", "rng_state.pth"])
def test_a_checkpoint_that_cannot_be_loaded_is_set_aside_for_the_previous_one(shard, uninterrupted, tmp_path, caplog):
    from rlt.stages.checkpoints import last_checkpoint

    whole = uninterrupted("rlt", False)
    directory = tmp_path / "checkpoints"
    shutil.copytree(whole["layout"].checkpoints_dir("rl"), directory)
    newest = directory / f"checkpoint-{STEPS}"
    assert (newest / CHECKPOINT_COMPLETE).exists()
    size = (newest / shard).stat().st_size
    with (newest / shard).open("r+b") as f:  # a node crash after the marker, before the page cache reached the disk
        f.truncate(size // 2)
    with caplog.at_level(logging.WARNING):
        assert last_checkpoint(directory) == str(directory / f"checkpoint-{SAVE_EVERY}")
    assert not newest.exists()
    aside = list((directory / SET_ASIDE).iterdir())
    assert len(aside) == 1 and aside[0].name.startswith(f"checkpoint-{STEPS}.")
    assert (aside[0] / shard).stat().st_size == size // 2  # set aside, not deleted
    assert f"checkpoint-{STEPS} cannot be loaded" in caplog.text and shard in caplog.text


# --------------------------------------------------------------------------- a stop at any phase of a step

STOPPED_STEP = 2  # the step during which (or after whose sync) SIGTERM arrives


def signal_at(phase: str, monkeypatch, error: bool = False) -> dict:
    """SIGTERM to this process at `phase` of step STOPPED_STEP, through the real code's own calls (a wrapper on
    the function the phase runs); with `error` the rollout then fails (a drained generator). Counts the backward
    passes of that step (the loss computations)."""
    import signal

    import trl
    from trl.trainer.callbacks import SyncRefModelCallback

    from rlt.method.reward import RLTReward
    from rlt.stages import rl

    seen = {"trainer": None, "losses": 0}

    def during(trainer) -> bool:
        return trainer is not None and trainer.state.global_step == STOPPED_STEP - 1

    def kill():
        os.kill(os.getpid(), signal.SIGTERM)

    def wrap(owner, name, before=None, after=None):
        real = getattr(owner, name)

        def wrapped(*a, **kw):
            if before:
                before(*a, **kw)
            out = real(*a, **kw)
            if after:
                after(*a, **kw)
            return out

        monkeypatch.setattr(owner, name, wrapped)

    def rollout_hook(trainer, *_a, **_k):
        seen["trainer"] = trainer
        if phase == "rollout" and during(trainer):
            kill()
            if error:
                raise ConnectionError("the generator aborted the requests in flight")

    wrap(rl, "sample_policy", before=rollout_hook)
    wrap(
        trl.GRPOTrainer,
        "_get_per_token_logps_and_entropies",
        before=lambda self, model, *a, **k: (
            phase == "reference" and model is self.ref_model and during(self) and kill()
        ),
    )
    wrap(RLTReward, "score", before=lambda *a, **k: phase == "scoring" and during(seen["trainer"]) and kill())
    micro = {"n": 0}

    def after_micro(self, *a, **k):
        if during(self):
            micro["n"] += 1
            if phase == "accumulation" and micro["n"] == 1:
                kill()

    wrap(trl.GRPOTrainer, "training_step", after=after_micro)
    wrap(
        trl.GRPOTrainer,
        "_compute_loss",
        before=lambda self, *a, **k: during(self) and seen.__setitem__("losses", seen["losses"] + 1),
    )
    wrap(
        SyncRefModelCallback,
        "on_step_end",
        after=lambda self, args, state, *a, **k: phase == "sync" and state.global_step == STOPPED_STEP and kill(),
    )
    return seen


PHASES = {  # phase -> (where the gang abandons, the step saved, backward passes of the stopped step)
    "rollout": (f"after the rollout of step {STOPPED_STEP}", STOPPED_STEP - 1, 0),
    "reference": (f"after the reference and old-policy passes of step {STOPPED_STEP}", STOPPED_STEP - 1, 0),
    "scoring": (f"after the scoring of step {STOPPED_STEP}", STOPPED_STEP - 1, 0),
    "accumulation": (f"inside step {STOPPED_STEP}", STOPPED_STEP - 1, 1),
    "sync": (f"before step {STOPPED_STEP + 1}", STOPPED_STEP, 2),
}


@pytest.mark.parametrize("phase", list(PHASES))
def test_a_stop_at_any_phase_abandons_the_step_and_the_restart_changes_nothing(
    phase, uninterrupted, tmp_path, monkeypatch, capsys, sigterm_restored
):
    """Single process: SIGTERM in each phase of step 2; the stop comes at that phase's boundary (no backward
    before it), the saved step is the last completed one with the random state its successor started from, and
    the restart ends where the uninterrupted run ended (policy and reference)."""
    from rlt.stages.preemption import Stopped

    whole = uninterrupted("rlt", False)
    where, saved_step, losses = PHASES[phase]
    with monkeypatch.context() as m:
        seen = signal_at(phase, m)
        with pytest.raises(Stopped) as stopped:
            train_rl(rl_spec("rlt", False), tmp_path, m)
    out = capsys.readouterr().out
    assert f"SIGTERM: step abandoned {where}; saving step {saved_step}" in out, out[-2000:]
    assert stopped.value.step == saved_step
    assert seen["losses"] == losses  # the abandoned step ran no backward before the stop (a sync stop: both)
    assert RunLayout(tmp_path).checkpoint_dir("rl", saved_step).joinpath(CHECKPOINT_COMPLETE).exists()
    resumed = train_rl(rl_spec("rlt", False), tmp_path, monkeypatch)
    for name, want in whole["ref"].items():
        assert torch.equal(resumed["ref"][name], want), f"reference {name} differs from the uninterrupted run"
    for name, want in whole["policy"].items():
        torch.testing.assert_close(resumed["policy"][name], want, rtol=0, atol=1e-6, msg=f"policy {name}")


def test_an_error_after_a_stop_was_asked_is_a_stop_that_saves(tmp_path, monkeypatch, capsys, sigterm_restored):
    """SIGTERM, then the rollout fails (a drained generator aborting its requests): not a crash but a stop (exit
    STOPPED), with the last completed step saved."""
    from rlt.stages.preemption import Stopped

    with monkeypatch.context() as m:
        signal_at("rollout", m, error=True)
        with pytest.raises(Stopped) as stopped:
            train_rl(rl_spec("rlt", False), tmp_path, m)
    assert isinstance(stopped.value.__cause__, ConnectionError)
    assert stopped.value.step == STOPPED_STEP - 1 and stopped.value.checkpoint is not None
    assert stopped.value.checkpoint.endswith(f"checkpoint-{STOPPED_STEP - 1}")
    assert (Path(stopped.value.checkpoint) / CHECKPOINT_COMPLETE).exists()
    assert "SIGTERM, then ConnectionError: the generator aborted" in capsys.readouterr().out
