"""The RLTRun spec model and `rlt validate`: every example validates, broken files name the field."""

import subprocess
import sys

import pytest
import yaml
from suite_helpers import EXAMPLES as EXAMPLE_DIR
from suite_helpers import ROOT, TINY, tiny_doc

from rlt.checks.validation import load_valid_run, load_valid_runs
from rlt.spec.loading import SpecError, dump_run, parse_spec
from rlt.spec.run import RLTRun

EXAMPLES = sorted(EXAMPLE_DIR.glob("*.yaml"))


def test_examples_exist_and_validate():
    assert len(EXAMPLES) >= 3
    for path in EXAMPLES:
        for run in load_valid_runs(path):
            assert run.spec.stages.enabled()


def test_paper_defaults():
    spec = parse_spec(
        {"teacher": {"model": "t"}, "student": {"model": "s"}, "dataset": {"source": "builtin:arithmetic"}}
    )
    rl = spec.stages.rl
    assert (rl.num_generations, rl.batch_size, rl.steps, rl.learning_rate, rl.beta, rl.temperature) == (
        64,
        1024,
        125,
        1e-6,
        0.04,
        0.7,
    )
    assert (rl.reward.alpha, rl.reward.kl_weight, rl.reward.format_penalty) == (0.01, 3.0, 1.0)


def test_round_trip_is_camel_case_and_lossless():
    run = load_valid_run(ROOT / "manifests/examples/rltrun-paper-7b.yaml")
    text = dump_run(run)
    assert "numGenerations" in text and "lambda: 3" in text and "num_generations" not in text
    assert RLTRun.model_validate(yaml.safe_load(text)) == run


@pytest.mark.parametrize(
    "mutate,field,message",
    [
        (
            lambda d: d["spec"]["stages"]["rl"].update(numGenerations=0),
            "spec.stages.rl.numGenerations",
            "greater than 1",
        ),
        (
            lambda d: d["spec"]["stages"]["rl"].update(batchSize=10),
            "spec.stages.rl.batchSize",
            "divisible by numGenerations",
        ),
        (lambda d: d["spec"]["stages"]["rl"].update(steps="many"), "spec.stages.rl.steps", "valid integer"),
        (
            lambda d: d["spec"]["stages"]["sft"].update(learningRate=-1),
            "spec.stages.sft.learningRate",
            "greater than 0",
        ),
        (lambda d: d["spec"].update(bogus=1), "spec.bogus", "unknown field"),
        (lambda d: d["spec"].pop("teacher"), "spec.teacher", "Field required"),
        (lambda d: d["spec"]["student"].update(model=""), "spec.student.model", "at least 1 character"),
        (lambda d: d["spec"].update(method="ppo"), "spec.method", "unknown teaching method 'ppo' (methods: rlt, rcl)"),
        (
            lambda d: (
                d["spec"]["format"].update(preset="nope")
                if "format" in d["spec"]
                else d["spec"].update(format={"preset": "nope"})
            ),
            "spec.format",
            "unknown format 'nope'",
        ),
        (lambda d: d["metadata"].update(name="Bad_Name"), "metadata.name", "DNS-1035"),
        (lambda d: d.update(kind="Job"), "kind", "'RLTRun'"),
        (lambda d: d["spec"]["dataset"].update(limit=-3), "spec.dataset.limit", "greater than 0"),
        (
            lambda d: [d["spec"]["stages"][s].update(enabled=False) for s in ("sft", "rl", "distill")],
            "spec.stages",
            "at least one",
        ),
    ],
)
def test_invalid_specs_name_the_field(tmp_path, mutate, field, message):
    doc = tiny_doc()
    mutate(doc)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(SpecError) as err:
        load_valid_run(path)
    assert any(p.startswith(field) and message in p for p in err.value.problems), err.value.problems


def test_validate_cli_reports_every_bad_file_and_exits_nonzero(tmp_path):
    bad = tiny_doc()
    bad["spec"]["stages"]["rl"]["numGenerations"] = -1
    bad["spec"]["extra"] = True
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(bad))
    (tmp_path / "broken.yaml").write_text("apiVersion: [unclosed")
    cmd = [
        sys.executable,
        "-m",
        "rlt.cli",
        "validate",
        str(TINY),
        str(tmp_path / "bad.yaml"),
        str(tmp_path / "broken.yaml"),
        str(tmp_path / "missing.yaml"),
    ]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 1
    assert "rltrun-tiny.yaml: ok (tiny)" in res.stdout
    assert "spec.stages.rl.numGenerations: Input should be greater than 1" in res.stderr
    assert "spec.extra: unknown field" in res.stderr
    assert "broken.yaml: INVALID" in res.stderr and "<yaml>" in res.stderr
    assert "missing.yaml: INVALID" in res.stderr and "file not found" in res.stderr

    ok = subprocess.run(
        [sys.executable, "-m", "rlt.cli", "validate", *map(str, EXAMPLES)], capture_output=True, text=True
    )
    assert ok.returncode == 0, ok.stderr


