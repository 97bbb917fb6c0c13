"""The tiny toolbox example run for real (TRL trainers with PEFT, TensorBoard/MLflow/W&B offline, fsspec outputs),
then what it left read back with each library's own reader."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from suite_helpers import ROOT

from rlt.contract.layout import checkpoints
from rlt.contract.metrics import REWARD_COMPONENTS, STEP_PHASES
from rlt.run.plots import read_metrics
from rlt.spec.loading import parse_run

EXAMPLE = ROOT / "manifests" / "examples" / "rltrun-tiny-toolbox.yaml"
pytestmark = pytest.mark.slow


class LocalHubStandIn:
    """A local stand-in for huggingface_hub.HfApi (no Hub is reachable here): the calls push_hub makes, with
    files copied into a folder per repository."""

    def __init__(self, root: Path):
        self.root, self.repos = root, {}

    def create_repo(self, repo_id, repo_type, private, exist_ok):
        self.repos[(repo_type, repo_id)] = {"private": private}

    def upload_folder(self, repo_id, repo_type, folder_path, commit_message):
        assert (repo_type, repo_id) in self.repos, "upload before create_repo"
        shutil.copytree(folder_path, self.root / repo_type / repo_id, dirs_exist_ok=True)

    def upload_file(self, repo_id, repo_type, path_or_fileobj, path_in_repo, commit_message):
        assert (repo_type, repo_id) in self.repos, "upload before create_repo"
        (self.root / repo_type / repo_id).mkdir(parents=True, exist_ok=True)
        shutil.copy(path_or_fileobj, self.root / repo_type / repo_id / path_in_repo)


@pytest.fixture(scope="module")
def finished(run_to_end, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("toolbox")
    data = tmp / "problems.jsonl"
    from rlt.data import tasks

    rows = [{"id": f"q-{i:03d}", **r} for i, r in enumerate(tasks.generate("arithmetic", 12, seed=5))]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["dataset"] = {"source": str(data), "keepColumns": ["id"]}
    doc["spec"]["outputs"] = {
        "distillDataset": (tmp / "bucket" / "distill").as_uri(),
        "teacher": "memory://bucket/teacher",
    }
    done = run_to_end(parse_run(doc), tmp / "results")
    return done.run, done.layout, tmp, {r["id"]: r for r in rows}


def test_tensorboard_event_files_hold_the_rlt_figures_under_their_metric_names(finished):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run, layout, _, _ = finished
    rows = [r for r in read_metrics(layout.metrics_file) if r["stage"] == "rl"]
    acc = EventAccumulator(str(layout.root / "tracking" / "tensorboard" / "rl"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    want = {
        "rlt_reward_mean",
        "rlt_reward_std",
        "rlt_loss",
        "rlt_step_seconds",
        "rlt_generated_tokens_total",
        *(f"rlt_reward_component/{c}" for c in REWARD_COMPONENTS),
        *(f"rlt_step_phase_seconds/{p}" for p in STEP_PHASES if p != "weight_sync"),
    }
    assert want <= tags
    assert {"train/loss", "train/learning_rate"} <= tags  # the Trainer's own TensorBoard callback, same folder
    by_step = {e.step: e.value for e in acc.Scalars("rlt_reward_mean")}
    assert by_step == pytest.approx({r["step"]: r["reward"] for r in rows}, abs=1e-5)
    r_ss = {e.step: e.value for e in acc.Scalars("rlt_reward_component/r_ss")}
    assert r_ss == pytest.approx({r["step"]: r["r_ss"] for r in rows}, abs=1e-5)
    distill = EventAccumulator(str(layout.root / "tracking" / "tensorboard" / "distill"))
    distill.Reload()
    assert "rlt_reward_mean" in distill.Tags()["scalars"]


def test_mlflow_file_store_holds_the_same_numbers(finished):
    from mlflow.tracking import MlflowClient

    run, layout, _, _ = finished
    client = MlflowClient(tracking_uri=(layout.root / "tracking" / "mlruns").resolve().as_uri())
    (exp,) = [e for e in client.search_experiments() if e.name == run.name]
    runs = client.search_runs([exp.experiment_id])
    rl_rows = [r for r in read_metrics(layout.metrics_file) if r["stage"] == "rl"]
    with_reward = [
        r
        for r in runs
        if "rlt_reward_mean" in r.data.metrics and "loss" in r.data.metrics and "rlt_policy_kl" in r.data.metrics
    ]
    assert with_reward, "the rl stage's MLflow run (opened by the Trainer's callback) holds the rlt figures"
    history = client.get_metric_history(with_reward[0].info.run_id, "rlt_reward_mean")
    assert {m.step: m.value for m in history} == pytest.approx({r["step"]: r["reward"] for r in rl_rows}, abs=1e-5)
    names = {r.info.run_name for r in runs}
    assert f"{run.name}-distill" in names  # no Trainer there: the Tracker opened the run


def read_wandb_offline_history(path: Path) -> list[dict[str, float]]:
    """History rows of an offline W&B run file (run-*.wandb). wandb 0.31 ships no Python reader (its core is Go):
    the file is a 7-byte header, then LevelDB-log framed chunks (32 KiB blocks; 7-byte header crc/length/type;
    types full=1, first=2, middle=3, last=4) of wandb's own Record protobufs, parsed with wandb.proto."""
    import struct

    from wandb.proto import wandb_internal_pb2 as pb

    data, pos, block, part, rows = path.read_bytes(), 7, 32768, b"", []
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # block trailer too short for a header
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        part = chunk if kind in (1, 2) else part + chunk
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(part)
            if record.WhichOneof("record_type") == "history":
                rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item})
    return rows


