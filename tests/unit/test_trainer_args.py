"""trainerArgs: the keys rlt sets itself are exactly what the config builders set; every other key is typed against
TRL's own config dataclass (the option table generated from the installed TRL); every problem is reported at once
with its full spec path, by `rlt validate`, the operator and the pods alike (rlt.checks.validation)."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys

import pytest
import yaml
from suite_helpers import tiny_doc

from rlt.checks.validation import spec_problems
from rlt.contract.layout import RunLayout
from rlt.spec.loading import parse_run
from rlt.spec.stages import RL_OWNED_ARGS, SFT_OWNED_ARGS, TEACHER_SFT_OWNED_ARGS

# Owned keys no builder sets, each because it would set the same thing another way.
ALIASES = {
    "warmup_ratio": "warmupRatio is passed as warmup_steps (below 1: a share of the steps)",
    "logging_dir": "TensorBoard's folder is set on its callback (tracking.point_tensorboard)",
    "accelerator_config": "set only on CPU with several processes (trainer_precision), not reachable in one process",
    "use_cpu": "set only on CPU in one process; the GPU variants below leave it out",
    "activation_checkpointing": "gradient_checkpointing's new name: the builders set the old one, its alias",
    "activation_checkpointing_kwargs": "left at transformers' default; uncheckpointedLayers chooses the layers",
    "gradient_checkpointing_kwargs": "left at transformers' default; uncheckpointedLayers chooses the layers",
}


def _run(**spec):
    d = tiny_doc()
    for path, value in spec.items():
        node = d["spec"]
        keys = path.split("__")
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        node[keys[-1]] = value
    return parse_run(d)


def _builder_keys(tmp_path, stage: str) -> set[str]:
    """Every key the stage's config builder sets, over the spec variants that change which keys it sets."""
    from rlt.stages.context import StageContext
    from rlt.stages.rl import grpo_options
    from rlt.stages.sft import sft_options

    variants = [
        ({}, "cpu"),
        ({"tracking": {"tensorboard": True, "mlflow": {}}}, "cpu"),
        (
            {
                "stages__rl__generation": {
                    "mode": "server",
                    "serverUrl": "http://g:8000",
                    "importanceSampling": "tokenMask",
                }
            },
            "cpu",
        ),
        ({"stages__rl__generation": {"mode": "colocate", "maxModelLen": 4096}}, "cuda"),
        ({"stages__student__enabled": True}, "cuda"),
    ]
    keys: set[str] = set()
    for i, (patch, device) in enumerate(variants):
        run = _run(**patch)
        ctx = StageContext(run, RunLayout.for_run(tmp_path / str(i), run.name), show_progress=False)
        keys |= set(grpo_options(ctx, device) if stage == "rl" else sft_options(ctx, device, stage))
    return keys


@pytest.mark.parametrize(
    "stage, owned", [("rl", RL_OWNED_ARGS), ("sft", TEACHER_SFT_OWNED_ARGS), ("student", SFT_OWNED_ARGS)]
)
def test_owned_keys_are_exactly_what_the_config_builders_set(tmp_path, stage, owned):
    """The defect of issue 26: loss_type, top_k, num_iterations, scale_rewards (rl) and adam_beta2 (sft) were set by
    the builders but missing from the owned keys, so trainerArgs could repeat them and the trainer died with
    'got multiple values for keyword argument'."""
    keys = _builder_keys(tmp_path, stage)
    assert keys - set(owned) == set(), "set by the builder but passable through trainerArgs"
    assert set(owned) - keys - set(ALIASES) == set(), "owned but never set: pass it through or say why in ALIASES"


def test_the_option_table_is_generated_from_the_installed_trl():
    from rlt.spec.trainer_args import OPTIONS_FILE
    from rlt.stages.trainer_check import render

    assert OPTIONS_FILE.read_text() == render(), "run `make generate` (python hack/generate.py trl-options)"


