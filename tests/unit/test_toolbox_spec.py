"""The researcher's toolbox in the spec and the manifests: trainer options and trainerArgs (checked against the
real TRL config classes), tracking and outputs settings, Secret-only credentials, LoRA placement."""

from __future__ import annotations

import pytest
import yaml
from suite_helpers import ROOT

from rlt.contract.layout import RunLayout
from rlt.spec.loading import SpecError, parse_run

EXAMPLES = ROOT / "manifests" / "examples"


def doc(**spec_patch) -> dict:
    d = yaml.safe_load((EXAMPLES / "rltrun-tiny.yaml").read_text())
    for path, value in spec_patch.items():
        node = d["spec"]
        keys = path.split("__")
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        node[keys[-1]] = value
    return d


def problems(d: dict) -> list[str]:
    with pytest.raises(SpecError) as err:
        parse_run(d)
    return err.value.problems


def test_trainer_args_may_not_set_what_the_spec_owns():
    from rlt.checks.validation import load_valid_runs

    def refused(d, tmp):
        path = tmp / "r.yaml"
        path.write_text(yaml.safe_dump(d))
        with pytest.raises(SpecError) as err:
            load_valid_runs(path)
        return err.value.problems

    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        assert refused(doc(stages__rl__trainerArgs={"learning_rate": 1e-3}), Path(tmp)) == [
            "spec.stages.rl.trainerArgs.learning_rate: set by rlt; set spec.stages.rl.learningRate"
        ]
        assert refused(doc(stages__sft__trainerArgs={"report_to": "wandb"}), Path(tmp)) == [
            "spec.stages.sft.trainerArgs.report_to: set by rlt; set spec.tracking"
        ]


def test_trainer_args_checked_against_the_installed_trl():
    from rlt.stages.trainer_check import check_trainer_args

    typo = parse_run(doc(stages__sft__trainerArgs={"adam_epsilom": 1e-7}, stages__rl__trainerArgs={"optim": "sgd"}))
    assert check_trainer_args(typo) == [
        "spec.stages.sft.trainerArgs.adam_epsilom: not a SFTConfig option (did you mean adam_epsilon?)"
    ]
    bad_value = parse_run(doc(stages__rl__trainerArgs={"optim": "not_an_optimizer"}))
    (p,) = check_trainer_args(bad_value)
    assert p.startswith("spec.stages.rl.trainerArgs.optim: \"not_an_optimizer\" is a str, not 'adamw_torch'")
    # what the option table cannot see, building TRL's config does (two options that exclude each other)
    clash = parse_run(
        doc(stages__rl__trainerArgs={"use_liger_kernel": True, "fp16_full_eval": True, "bf16_full_eval": True})
    )
    (p,) = check_trainer_args(clash)
    assert p.startswith("spec.stages.rl.trainerArgs: GRPOConfig refuses them: "), p
    good = parse_run(doc(stages__sft__trainerArgs={"adam_epsilon": 1e-7}, stages__rl__trainerArgs={"adam_beta1": 0.8}))
    assert check_trainer_args(good) == []


def test_typed_options_and_trainer_args_reach_the_trl_configs(tmp_path):
    from rlt.stages.context import StageContext
    from rlt.stages.rl import grpo_config
    from rlt.stages.sft import sft_config

    run = parse_run(
        doc(
            stages__sft__maxGradNorm=0.25,
            stages__sft__loggingSteps=3,
            stages__sft__saveTotalLimit=2,
            stages__sft__trainerArgs={"adam_epsilon": 1e-7, "dataloader_drop_last": True},
            stages__rl__lrScheduler="cosine",
            stages__rl__warmupRatio=0.1,
            stages__rl__weightDecay=0.01,
            stages__rl__trainerArgs={"adam_beta1": 0.8},
            tracking={"tensorboard": True},
        )
    )
    ctx = StageContext(run, RunLayout.for_run(tmp_path, run.name), show_progress=False)
    sft = sft_config(ctx, "cpu")
    assert (sft.max_grad_norm, sft.logging_steps, sft.save_total_limit) == (0.25, 3, None)  # rlt rotates
    assert (sft.adam_epsilon, sft.dataloader_drop_last) == (1e-7, True)
    assert sft.report_to == ["tensorboard"] and (sft.bf16, sft.fp16, sft.use_cpu) == (False, False, True)
    rl = grpo_config(ctx, "cpu")
    assert (rl.lr_scheduler_type.value, rl.warmup_steps, rl.weight_decay, rl.adam_beta1) == ("cosine", 0.1, 0.01, 0.8)
    assert rl.report_to == ["tensorboard"]
    plain = parse_run(doc())
    assert grpo_config(StageContext(plain, RunLayout.for_run(tmp_path, "p")), "cpu").report_to == []


