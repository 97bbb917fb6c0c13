"""The offline door, round four (issue 44): each value checked by the rules of what consumes it. One test (or one
parametrized family) per class of the issue, written from the class: Kubernetes' pod validation of env and
scheduling fields, the sizes of the children the operator creates, image references, Hugging Face ids, tracking
settings, trainerArgs bounds, astronomical sizes. Every refusal names the spec field."""

from __future__ import annotations

import copy

import pytest
from suite_helpers import deep_merge, tiny_doc

from rlt.checks.validation import run_problems
from rlt.spec.loading import SpecError, parse_run


def _problems(patch: dict, meta: dict | None = None) -> list[str]:
    """Every problem of the tiny example with `patch` merged into its spec: the model's, then the checks'."""
    doc = tiny_doc()
    deep_merge(doc["spec"], copy.deepcopy(patch))
    if meta:
        doc["metadata"].update(meta)
    try:
        run = parse_run(doc, "run.yaml")
    except SpecError as err:
        return err.problems
    return run_problems(run)


def _refused(patch: dict, field: str, words: str = "", meta: dict | None = None) -> None:
    problems = _problems(patch, meta)
    hits = [p for p in problems if p.startswith(field + ":") or p.startswith(field + ".")]
    assert hits, f"{field} not refused: {problems}"
    assert words in " ".join(hits), hits


def _accepted(patch: dict, meta: dict | None = None) -> None:
    assert _problems(patch, meta) == []


def _env(**source) -> dict:
    return {"env": [{"name": "X", "valueFrom": source}]}


# ------------------------------------------------------------------------------- 1. Kubernetes' pod validation


@pytest.mark.parametrize(
    ("ref", "field"),
    [
        ({"fieldPath": "spec.containers"}, "fieldPath"),  # not a field the downward API serves to env
        ({"fieldPath": "metadata.labels"}, "fieldPath"),  # whole maps only for volumes
        ({"fieldPath": "status.phase['x']"}, "fieldPath"),  # a subscript on a field that takes none
        ({"fieldPath": "metadata.labels['bad key']"}, "fieldPath"),  # the key is no label key
        ({"fieldPath": "metadata.name", "apiVersion": "v2"}, "apiVersion"),
        # found by tests/real_cluster/test_server_pod_rules.py: a field label the server converts, yet not for env
        ({"fieldPath": "metadata.host"}, "fieldPath"),
    ],
)
def test_a_field_ref_the_pod_validator_refuses_is_refused(ref, field):
    _refused(_env(fieldRef=ref), f"spec.env.0.valueFrom.fieldRef.{field}")


@pytest.mark.parametrize(
    "ref",
    [
        {"fieldPath": "metadata.name"},
        {"fieldPath": "status.podIP", "apiVersion": "v1"},
        {"fieldPath": "metadata.annotations['Example.com/Key']"},
        {"fieldPath": "metadata.labels['app']"},
    ],
)
def test_field_refs_the_pod_validator_takes_are_taken(ref):
    _accepted(_env(fieldRef=ref))


@pytest.mark.parametrize(
    ("ref", "field"),
    [
        ({"resource": "limits.nvidia.com/gpu"}, "resource"),
        ({"resource": "requests.storage"}, "resource"),
        ({"resource": "limits.cpu", "divisor": "2"}, "divisor"),  # cpu: 1m or 1
        ({"resource": "requests.memory", "divisor": "1m"}, "divisor"),  # memory: 1, 1k.., 1Ki..
        ({"resource": "limits.memory", "divisor": "3Mi"}, "divisor"),
    ],
)
def test_a_resource_field_ref_the_pod_validator_refuses_is_refused(ref, field):
    _refused(_env(resourceFieldRef=ref), f"spec.env.0.valueFrom.resourceFieldRef.{field}")


@pytest.mark.parametrize(
    "ref",
    [
        {"resource": "limits.cpu", "divisor": "1m"},
        {"resource": "limits.cpu", "divisor": "1000m"},  # the same value as 1
        {"resource": "requests.memory", "divisor": "1Gi"},
        {"resource": "limits.hugepages-2Mi"},
    ],
)
def test_resource_field_refs_the_pod_validator_takes_are_taken(ref):
    _accepted(_env(resourceFieldRef=ref))


def _match_fields(req: dict) -> dict:
    term = {"matchFields": [req]}
    return {
        "scheduling": {
            "affinity": {
                "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}
            }
        }
    }


@pytest.mark.parametrize(
    "req",
    [
        {"key": "metadata.labels", "operator": "In", "values": ["n1"]},  # only metadata.name is a node field
        {"key": "metadata.name", "operator": "Exists"},
        {"key": "metadata.name", "operator": "In", "values": ["a", "b"]},
        {"key": "metadata.name", "operator": "In", "values": ["Not_A_Node"]},
    ],
)
def test_match_fields_take_metadata_name_in_one_node(req):
    _refused(_match_fields(req), "spec.scheduling.affinity.nodeAffinity")
    _accepted(_match_fields({"key": "metadata.name", "operator": "NotIn", "values": ["node-1"]}))


