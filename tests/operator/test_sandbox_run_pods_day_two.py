"""`rlt sandbox --run-pods` as a day-two trial uses it, with a real kubectl: the trainer pods' preflight init container
runs before the trainer and sets CapacityOK (a refusal fails the run), an image that cannot be pulled, a
ResourceQuota that refuses the pods, and the operator restarted with SIGHUP — each shown as on a cluster."""

from __future__ import annotations

import json
import signal

import pytest
import yaml
from suite_helpers import find_tool, tiny_doc, wait_for

from rlt.contract.layout import parse_time

KUBECTL = find_tool("kubectl")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(300),
    pytest.mark.skipif(KUBECTL is None, reason="kubectl not installed"),
]


def sft_only(name: str, **spec) -> dict:
    doc = tiny_doc()
    doc["metadata"]["name"] = name
    doc["spec"]["stages"]["rl"]["enabled"] = False
    doc["spec"]["stages"]["distill"]["enabled"] = False
    doc["spec"].update(spec)
    return doc


def apply(box, tmp_path, doc: dict, namespace: str = "default") -> None:
    path = tmp_path / f"{doc['metadata']['name']}.yaml"
    path.write_text(yaml.safe_dump(doc))
    box.kubectl("apply", "--validate=false", "-n", namespace, "-f", str(path))


def run_status(box, name: str, namespace: str = "default") -> dict:
    return json.loads(box.kubectl("get", "rlt", name, "-n", namespace, "-o", "json")).get("status") or {}


def condition(status: dict, type_: str) -> dict:
    return {c["type"]: c for c in status.get("conditions") or []}.get(type_) or {}


def pods_of(box, run: str, namespace: str = "default") -> list[dict]:
    return json.loads(box.kubectl("get", "pods", "-n", namespace, "-l", f"rlt.dev/run={run}", "-o", "json"))["items"]


def pod_column(box, run: str, namespace: str = "default") -> str:
    """The STATUS column of `kubectl get pods` for the run's one pod ('' before it exists)."""
    out = box.kubectl("get", "pods", "-n", namespace, "-l", f"rlt.dev/run={run}", "--no-headers")
    rows = [line.split() for line in out.splitlines() if line.strip()]
    return rows[0][2] if rows else ""


def test_preflight_runs_before_the_trainer_sets_capacity_ok_and_a_refusal_fails_the_run(start_sandbox, tmp_path):
    """The trainer pods' init container `validate` (`rlt preflight`) runs first: CapacityOK=True (Fits) through the
    real preflight; a run whose declared GPU memory (the node label GPU feature discovery sets, selected by the
    run) is too small is refused there: CapacityOK=False, the run Failed, the pod Init:Error, no trainer started."""
    from rlt.data.models import resolve_model_path

    # The model's config, as the trainer image has it baked in: the plan reads it to size the GPU memory.
    resolve_model_path("builtin:tiny-qwen2")
    pods_dir = tmp_path / "pods"
    box = start_sandbox("--run-pods", str(pods_dir), "--node-label", "nvidia.com/gpu.memory=2048")
    apply(box, tmp_path, sft_only("fits"))
    apply(box, tmp_path, sft_only("big", scheduling={"nodeSelector": {"nvidia.com/gpu.memory": "2048"}}))

    seen: list[str] = []  # the fitting pod's STATUS column over time

    def capacity_checked():
        column = pod_column(box, "fits")
        if column and (not seen or seen[-1] != column):
            seen.append(column)
        st = run_status(box, "fits")
        return st if condition(st, "CapacityOK") and column == "Running" else None

    st = wait_for(capacity_checked, "CapacityOK on run fits and its trainer running", 180, every=0.3)
    ok = condition(st, "CapacityOK")
    assert ok["status"] == "True" and ok["reason"] == "Fits", ok
    assert ok["message"].startswith("stage sft: GPU memory per trainer process"), ok
    # The init container ran to its end before the trainer started: its finishedAt is not after the main
    # container's startedAt (the pod's own record; polling for kubectl's Init:0/1 can miss it on a busy machine).
    (pod,) = pods_of(box, "fits")
    (init,) = pod["status"]["initContainerStatuses"]
    assert init["name"] == "validate" and init["state"]["terminated"]["exitCode"] == 0
    (main,) = pod["status"]["containerStatuses"]
    started = parse_time(main["state"]["running"]["startedAt"])
    assert parse_time(init["state"]["terminated"]["finishedAt"]) <= started, (init, main, seen)
    assert init["state"]["terminated"]["message"].startswith("capacity: fits: stage sft:")
    box.kubectl("delete", "rlt", "fits", "--wait=false")  # spare the CPU the rest of its training

    def refused():
        st = run_status(box, "big")
        return st if st.get("phase") == "Failed" and condition(st, "CapacityOK") else None

    st = wait_for(refused, "run big Failed with CapacityOK", 120, every=0.5)
    cap = condition(st, "CapacityOK")
    assert cap["status"] == "False" and cap["reason"] == "CapacityExceeded", cap
    assert "GPU memory" in cap["message"] and "nvidia.com/gpu.memory=2048" in cap["message"], cap
    assert "CONFIG_ERROR (78)" in st["message"], st
    (pod,) = pods_of(box, "big")
    (init,) = pod["status"]["initContainerStatuses"]
    assert init["state"]["terminated"]["exitCode"] == 78
    assert pod["status"]["phase"] == "Failed"
    assert pod["status"]["containerStatuses"][0]["state"] == {"waiting": {"reason": "PodInitializing"}}
    assert pod_column(box, "big") == "Init:Error"
    name = pod["metadata"]["name"]
    assert "capacity:" in box.kubectl("logs", name, "-c", "validate")
    assert not (pods_dir / "pods" / "default" / name / "container.log").exists(), "the trainer must never start"


