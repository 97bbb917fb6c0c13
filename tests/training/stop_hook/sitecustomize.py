"""Test hook for tests/training/test_restart_changes_nothing.py and test_sft_gang_resume.py, loaded by every
Python process of a test gang (its folder heads their PYTHONPATH): with RLT_TEST_SIGTERM_AT=<phase>:<step>, rank 1 sends itself SIGTERM at that
phase of that step, inside the real code's own calls, as a preemption arriving exactly then would. No other process
and no run outside that test sets the variable."""

import os

_AT = os.environ.get("RLT_TEST_SIGTERM_AT")


def _install(phase: str, step: int) -> None:
    import signal

    import trl

    seen = {"trainer": None, "micro": 0, "sent": False}

    def during(trainer) -> bool:
        return trainer is not None and trainer.state.global_step == step - 1

    def kill(why: bool) -> None:
        if why and not seen["sent"]:
            seen["sent"] = True
            os.write(1, f"rlt-test SIGTERM to rank 1 at {phase} of step {step}\n".encode())
            os.kill(os.getpid(), signal.SIGTERM)

    if phase == "sft-accumulation":  # an SFT-like stage (sft, student): after step `step`'s first micro-batch
        real_sft_step = trl.SFTTrainer.training_step

        def sft_step(self, *a, **kw):
            out = real_sft_step(self, *a, **kw)
            kill(self.state.global_step == step - 1)
            return out

        trl.SFTTrainer.training_step = sft_step
        return

    from trl.trainer.callbacks import SyncRefModelCallback

    from rlt.method.reward import RLTReward
    from rlt.stages import rl

    real_sample = rl.sample_policy

    def sample_policy(trainer, *a, **kw):
        seen["trainer"] = trainer
        kill(phase == "rollout" and during(trainer))
        return real_sample(trainer, *a, **kw)

    real_score = RLTReward.score

    def score(self, *a, **kw):
        kill(phase == "scoring" and during(seen["trainer"]))
        return real_score(self, *a, **kw)

    real_training_step = trl.GRPOTrainer.training_step

    def training_step(self, *a, **kw):
        out = real_training_step(self, *a, **kw)
        if during(self):
            seen["micro"] += 1
            kill(phase == "accumulation" and seen["micro"] == 1)
        return out

    real_step_end = SyncRefModelCallback.on_step_end

    def on_step_end(self, args, state, control, **kw):
        out = real_step_end(self, args, state, control, **kw)
        kill(phase == "sync" and state.global_step == step)
        return out

    rl.sample_policy = sample_policy
    RLTReward.score = score
    trl.GRPOTrainer.training_step = training_step
    SyncRefModelCallback.on_step_end = on_step_end


if _AT and os.environ.get("RANK") == "1":
    _phase, _step = _AT.split(":")
    _install(_phase, int(_step))
