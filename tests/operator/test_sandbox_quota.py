"""The emulated API's ResourceQuota admission (rlt_sandbox.quota) and kubectl's pod STATUS words, as tables."""

from __future__ import annotations

import pytest

from rlt_sandbox.kmock_tables import pod_status_text
from rlt_sandbox.kubelet_model import image_problem
from rlt_sandbox.quota import refusal


def pod(name: str = "p", requests=None, limits=None, init=None, phase: str = "Pending") -> dict:
    res = {k: v for k, v in (("requests", requests), ("limits", limits)) if v}
    spec: dict = {"containers": [{"name": "main", "resources": res}]}
    if init:
        spec["initContainers"] = [{"name": "init", "resources": {"requests": init}}]
    return {"metadata": {"name": name}, "spec": spec, "status": {"phase": phase}}


def quota(name: str, **hard: str) -> dict:
    return {"metadata": {"name": name}, "spec": {"hard": {k.replace("_", "."): v for k, v in hard.items()}}}


def test_a_pod_over_a_quota_is_refused_with_the_api_servers_words():
    quotas = [quota("compute", requests_cpu="3", requests_memory="40Gi")]
    others = [pod("a", {"cpu": "2", "memory": "8Gi"}), pod("done", {"cpu": "8"}, phase="Succeeded")]
    assert refusal(pod("b", {"cpu": "1", "memory": "33Gi"}), quotas, others) == (
        'pods "b" is forbidden: exceeded quota: compute, requested: requests.memory=33Gi, used: '
        "requests.memory=8Gi, limited: requests.memory=40Gi"
    )
    assert refusal(pod("b", {"cpu": "1", "memory": "1Gi"}), quotas, others) is None  # finished pods free theirs
    # an init container's request counts when it is larger than the containers' sum
    assert "requested: requests.cpu=2500m" in refusal(
        pod("b", {"cpu": "1", "memory": "1Gi"}, init={"cpu": "2.5"}), quotas, others
    )


def test_gpus_pods_and_unstated_requests():
    gpus = [quota("gpus", **{"requests.nvidia.com/gpu": "0"})]
    assert "requested: requests.nvidia.com/gpu=1" in refusal(pod(requests={"nvidia.com/gpu": "1"}), gpus, [])
    assert refusal(pod(requests={"cpu": "1"}), gpus, []) is None  # a pod with no GPU need not state one
    assert "exceeded quota: one, requested: pods=1, used: pods=1, limited: pods=1" in refusal(
        pod(), [quota("one", pods="1")], [pod("a")]
    )
    assert refusal(pod(requests={"cpu": "1"}), [quota("lim", limits_memory="1Gi")], []) == (
        'pods "p" is forbidden: failed quota: lim: must specify limits.memory for: main'
    )


@pytest.mark.parametrize(
    "image",
    ["nginx", "python:3.11-slim", "ghcr.io/rlt-dev/rlt-trainer:0.1.0", "localhost:5000/a/b_c@sha256:" + "0" * 64],
)
def test_images_that_parse_are_pulled_unless_named_missing(image):
    assert image_problem(image, []) is None
    assert image_problem(image, ["*"]) == ("ErrImagePull", "*")


@pytest.mark.parametrize("image", ["", "ghcr.io/Rlt/x", "a b", "x:", ":tag", "x:-bad"])
def test_references_that_do_not_parse_are_invalid_image_names(image):
    reason, message = image_problem(image, [])
    assert reason == "InvalidImageName" and "invalid reference format" in message


def _status(init=(), main=None, phase="Pending") -> dict:
    return {"status": {"phase": phase, "initContainerStatuses": list(init), "containerStatuses": [main or {}]}}


@pytest.mark.parametrize(
    ("pod_", "text"),
    [
        (_status([{"state": {"running": {}}}], {"state": {"waiting": {"reason": "PodInitializing"}}}), "Init:0/1"),
        (_status([{"state": {"terminated": {"exitCode": 78, "reason": "Error"}}}], phase="Failed"), "Init:Error"),
        (_status([{"state": {"waiting": {"reason": "ImagePullBackOff"}}}]), "Init:ImagePullBackOff"),
        (_status([{"state": {"terminated": {"exitCode": 0}}}], {"state": {"running": {}}}, "Running"), "Running"),
        (_status(main={"state": {"waiting": {"reason": "ErrImagePull"}}}), "ErrImagePull"),
        (_status(main={"state": {"terminated": {"exitCode": 1, "reason": "Error"}}}, phase="Failed"), "Error"),
        ({"metadata": {"deletionTimestamp": "x"}, **_status()}, "Terminating"),
    ],
)
def test_pod_status_words_as_kubectl_prints_them(pod_, text):
    assert pod_status_text(pod_) == text


def test_object_counts_and_a_claims_storage():
    from rlt_sandbox.quota import object_refusal

    claim = {"metadata": {"name": "tiny-data"}, "spec": {"resources": {"requests": {"storage": "20Gi"}}}}
    assert object_refusal(
        "persistentvolumeclaims", "", claim, [quota("no-claims", persistentvolumeclaims="0")], []
    ) == (
        'persistentvolumeclaims "tiny-data" is forbidden: exceeded quota: no-claims, requested: '
        "persistentvolumeclaims=1, used: persistentvolumeclaims=0, limited: persistentvolumeclaims=0"
    )
    assert "requested: requests.storage=20Gi, used: requests.storage=5Gi" in object_refusal(
        "persistentvolumeclaims",
        "",
        claim,
        [quota("disk", requests_storage="24Gi")],
        [{"metadata": {"name": "old"}, "spec": {"resources": {"requests": {"storage": "5Gi"}}}}],
    )
    job = {"metadata": {"name": "tiny-sft"}}
    assert 'jobs.batch "tiny-sft" is forbidden: exceeded quota: no-jobs, requested: count/jobs.batch=1' in (
        object_refusal("jobs", "batch", job, [quota("no-jobs", **{"count/jobs.batch": "0"})], []) or ""
    )
    assert object_refusal("jobs", "batch", job, [quota("claims", persistentvolumeclaims="0")], []) is None
