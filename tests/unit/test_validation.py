"""One validation entry point (rlt.checks.validation): `rlt validate`, the pods' `rlt stage` and the operator agree."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from suite_helpers import deep_merge, tiny_doc

from rlt.checks.validation import validate_spec
from rlt.spec.loading import SpecError
from rlt_operator.status.observed import Observed

# (what is wrong, spec patch, the field the message names)
BAD = [
    ("rcl format for method rlt", {"format": {"preset": "rcl-default"}}, "spec.format.preset"),
    (
        "ReadWriteOnce volume for trainer pods on several nodes",
        {
            "resources": {"trainer": {"nodes": 2}},
            "storage": {"accessMode": "ReadWriteOnce"},
            # batches that the 2 trainer processes divide, so only the volume is wrong
            "stages": {"sft": {"perDeviceBatchSize": 2}, "rl": {"perDeviceBatchSize": 2}},
        },
        "spec.storage.accessMode",
    ),
    (
        "evaluate in server mode with no server",
        {"stages": {"evaluate": {"enabled": True, "generation": {"mode": "server"}}}},
        "spec.stages.evaluate.generation.serverUrl",
    ),
    # issue 23: values a real API server or trainer would reject, refused at the door
    ("storage size with a space", {"storage": {"size": "1 TB"}}, "spec.storage.size: '1 TB' is not a Kubernetes"),
    (
        "extended resource that is no quantity",
        {"resources": {"trainer": {"extra": {"rdma/hca": "lots"}}}},
        "spec.resources.trainer.extra.rdma/hca: 'lots' is not a Kubernetes quantity",
    ),
    (
        "memory limit under the request",
        {"resources": {"trainer": {"memory": "64Gi", "memoryLimit": "32Gi"}}},
        "spec.resources.trainer.memoryLimit: 32Gi is below the request 64Gi",
    ),
    (
        "pod annotation key that is no key",
        {"scheduling": {"podAnnotations": {"not a key!": "x"}}},
        "spec.scheduling.podAnnotations: key 'not a key!' is not a label or annotation key",
    ),
    (
        "queue name that is no object name",
        {"scheduling": {"queueName": "bad queue!"}},
        "spec.scheduling.queueName: 'bad queue!' is not a Kueue LocalQueue name",
    ),
    (
        "trainerArgs value of the wrong type",
        {"stages": {"sft": {"trainerArgs": {"adam_epsilon": "very"}}}},
        'spec.stages.sft.trainerArgs.adam_epsilon: "very" is a str, not float',
    ),
    (
        "trainerArgs key rlt sets",
        {"stages": {"sft": {"trainerArgs": {"adam_beta2": 0.9}}}},
        "spec.stages.sft.trainerArgs.adam_beta2: set by rlt",
    ),
    (
        "colocate without trainer GPUs",
        {"resources": {"trainer": {"gpus": 0}}, "stages": {"rl": {"generation": {"mode": "colocate"}}}},
        "spec.resources.trainer.gpus: 0 with stages.rl.generation.mode colocate",
    ),
    (
        "env var name the kubelet refuses",
        {"env": [{"name": "MY-VAR", "value": "1"}]},
        "spec.env.0.name: 'MY-VAR' is not an environment variable name",
    ),
]


def _bad_file(tmp_path: Path, patch: dict) -> tuple[Path, dict]:
    doc = tiny_doc()
    deep_merge(doc["spec"], patch)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path, doc


@pytest.mark.parametrize("what, patch, field", BAD, ids=[b[0] for b in BAD])
def test_cli_pods_and_operator_refuse_the_same_spec_with_the_same_message(tmp_path, what, patch, field):
    from rlt_operator import builders as b
    from rlt_operator.status import decide as S

    path, doc = _bad_file(tmp_path, patch)
    with pytest.raises(SpecError) as err:
        validate_spec(doc["spec"], name=doc["metadata"]["name"])
    problem = next(p for p in err.value.problems if p.startswith(field))

    cli = subprocess.run([sys.executable, "-m", "rlt.cli", "validate", str(path)], capture_output=True, text=True)
    assert cli.returncode == 1 and problem in cli.stderr

    pod = subprocess.run(
        [sys.executable, "-m", "rlt.cli", "stage", "sft", "--config", str(path), "--root", str(tmp_path / "data")],
        capture_output=True,
        text=True,
    )
    assert pod.returncode != 0 and problem in pod.stderr and not (tmp_path / "data").exists()

    ref = b.RunRef(name=doc["metadata"]["name"], namespace="ns", uid="u")
    d = S.decide(ref, 1, doc["spec"], None, Observed(), dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc))
    assert d.actions == [] and problem in d.status["message"]
    cond = {c["type"]: c for c in d.status["conditions"]}["SpecValid"]
    assert cond["status"] == "False" and problem in cond["message"]


def test_a_run_name_its_children_cannot_carry_is_refused_by_all_three(tmp_path):
    from rlt_operator import builders as b
    from rlt_operator.status import decide as S

    doc = tiny_doc()
    doc["metadata"]["name"] = "r" * 41
    path = tmp_path / "long.yaml"
    path.write_text(yaml.safe_dump(doc))
    cli = subprocess.run([sys.executable, "-m", "rlt.cli", "validate", str(path)], capture_output=True, text=True)
    assert cli.returncode == 1 and "metadata.name: 'rrrrrrrr" in cli.stderr and "over 40" in cli.stderr
    ref = b.RunRef(name=doc["metadata"]["name"], namespace="ns", uid="u")
    d = S.decide(ref, 1, doc["spec"], None, Observed(), dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc))
    assert d.actions == [] and d.status["message"].startswith("metadata.name: ") and "over 40" in d.status["message"]


def test_several_trainer_nodes_are_fine_with_a_shared_volume_or_single_pod_stages():
    doc = tiny_doc()
    two_processes = {"sft": {"perDeviceBatchSize": 2}, "rl": {"perDeviceBatchSize": 2}}  # batches they divide
    validate_spec(
        deep_merge(
            doc["spec"],
            {
                "resources": {"trainer": {"nodes": 2}},
                "storage": {"accessMode": "ReadWriteMany"},
                "stages": two_processes,
            },
        )
    )
    only_distill = deep_merge(
        tiny_doc()["spec"],
        {"resources": {"trainer": {"nodes": 2}}, "stages": {"sft": {"enabled": False}, "rl": {"enabled": False}}},
    )
    validate_spec(only_distill)  # distill runs on one pod whatever nodes says


def test_evaluate_server_mode_with_a_server_url_is_accepted():
    doc = tiny_doc()
    validate_spec(
        deep_merge(
            doc["spec"],
            {
                "stages": {
                    "evaluate": {
                        "enabled": True,
                        "generation": {"mode": "server", "serverUrl": "http://vllm.team.svc:8000"},
                    }
                }
            },
        )
    )