def test_wandb_offline_runs_hold_the_rlt_figures(finished):
    run, layout, _, _ = finished
    files = sorted((layout.root / "tracking" / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 3, "W&B offline: one run per stage (sft, rl, distill)"
    rl_rows = [r for r in read_metrics(layout.metrics_file) if r["stage"] == "rl"]
    logged = {}
    for f in files:
        for row in read_wandb_offline_history(f):
            if "rlt_policy_kl" in row:  # only the rl stage has a policy KL
                logged[row["rlt_stage_step"]] = row
    assert sorted(logged) == [r["step"] for r in rl_rows]
    for r in rl_rows:
        assert logged[r["step"]]["rlt_reward_mean"] == pytest.approx(r["reward"], abs=1e-5)
        assert logged[r["step"]]["rlt_reward_component/r_kl"] == pytest.approx(r["r_kl"], abs=1e-5)


def test_lora_checkpoints_hold_the_adapter_and_the_stage_model_is_merged(finished):
    import torch
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    run, layout, _, _ = finished
    for _step, ckpt in checkpoints(layout.checkpoints_dir("rl")):
        assert (ckpt / "adapter_model.safetensors").exists() and not (ckpt / "model.safetensors").exists()
    merged_dir, adapter_dir = layout.model_dir("rl"), layout.adapter_dir("rl")
    assert not (merged_dir / "adapter_config.json").exists()
    merged = AutoModelForCausalLM.from_pretrained(merged_dir)
    start = AutoModelForCausalLM.from_pretrained(layout.model_dir("sft"))  # rl started from the merged sft model
    assert any("lora" in k for k in load_file(adapter_dir / "adapter_model.safetensors"))
    live = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(layout.model_dir("sft")), adapter_dir)
    ids = torch.tensor([[5, 17, 40, 99, 3, 250]])
    with torch.no_grad():
        a, b, c = merged(ids).logits, live(ids).logits, start(ids).logits
    assert torch.allclose(a, b, atol=1e-5)
    assert not torch.allclose(a, c, atol=1e-4), "the adapter learnt nothing: merged == start"


def test_outputs_pushed_through_fsspec_with_kept_columns(finished):
    import fsspec

    run, layout, tmp, by_id = finished
    pushed = json.loads((layout.root / "outputs.json").read_text())
    dataset_uri = pushed["distillDataset"]
    assert dataset_uri == (tmp / "bucket" / "distill").as_uri() + "/dataset.jsonl"
    with fsspec.open(dataset_uri, "r") as f:
        rows = [json.loads(line) for line in f]
    assert rows == [json.loads(x) for x in layout.distill_dataset.read_text().splitlines()]
    for r in rows:  # the source's id travels with its question
        assert by_id[r["id"]]["question"] == r["question"]
    assert pushed["teacher"] == "memory://bucket/teacher"
    mem = fsspec.filesystem("memory")
    assert mem.cat("/bucket/teacher/model.safetensors") == (layout.model_dir("rl") / "model.safetensors").read_bytes()


def test_hub_push_against_a_local_stand_in(finished, tmp_path):
    from rlt.contract.outputs import push_stage_outputs
    from rlt.stages.context import StageContext

    run, layout, _, _ = finished
    spec = run.spec.model_copy(
        update={
            "outputs": run.spec.outputs.model_copy(
                update={"teacher": "hf://my-org/tiny-teacher", "distill_dataset": "hf://datasets/my-org/tiny-distill"}
            )
        }
    )
    hub = LocalHubStandIn(tmp_path)
    ctx = StageContext(run.model_copy(update={"spec": spec}), layout, show_progress=False)
    assert push_stage_outputs(ctx, "rl", hub_api=hub) == {"teacher": "hf://my-org/tiny-teacher"}
    assert push_stage_outputs(ctx, "distill", hub_api=hub) == {"distillDataset": "hf://datasets/my-org/tiny-distill"}
    assert hub.repos == {
        ("model", "my-org/tiny-teacher"): {"private": True},
        ("dataset", "my-org/tiny-distill"): {"private": True},
    }
    assert (tmp_path / "model" / "my-org" / "tiny-teacher" / "model.safetensors").exists()
    assert (
        tmp_path / "dataset" / "my-org" / "tiny-distill" / "dataset.jsonl"
    ).read_text() == layout.distill_dataset.read_text()