def test_multi_document_file_names_the_document(tmp_path):
    good, bad = tiny_doc(), tiny_doc()
    bad["spec"]["seed"] = -1
    (tmp_path / "two.yaml").write_text(yaml.safe_dump_all([good, bad]))
    with pytest.raises(SpecError) as err:
        load_valid_runs(tmp_path / "two.yaml")
    assert err.value.problems == ["document 1: spec.seed: Input should be greater than or equal to 0"]


def test_validate_checks_the_named_format_fits_the_method(tmp_path):
    doc = tiny_doc()
    doc["spec"]["format"] = {"preset": "rcl-default"}  # exists, but is an rcl format
    (tmp_path / "f.yaml").write_text(yaml.safe_dump(doc))
    res = subprocess.run(
        [sys.executable, "-m", "rlt.cli", "validate", str(tmp_path / "f.yaml")], capture_output=True, text=True
    )
    assert res.returncode == 1
    assert "spec.format.preset:" in res.stderr and "is not an rlt prompt format" in res.stderr


# (field patch, the path the one line names or None when accepted): the Kubernetes types of rlt.spec.k8s
K8S_VALUES = [
    ({"storage": {"size": "1.5Ti"}}, None),
    ({"storage": {"size": "1e12"}}, None),
    ({"storage": {"size": "+100G"}}, None),
    ({"storage": {"size": "1.5.Gi"}}, "spec.storage.size"),
    ({"storage": {"size": "Gi"}}, "spec.storage.size"),
    ({"storage": {"size": ""}}, "spec.storage.size"),
    ({"storage": {"size": "1e"}}, "spec.storage.size"),
    ({"storage": {"size": "100 Mi"}}, "spec.storage.size"),
    ({"storage": {"size": "1tb"}}, "spec.storage.size"),
    ({"storage": {"existingClaim": "-claim"}}, "spec.storage.existingClaim"),
    ({"storage": {"existingClaim": "team.claim-1"}}, None),
    ({"resources": {"trainer": {"cpu": "500m", "gpus": 0}}}, None),
    ({"resources": {"trainer": {"sharedMemory": "16 Gi"}}}, "spec.resources.trainer.sharedMemory"),
    ({"resources": {"trainer": {"extra": {"nvidia.com/gpu": "1.5"}}}}, "spec.resources.trainer.extra.nvidia.com/gpu"),
    ({"resources": {"trainer": {"extra": {"example.com/": "1"}}}}, "spec.resources.trainer.extra"),
    ({"resources": {"generator": {"extra": {"rdma/hca_shared_a": "2"}}}}, None),
    ({"resources": {"trainer": {"extra": {"rdma/hca": 1}}}}, "spec.resources.trainer.extra.rdma/hca"),  # quote it
    ({"scheduling": {"nodeSelector": {"kubernetes.io/": "x"}}}, "spec.scheduling.nodeSelector"),
    ({"scheduling": {"nodeSelector": {"node.kubernetes.io/instance-type": "p5.48xlarge"}}}, None),
    ({"scheduling": {"nodeSelector": {"pool": "-gpu"}}}, "spec.scheduling.nodeSelector.pool"),
    ({"scheduling": {"podAnnotations": {"a" * 64: "x"}}}, "spec.scheduling.podAnnotations"),
    ({"scheduling": {"podAnnotations": {"k8s.v1.cni.cncf.io/networks": "rdma-net"}}}, None),
    ({"scheduling": {"imagePullSecrets": ["Registry"]}}, "spec.scheduling.imagePullSecrets.0"),
    ({"scheduling": {"priorityClassName": "high priority"}}, "spec.scheduling.priorityClassName"),
    ({"scheduling": {"serviceAccountName": "trainer.sa"}}, None),
    ({"hfTokenSecret": {"name": "hf", "key": "a b"}}, "spec.hfTokenSecret.key"),
    ({"env": [{"name": "1VAR", "value": "x"}]}, "spec.env.0.name"),
    ({"env": [{"name": "NCCL_DEBUG", "value": "INFO"}]}, None),
]


@pytest.mark.parametrize("patch, field", K8S_VALUES, ids=[repr(p) for p, _ in K8S_VALUES])
def test_every_kubernetes_value_is_checked_by_its_type(patch, field):
    from rlt.spec.loading import parse_spec

    spec = tiny_doc()["spec"]
    for k, v in patch.items():
        spec[k] = {**spec.get(k, {}), **v} if isinstance(v, dict) else v
    if "trainer" in patch.get("resources", {}):  # the example's one trainer process, which its batches fit
        spec["resources"]["trainer"].setdefault("gpus", 1)
    if field is None:
        parse_spec(spec)
        return
    with pytest.raises(SpecError) as err:
        parse_spec(spec)
    (line,) = err.value.problems
    assert line.startswith(f"{field}: ") and "\n" not in line, line