@pytest.mark.parametrize(
    ("meta", "field"),
    [
        ({"generateName": "Tiny_"}, "metadata.generateName"),
        ({"finalizers": ["example.com/ok", "not a name"]}, "metadata.finalizers.1"),
        ({"finalizers": ["orphan", "foregroundDeletion"]}, "metadata.finalizers"),
    ],
)
def test_generate_name_and_finalizers_follow_object_meta_rules(meta, field):
    _refused({}, field, meta=meta)


def test_a_generate_name_may_end_in_a_dash():
    _accepted({}, meta={"generateName": "tiny-", "finalizers": ["example.com/keep"]})


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        ({"kubernetes.io/foo": "1"}, "kubernetes.io"),  # a native name, no container resource
        ({"example.kubernetes.io/foo": "1"}, "kubernetes.io"),
        ({"requests.example.com/foo": "1"}, "requests."),
        ({"nvidia.com/gpu": "2"}, "gpus"),  # two values for one resource: gpus renders nvidia.com/gpu too
    ],
)
def test_extended_resources_as_the_pod_validator_reads_them(extra, words):
    _refused({"resources": {"trainer": {"extra": extra}}}, "spec.resources.trainer.extra", words)


def test_nvidia_gpu_in_extra_is_one_value_when_gpus_is_zero():
    _accepted({"resources": {"trainer": {"gpus": 0, "extra": {"nvidia.com/gpu": "1"}}}})


@pytest.mark.parametrize(
    ("trainer", "field"),
    [
        ({"memory": "5Ei", "sharedMemory": "5Ei"}, "memory"),  # each fits; the pod requests their sum
        ({"memory": "1Gi", "memoryLimit": "5Ei", "sharedMemory": "5Ei"}, "memoryLimit"),
        ({"gpus": 2**62}, "cpu"),  # the default CPU request is 4 per GPU
    ],
)
def test_summed_quantities_that_overflow_are_refused(trainer, field):
    _refused({"resources": {"trainer": trainer}}, f"spec.resources.trainer.{field}", "2^63-1")


# ------------------------------------------------------------------------------- 2. sizes of the children


def test_a_run_whose_yaml_overflows_one_env_var_names_the_field():
    # RLT_RUN_YAML carries the run into each trainer pod: one execve string, at most 128 KiB
    _refused({"format": {"teacherSystemPrompt": "x" * 140_000}}, "spec.format.teacherSystemPrompt", "RLT_RUN_YAML")


def test_a_run_whose_yaml_overflows_the_configmap_names_the_field():
    env = [{"name": f"V{i}", "value": "y" * 100_000} for i in range(12)]
    _refused({"env": env}, "spec.env", "ConfigMap")


def test_pod_annotations_over_256_kib_are_refused():
    notes = {f"example.com/n{i}": "z" * 60_000 for i in range(5)}
    _refused({"scheduling": {"podAnnotations": notes}}, "spec.scheduling.podAnnotations", "262144")


def test_one_env_value_over_what_execve_passes_is_refused():
    _refused({"env": [{"name": "BIG", "value": "v" * 131_072}]}, "spec.env.0.value", "MAX_ARG_STRLEN")


def test_a_run_just_under_the_sizes_is_taken():
    _accepted({"env": [{"name": "OK", "value": "v" * 100_000}]})


# ------------------------------------------------------------------------------- 3. image references

_HEX = "0123456789abcdef" * 8


@pytest.mark.parametrize(
    "image",
    [
        f"reg.io/trainer@sha256:{_HEX[:63]}",  # a sha256 digest is 64 hex digits
        f"reg.io/trainer@sha256:{_HEX[:64].upper()}",  # lower-case hex only
        f"reg.io/trainer@md5:{_HEX[:32]}",  # an algorithm go-digest does not know
        f"reg.io/trainer@sha512:{_HEX[:64]}",  # sha512 is 128
        "reg.io/" + "a" * 250 + ":v1",  # a name over 255 characters
        _HEX[:64],  # an image ID, not a name
    ],
)
def test_image_references_follow_the_reference_grammar(image):
    _refused({"images": {"trainer": image}}, "spec.images.trainer")


@pytest.mark.parametrize(
    "image",
    [f"reg.io/trainer:v1@sha256:{_HEX[:64]}", f"reg.io:5000/a/b@sha512:{_HEX}", "localhost:5000/" + "a" * 240],
)
def test_image_references_the_grammar_takes_are_taken(image):
    _accepted({"images": {"trainer": image}})


# ------------------------------------------------------------------------------- 4. Hugging Face ids


@pytest.mark.parametrize(
    "model",
    ["org/name@main", "org/na--me", "org/na..me", "org/name/extra", "org/" + "n" * 100, "org/name.git"],
)
def test_hub_model_ids_follow_the_hub_library(model):
    pytest.importorskip("huggingface_hub")
    _refused({"teacher": {"model": model}}, "spec.teacher.model")


