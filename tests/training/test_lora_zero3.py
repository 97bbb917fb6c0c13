"""ZeRO-3 on more than one rank finishes: the operator's rendered 2-GPU trainer command (`rlt launch` → accelerate
launch → torchrun → 2 DeepSpeed ZeRO-3 ranks over gloo). With `teacher.lora` set it runs sft and then rl to the end
and leaves each stage's merged model (rank 0 alone loads the base model to merge the adapter; inside the live ZeRO-3
config that load waits in `zero.Init` for ranks that are already in their exit barrier). One step off in-process, the
background thread's copy of the policy samples without ZeRO-3's collectives."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from suite_helpers import ROOT, free_port, kill_gang, tiny_doc

from rlt.checks.validation import validate_spec
from rlt.contract.layout import RunLayout
from rlt_operator import builders
from rlt_sandbox.kubelet_model import expand

pytestmark = pytest.mark.slow


def lora_zero3_spec():
    doc = tiny_doc()
    doc["metadata"]["name"] = "lz3"
    doc["spec"]["teacher"]["lora"] = {"r": 4, "alpha": 8, "dropout": 0.0, "targetModules": ["all-linear"]}
    st = doc["spec"]["stages"]
    st["sft"].update(maxSteps=1, deepspeedZeroStage=3, perDeviceBatchSize=2)  # the batch of 4 over 2 processes
    st["rl"].update(
        steps=1,
        saveSteps=100,
        batchSize=4,
        perDeviceBatchSize=2,
        numGenerations=2,
        maxCompletionLength=8,
        deepspeedZeroStage=3,
    )
    st["distill"] = {"enabled": False}
    doc["spec"]["dataset"]["size"] = 16
    doc["spec"]["resources"] = {"trainer": {"gpus": 2}}
    return validate_spec(doc["spec"], name="lz3")


def one_step_off_zero3_spec():
    """No LoRA, no sft: rl one step off in-process (a frozen copy of the policy samples in a background thread)."""
    doc = tiny_doc()
    doc["metadata"]["name"] = "lz3"
    st = doc["spec"]["stages"]
    st["sft"]["enabled"] = False
    st["rl"].update(
        steps=3, saveSteps=100, batchSize=4, perDeviceBatchSize=2, numGenerations=2, maxCompletionLength=8,
        deepspeedZeroStage=3, topP=1.0, generation={"mode": "inprocess", "overlap": "oneStepOff"},
    )  # fmt: skip
    st["distill"] = {"enabled": False}
    doc["spec"]["dataset"]["size"] = 16
    doc["spec"]["resources"] = {"trainer": {"gpus": 2}}
    return validate_spec(doc["spec"], name="lz3")


def run_stage(stage: str, tmp_path: Path, timeout: float = 240, spec=lora_zero3_spec) -> str:
    job = builders.trainer_job(builders.RunRef("lz3", "default", "u"), spec(), stage, 0)
    container = job["spec"]["template"]["spec"]["containers"][0]
    literal = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    vars_ = {"NODE_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    cmd = [expand(a, vars_) for a in container["command"]]
    cmd = [a.replace(builders.PVC_MOUNT, str(tmp_path / "pvc")) for a in cmd]
    assert "--zero_stage" in cmd and cmd[cmd.index("--zero_stage") + 1] == "3", cmd
    cmd[0] = str(Path(sys.executable).parent / "rlt")
    env = {
        **os.environ,
        "RLT_RUN_YAML": literal["RLT_RUN_YAML"],
        "PYTHONPATH": f"{ROOT / 'training'}:{ROOT / 'operator'}",
        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": "1",
        "CUDA_VISIBLE_DEVICES": "",
        "RLT_METRICS_PORT": "-1",
    }
    log = tmp_path / f"{stage}.log"
    proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_gang(proc, log)
        raise AssertionError(f"stage {stage} hung ({timeout} s):\n{log.read_text()[-3000:]}") from None
    text = log.read_text()
    assert code == 0, text[-4000:]
    return text


def test_lora_with_zero3_on_two_ranks_runs_sft_and_rl_to_the_merged_model(tmp_path):
    layout = RunLayout.for_run(tmp_path / "pvc", "lz3")
    for stage in ("sft", "rl"):
        text = run_stage(stage, tmp_path)
        assert re.search(rf"rlt-world stage={stage} rank=1 world_size=2", text), text[-2000:]
        assert (layout.stage_dir(stage) / "adapter" / "adapter_config.json").exists()
        assert (layout.model_dir(stage) / "config.json").exists(), "the merged model"
        assert not (layout.model_dir(stage) / "adapter_config.json").exists(), "a plain model, not an adapter"
        assert layout.stage_done(stage).exists()
    # the rl step's rows were dealt across the two ranks and the step's imbalance recorded (rlt.stages.balance)
    rl = [json.loads(line) for line in layout.metrics_file.read_text().splitlines() if '"stage": "rl"' in line]
    assert rl and all(r["rank_imbalance_tokens"] >= 1.0 and r["rank_imbalance_seconds"] >= 1.0 for r in rl), rl
    # so were sft's (rlt.stages.sft_balance), and each rank's micro-step measured
    sft = [json.loads(line) for line in layout.metrics_file.read_text().splitlines() if '"stage": "sft"' in line]
    assert sft and all(r["rank_imbalance_tokens"] >= 1.0 and r["rank_imbalance_seconds"] >= 1.0 for r in sft), sft


def test_one_step_off_in_process_on_two_zero3_ranks_runs_to_the_end(tmp_path):
    """The copy of the policy that samples ahead in a background thread (rlt.stages.overlap.LocalBehaviour) runs no
    collective. It kept DeepSpeed's start-of-forward hook (a broadcast), and HF generate's ZeRO-3 default
    synced_gpus added an all-reduce each token: they met the step's own collectives on the main thread in another
    order on each rank, and the two ranks hung at step 1 (stack dumps: the background thread in broadcast or
    all_reduce, the main thread in all_gather); each alone still hung. Now every step runs, with its rollout ahead."""
    layout = RunLayout.for_run(tmp_path / "pvc", "lz3")
    text = run_stage("rl", tmp_path, spec=one_step_off_zero3_spec)
    assert re.search(r"rlt-world stage=rl rank=1 world_size=2", text), text[-2000:]
    rl = [json.loads(line) for line in layout.metrics_file.read_text().splitlines() if '"stage": "rl"' in line]
    assert [r["step"] for r in rl] == [1, 2, 3], rl
    assert all(r.get("seconds_generate_ahead", 0) > 0 for r in rl[:2]), rl  # steps 2 and 3 were sampled ahead
    assert layout.stage_done("rl").exists()