def test_an_image_that_cannot_be_pulled_keeps_the_pod_pending_and_shows_on_the_run(start_sandbox, tmp_path):
    box = start_sandbox("--run-pods", str(tmp_path / "pods"), "--missing-image", "*:missing")
    image = "ghcr.io/example/rlt-trainer:missing"
    apply(box, tmp_path, sft_only("pull", images={"trainer": image}))

    seen: set[str] = set()

    def backing_off():
        seen.add(pod_column(box, "pull"))
        return "Init:ImagePullBackOff" in seen and "Init:ErrImagePull" in seen

    wait_for(backing_off, "Init:ErrImagePull, then Init:ImagePullBackOff", 60, every=0.3)
    (pod,) = pods_of(box, "pull")
    assert pod["status"]["phase"] == "Pending"
    waiting = pod["status"]["initContainerStatuses"][0]["state"]["waiting"]
    assert waiting["reason"] in ("ErrImagePull", "ImagePullBackOff") and image in waiting["message"]

    def on_run():
        st = run_status(box, "pull")
        return st if st.get("reason") in ("ErrImagePull", "ImagePullBackOff") else None

    st = wait_for(on_run, "the pull error as the run's reason", 30, every=0.5)
    assert image in st["message"] and st["phase"] != "Failed", st
    # Its pod never ran: Pending, not Ready, whatever the age of its Job (issue 45: it said Running).
    assert st["phase"] == "Pending" and condition(st, "Ready")["status"] == "False", st
    assert condition(st, "Ready")["reason"] in ("ErrImagePull", "ImagePullBackOff"), st
    events = box.kubectl("get", "events", "--field-selector", "involvedObject.name=pull")
    assert "no pod of the run runs yet" in events and "the run is running" not in events, events
    # What the sandbox prints of the pod: why it has not started, never "started" (issue 53)
    said = wait_for(lambda: [x for x in box.output if x.startswith("pod default/pull-")], "the pod's line", 30)
    assert not any(": started" in x for x in said), said
    assert "not started, ErrImagePull/ImagePullBackOff" in said[0] and image in said[0], said


def test_a_resource_quota_that_refuses_the_pods_holds_the_run_with_nothing_created(start_sandbox, tmp_path):
    """The API server refuses pods over a namespace's ResourceQuota: the operator's dry-run of the pod its Job would
    make (rlt_operator.apply.admission) finds it before any child exists, so the run holds naming the quota and the run's
    field, and no ConfigMap, claim, Job or pod is made around it. Raising the quota lets the pod be created. (A quota
    that runs out after the check: the Job controller's FailedCreate on the run, test_pods_not_created.)"""
    box = start_sandbox("--run-pods", str(tmp_path / "pods"))
    box.kubectl("create", "namespace", "team-q")
    box.kubectl("create", "quota", "gpus", "-n", "team-q", "--hard=requests.nvidia.com/gpu=0")
    apply(box, tmp_path, sft_only("tiny"), namespace="team-q")

    def held():
        st = run_status(box, "tiny", "team-q")
        return st if condition(st, "ChildrenValid").get("reason") == "ChildRefused" else None

    st = wait_for(held, "ChildrenValid=False, ChildRefused", 60, every=0.5)
    cond = condition(st, "ChildrenValid")
    assert cond["status"] == "False"
    assert cond["message"].startswith("ResourceQuota gpus, against spec.resources.trainer.gpus: "), cond
    assert "exceeded quota: gpus, requested: requests.nvidia.com/gpu=1" in cond["message"], cond
    assert "the pod of jobs/tiny-sft" in cond["message"], cond
    events = box.kubectl("get", "events", "-n", "team-q")
    assert "ChildRefused" in events and "exceeded quota" in events, events
    for kind in ("configmaps", "pvc", "jobs", "pods"):
        made = box.kubectl("get", kind, "-n", "team-q", "-l", "rlt.dev/run=tiny", "-o", "name")
        assert made.strip() == "", f"{kind} created beside a refused pod: {made}"
    assert st["phase"] == "Pending" and condition(st, "Ready")["reason"] == "ChildRefused", st

    box.kubectl(
        "patch",
        "quota",
        "gpus",
        "-n",
        "team-q",
        "--type=merge",
        "-p",
        '{"spec":{"hard":{"requests.nvidia.com/gpu":"1"}}}',
    )
    # the held check is repeated with back-off (2 s doubling, at most a minute)
    wait_for(lambda: pods_of(box, "tiny", "team-q"), "the pod, once the quota allows it", 90, every=0.5)
    box.kubectl("delete", "rlt", "tiny", "-n", "team-q", "--wait=false")


def test_sighup_restarts_the_sandboxs_operator(start_sandbox, tmp_path):
    box = start_sandbox()
    assert f"kill -HUP {box.proc.pid}" in box.banner
    apply(box, tmp_path, sft_only("before"))
    wait_for(lambda: run_status(box, "before").get("phase"), "run before reconciled", 30, every=0.3)

    box.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: "the operator was restarted" in box.banner, "the restart said", 60, every=0.2)
    assert box.proc.poll() is None
    apply(box, tmp_path, sft_only("after"))  # the new operator reconciles a run it never saw
    # 60 s: the new Kopf discovers every resource and opens its watches first, slow on a busy machine
    st = wait_for(lambda: run_status(box, "after").get("phase") and run_status(box, "after"), "run after", 60)
    assert st["phase"] in ("Pending", "Running"), st
    log = (box.kubeconfig.parent / "operator.log").read_text()
    assert "SIGHUP: restarting the operator" in log and log.index("SIGHUP") < log.rindex("[default/after]")
