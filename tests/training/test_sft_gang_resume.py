"""An sft gang stopped mid-epoch and restarted trains the rows an uninterrupted one does: the operator's rendered
2-rank trainer command (rlt launch → accelerate → torchrun → 2 ranks over gloo) runs sft for two epochs of 4 steps;
SIGTERM reaches rank 1 inside step 7 (tests/training/stop_hook), the gang saves step 6 and stops (exit 75), and the
restart resumes two steps into the second epoch. Its final weights must be the uninterrupted run's.

The bug this holds off: resuming mid-epoch, transformers wraps the loader to skip the trained batches, and with
several processes its set_epoch no longer reached rlt's row deal (rlt.stages.sft_balance.StepDeal, shuffled by the
epoch), so the rest of the second epoch was cut from the first epoch's order."""

from __future__ import annotations

import pytest
import torch
import yaml
from suite_helpers import ROOT, tiny_doc
from test_preemption import finish, gang_command, start

from rlt.contract.exitcodes import ExitCode
from rlt.contract.layout import RunLayout

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2700)]  # three gangs, each bounded by finish() at 900 s

HOOK = ROOT / "tests" / "training" / "stop_hook"
STEPS_PER_EPOCH, EPOCHS, STOP_STEP = 4, 2, 7  # stopped inside step 7: step 6 saved, two steps into the 2nd epoch


def sft_gang(tmp_path):
    tmp_path.mkdir(parents=True, exist_ok=True)
    doc = tiny_doc()
    doc["metadata"]["name"] = "sft-gang"
    doc["spec"]["dataset"].update(size=16)  # 16 rows, 4 a step (2 ranks × 1 × 2 micro-batches): 4 steps an epoch
    st = doc["spec"]["stages"]
    st["rl"] = {"enabled": False}
    st["distill"] = {"enabled": False}
    st["sft"] = {k: v for k, v in st["sft"].items() if k != "maxSteps"} | {
        "epochs": EPOCHS,
        "batchSize": 4,
        "perDeviceBatchSize": 1,
    }
    run = tmp_path / "run.yaml"
    run.write_text(yaml.safe_dump(doc))
    cmd, extra = gang_command(run, tmp_path, "sft-gang", stage="sft")
    extra["PYTHONPATH"] = f"{HOOK}:{ROOT / 'training'}:{ROOT / 'operator'}"
    return cmd, extra, RunLayout.for_run(tmp_path / "pvc", "sft-gang")


def weights(layout: RunLayout) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(layout.model_dir("sft") / "model.safetensors"))


def test_an_sft_gang_stopped_mid_epoch_resumes_to_the_uninterrupted_weights(tmp_path):
    cmd, extra, layout = sft_gang(tmp_path / "whole")
    log = tmp_path / "whole" / "gang.log"
    assert finish(start(cmd, log, tmp_path / "whole", **extra), log, 900) == 0, log.read_text()[-4000:]
    whole = weights(layout)

    cmd, extra, layout = sft_gang(tmp_path / "stopped")
    log = tmp_path / "stopped" / "gang.log"
    proc = start(cmd, log, tmp_path / "stopped", RLT_TEST_SIGTERM_AT=f"sft-accumulation:{STOP_STEP}", **extra)
    code = finish(proc, log, 900)
    text = log.read_text()
    assert f"rlt-test SIGTERM to rank 1 at sft-accumulation of step {STOP_STEP}" in text, text[-4000:]
    assert code == ExitCode.STOPPED, text[-4000:]
    assert f"stage sft stopped on SIGTERM after step {STOP_STEP - 1}; checkpoint" in text, text[-4000:]

    log = tmp_path / "stopped" / "resumed.log"
    assert finish(start(cmd, log, tmp_path / "stopped", **extra), log, 900) == 0, log.read_text()[-4000:]
    resumed = weights(layout)
    assert set(resumed) == set(whole)
    for name, want in whole.items():
        torch.testing.assert_close(resumed[name], want, rtol=0, atol=1e-6, msg=f"{name}: the resumed epoch's rows")