def test_a_constant_schedule_keeps_its_warmup(tmp_path):
    """lrScheduler constant with warmupRatio > 0 warms up (transformers' plain "constant" would drop the warmup):
    the learning rate the real scheduler gives rises over the warmup steps, then stays at learningRate."""
    import torch
    from transformers import get_scheduler

    from rlt.stages.context import StageContext
    from rlt.stages.sft import sft_config

    run = parse_run(doc(stages__sft__lrScheduler="constant", stages__sft__warmupRatio=0.2))
    args = sft_config(StageContext(run, RunLayout.for_run(tmp_path, run.name), show_progress=False), "cpu")
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    steps = 10
    schedule = get_scheduler(
        args.lr_scheduler_type, optimizer, num_warmup_steps=args.get_warmup_steps(steps), num_training_steps=steps
    )
    lrs = []
    for _ in range(steps):
        lrs.append(schedule.get_last_lr()[0])
        optimizer.step()
        schedule.step()
    assert lrs[0] == 0.0 and lrs[1] == pytest.approx(0.5) and lrs[2:] == [1.0] * 8


def test_outputs_destinations_are_checked():
    assert problems(doc(outputs={"teacher": "ftp://host/x"})) == [
        "spec.outputs.teacher: 'ftp://host/x' is not s3://, gs://, file://, memory:// or hf:// followed by a path"
    ]
    assert problems(doc(outputs={"distillDataset": "hf://my-org/data"})) == [
        "spec.outputs.distillDataset: 'hf://my-org/data' must look like hf://datasets/<org>/<name>"
    ]
    assert problems(doc(outputs={"teacher": "hf://my-org/teacher"})) == [
        "spec.outputs: pushing to the Hugging Face Hub needs spec.hfTokenSecret"
    ]
    assert problems(doc(outputs={"student": "s3://bucket/student"})) == [
        "spec.outputs: outputs.student needs stages.student.enabled (a stage producing the student)"
    ]


def test_credentials_never_inline():
    (p,) = problems(doc(tracking={"mlflow": {"trackingUri": "https://user:pw@mlflow.example.org"}}))
    assert p.startswith("spec.tracking.mlflow.trackingUri: the URL carries a user or password;"), p
    assert "ConfigMap" in p and "use a Secret" in p, p
    (p,) = problems(doc(tracking={"wandb": {"project": "p", "apiKey": "abc"}}))
    assert p == "spec.tracking.wandb.apiKey: unknown field (did you mean apiKeySecret?)"


def test_lora_only_where_a_stage_trains():
    assert problems(doc(student={"model": "builtin:tiny-qwen2", "lora": {"r": 4}})) == [
        "spec.student.lora: an adapter is for trained models only (teacher, stages.student.model)"
    ]
    assert problems(doc(stages={"evaluate": {"model": {"model": "builtin:tiny-qwen2", "lora": {"r": 4}}}})) == [
        "spec.stages.evaluate.model.lora: an adapter is for trained models only (teacher, stages.student.model)"
    ]
    run = parse_run(doc(teacher={"model": "builtin:tiny-qwen2", "lora": {"r": 4, "targetModules": ["q_proj"]}}))
    from rlt.stages.start_models import peft_config

    cfg = peft_config(run.spec.teacher)
    assert (cfg.r, cfg.lora_alpha, set(cfg.target_modules)) == (4, 32, {"q_proj"})
    assert peft_config(run.spec.student) is None


def test_keep_columns_may_not_overwrite_distill_fields():
    assert problems(doc(dataset={"source": "x.jsonl", "keepColumns": ["id", "reward"]})) == [
        "spec.dataset.keepColumns: reward would overwrite the distillation row's own fields"
    ]


def test_pods_get_tracking_and_storage_credentials_only_from_secrets():
    from rlt_operator import builders as b

    run = parse_run(yaml.safe_load((EXAMPLES / "rltrun-lora-tracked.yaml").read_text()))
    ref = b.RunRef(name=run.name, namespace="research", uid="u1")
    want = {
        "WANDB_API_KEY": ("tracking", "wandb"),
        "MLFLOW_TRACKING_TOKEN": ("tracking", "mlflow"),
        "AWS_ACCESS_KEY_ID": ("s3-creds", "id"),
        "AWS_SECRET_ACCESS_KEY": ("s3-creds", "secret"),
        "HF_TOKEN": ("hf-token", "token"),
    }
    for stage in ("sft", "rl", "distill"):
        pod = b.trainer_job(ref, run.spec, stage, 0)["spec"]["template"]["spec"]
        env = {e["name"]: e for e in pod["containers"][0]["env"]}
        for name, (secret, key) in want.items():
            assert env[name] == {"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}
    generator = b.generator_statefulset(ref, run.spec, "rl", 0)["spec"]["template"]["spec"]
    gen_env = {e["name"] for e in generator["containers"][0]["env"]}
    assert not gen_env & {"WANDB_API_KEY", "MLFLOW_TRACKING_TOKEN", "AWS_ACCESS_KEY_ID"}  # least privilege
    config = b.configmap(ref, run.spec)["data"]["run.yaml"]
    assert "apiKeySecret" in config and "s3-creds" in config  # references only: the values never exist here
    assert "teacherUri" not in b.outputs(run.name, run.spec, ["sft"])  # listed once the producing stage is done
    done = b.outputs(run.name, run.spec, ["sft", "rl", "distill"])
    assert done["distilledDatasetUri"] == "s3://my-bucket/rlt/qwen7b-lora/distill/dataset.jsonl"
    assert done["teacherUri"] == "hf://my-org/qwen7b-rlt-teacher"