@pytest.mark.parametrize(
    ("field", "uri"),
    [("teacher", "hf://org/na--me"), ("student", "hf://org/x@v1"), ("distillDataset", "hf://datasets/org/a..b")],
)
def test_hf_outputs_follow_the_hub_library(field, uri):
    pytest.importorskip("huggingface_hub")
    patch = {"outputs": {field: uri}, "hfTokenSecret": {"name": "hf"}, "stages": {"student": {"enabled": True}}}
    _refused(patch, f"spec.outputs.{field}")


@pytest.mark.parametrize("source", ["org/data@v2", "a/b/c", "org/x--y"])
def test_hub_dataset_ids_follow_the_hub_library(source):
    pytest.importorskip("huggingface_hub")
    _refused({"dataset": {"source": source}}, "spec.dataset.source")


def test_hub_ids_and_local_paths_the_loader_takes_are_taken():
    _accepted({"teacher": {"model": "Qwen/Qwen2.5-7B-Instruct"}, "student": {"model": "/models/student"}})


# ------------------------------------------------------------------------------- 5. tracking


@pytest.mark.parametrize(
    ("uri", "words"),
    [
        ("https://mlflow.example.com/?token=abc", "Secret"),
        ("https://u:p@mlflow.example.com", "Secret"),
        ("HTTPS://u@mlflow.example.com", "Secret"),
        ("ftp://mlflow.example.com", "scheme"),
        ("postgresql://db/mlflow", "scheme"),
    ],
)
def test_mlflow_tracking_uris_mlflow_serves_and_without_credentials(uri, words):
    _refused({"tracking": {"mlflow": {"trackingUri": uri}}}, "spec.tracking.mlflow.trackingUri", words)


@pytest.mark.parametrize("project", ["team/proj", "a#b", "50%", "p" * 129, "x:y"])
def test_wandb_project_names_follow_wandb(project):
    _refused({"tracking": {"wandb": {"project": project, "mode": "offline"}}}, "spec.tracking.wandb.project")


def test_wandb_project_rule_is_wandbs_own():
    wandb_settings = pytest.importorskip("wandb.sdk.wandb_settings")
    from rlt.spec.tracking_outputs import WandbSpec

    for project in ("ok-name", "team/proj", "a#b", "50%", "p" * 128, "p" * 129, "x:y", "back\\slash", "q?"):
        try:
            wandb_settings.Settings(project=project)
            theirs = True
        except Exception:
            theirs = False
        try:
            WandbSpec(project=project, mode="offline")
            ours = True
        except ValueError:
            ours = False
        assert ours == theirs, project


def test_wandb_online_needs_a_key_from_a_secret():
    _refused({"tracking": {"wandb": {"project": "p"}}}, "spec.tracking.wandb.apiKeySecret", "Secret")
    _refused({"tracking": {"wandb": {"project": "p"}}, "env": [{"name": "WANDB_API_KEY", "value": "k"}]}, "spec.env.0")
    _accepted({"tracking": {"wandb": {"project": "p", "apiKeySecret": {"name": "wandb"}}}})
    key = {"name": "WANDB_API_KEY", "valueFrom": {"secretKeyRef": {"name": "wandb", "key": "k"}}}
    _accepted({"tracking": {"wandb": {"project": "p"}}, "env": [key]})


# ------------------------------------------------------------------------------- 6. trainerArgs bounds


@pytest.mark.parametrize(
    ("stage", "key", "value"),
    [
        ("sft", "eval_steps", 0),
        ("sft", "label_smoothing_factor", 1.5),
        ("sft", "dataloader_num_workers", 100_000),
        ("sft", "data_seed", 2**40),
        ("rl", "epsilon", 0.0),
        ("rl", "delta", -1.0),
        ("sft", "neftune_noise_alpha", -0.5),
    ],
)
def test_trainer_args_beyond_the_configs_checks_are_bounded(stage, key, value):
    _refused({"stages": {stage: {"trainerArgs": {key: value}}}}, f"spec.stages.{stage}.trainerArgs.{key}", "range")


def test_every_stated_bound_is_an_option_rlt_passes_through():
    from rlt.spec.stages import RL_OWNED_ARGS, SFT_OWNED_ARGS
    from rlt.spec.trainer_args import STATED, trl_options

    table = trl_options()
    for key in STATED:
        assert (
            key in table["SFTConfig"]
            and key not in SFT_OWNED_ARGS
            or key in table["GRPOConfig"]
            and (key not in RL_OWNED_ARGS)
        ), key


# ------------------------------------------------------------------------------- 7. astronomical sizes


def test_huge_epochs_are_refused_before_a_step_count_overflows():
    _refused({"stages": {"sft": {"epochs": 1e300, "maxSteps": None}}}, "spec.stages.sft.epochs")


def test_a_builtin_task_of_astronomical_size_is_refused_before_generating():
    _refused({"dataset": {"size": 10**15}}, "spec.dataset.size")