# (stage, key, value, what the message says; None: accepted)
VALUES = [
    ("rl", "adam_epsilon", "very", '"very" is a str, not float (GRPOConfig.adam_epsilon)'),
    ("rl", "adam_epsilon", "1e-8", "a number in quotes is text: write it without the quotes"),
    ("rl", "adam_epsilon", 1e-8, None),
    ("rl", "adam_epsilon", None, "null is not float (GRPOConfig.adam_epsilon)"),
    ("rl", "optim_target_modules", "q_proj", None),  # str or list[str]
    ("rl", "adam_beta1", 0, None),  # an int is a float
    ("rl", "dataloader_num_workers", 2.5, "is a float, not int"),
    ("rl", "dataloader_num_workers", True, "is a bool, not int"),
    ("rl", "dataloader_drop_last", "yes", "is a str, not bool"),
    ("rl", "optim", "adamw_torch_fused", None),
    ("rl", "optim", "sgd_please", "is a str, not 'adamw_torch'"),
    ("rl", "optim_target_modules", ["q_proj"], None),
    ("rl", "lr_scheduler_kwargs", {"min_lr": 0.0}, None),
    ("rl", "lr_scheduler_kwargs", 3, "is a int, not dict or str or null"),
    ("rl", "parallelism_config", {"dp": 2}, "is a dict, not null"),
    ("rl", "learning_rat", 0.1, "not a GRPOConfig option (did you mean learning_rate?)"),
    ("rl", "loss_type", "dapo", "set by rlt; set spec.stages.rl.lossType"),
    ("rl", "top_k", 5, "set by rlt; fixed off"),
    ("rl", "num_iterations", 2, "set by rlt; fixed at 1"),
    ("rl", "scale_rewards", "none", "set by rlt; fixed at 'group'"),
    ("rl", "temperature", 1.0, "set by rlt; set spec.stages.rl.temperature"),
    ("sft", "adam_beta2", 0.9, "set by rlt; fixed at the RLT reference code's 0.95"),
    ("sft", "num_generations", 4, "not a SFTConfig option"),
    ("student", "adam_beta2", 0.98, None),
]


@pytest.mark.parametrize("stage, key, value, says", VALUES, ids=[f"{v[0]}-{v[1]}-{v[2]!r}" for v in VALUES])
def test_each_trainer_arg_is_owned_known_and_typed(stage, key, value, says):
    run = _run(**{f"stages__{stage}__trainerArgs": {key: value}, "stages__student__enabled": True})
    problems = spec_problems(run.spec, run.name)
    if says is None:
        assert problems == []
    else:
        (p,) = problems
        assert p.startswith(f"spec.stages.{stage}.trainerArgs.{key}: ") and says in p, p


def test_every_problem_at_once_through_the_cli_the_pods_and_the_operator(tmp_path):
    from rlt_operator import builders as b
    from rlt_operator.status import decide as S
    from rlt_operator.status.observed import Observed

    d = tiny_doc()
    d["spec"]["stages"]["sft"]["trainerArgs"] = {"adam_beta2": 0.9, "adam_epsilom": 1e-7}
    d["spec"]["stages"]["rl"]["trainerArgs"] = {"loss_type": "dapo", "top_k": 5, "adam_epsilon": "very"}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(d))
    want = [
        "spec.stages.sft.trainerArgs.adam_beta2: set by rlt",
        "spec.stages.sft.trainerArgs.adam_epsilom: not a SFTConfig option (did you mean adam_epsilon?)",
        "spec.stages.rl.trainerArgs.loss_type: set by rlt; set spec.stages.rl.lossType",
        "spec.stages.rl.trainerArgs.top_k: set by rlt",
        'spec.stages.rl.trainerArgs.adam_epsilon: "very" is a str, not float',
    ]
    cli = subprocess.run([sys.executable, "-m", "rlt.cli", "validate", str(path)], capture_output=True, text=True)
    assert cli.returncode == 1 and "Traceback" not in cli.stderr
    for w in want:
        assert w in cli.stderr, cli.stderr
    pod = subprocess.run([sys.executable, "-m", "rlt.checks.validation", str(path)], capture_output=True, text=True)
    assert pod.returncode == 78 and all(w in pod.stderr for w in want), pod.stderr
    ref = b.RunRef(name=d["metadata"]["name"], namespace="ns", uid="u")
    op = S.decide(ref, 1, d["spec"], None, Observed(), dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc))
    assert op.actions == [] and all(w in op.status["message"] for w in want)


def test_loss_type_is_a_spec_field_and_adam_beta2_passes_through_for_the_student(tmp_path):
    from rlt.stages.context import StageContext
    from rlt.stages.rl import grpo_config
    from rlt.stages.sft import sft_config

    run = _run(
        stages__rl__lossType="dr_grpo",
        stages__student__enabled=True,
        stages__student__trainerArgs={"adam_beta2": 0.98},
    )
    ctx = StageContext(run, RunLayout.for_run(tmp_path, run.name), show_progress=False)
    assert grpo_config(ctx, "cpu").loss_type == "dr_grpo"
    assert sft_config(ctx, "cpu", "student").adam_beta2 == 0.98
    assert sft_config(ctx, "cpu", "sft").adam_beta2 == 0.95
