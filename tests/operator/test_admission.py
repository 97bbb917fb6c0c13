"""Pod-level admission and the cluster's refusals in the dry-run gate (rlt_operator.apply.admission, .dry_run) and in
`rlt validate --server` (rlt_operator.apply.server_check).

Tables of the API server's Status messages (as kube-apiserver words them: the quota plugin, the LimitRanger, a
ValidatingAdmissionPolicy, a webhook, Pod Security, the RBAC authorizer) and who each names; the gate holding every
create on a 403 or a foreign 409 and not on the run's own 409; and, with the emulated API (kmock, whose quota and
minimal RBAC glue are rlt_sandbox.kmock_admission): a GPU quota on pods holds the run with nothing created and naming
the quota and the run's field, until the quota goes; `rlt validate --server` asks the pods too, and tells a user who
may not create the children from an invalid run (exit NO_PERMISSION, one line). The same on a real kube-apiserver:
tests/real_cluster/test_server_admission.py.
"""

from __future__ import annotations

import asyncio

import pytest
from op_harness import NS, example, server_mode

from rlt.checks.validation import validate_spec
from rlt.contract.exitcodes import ExitCode
from rlt_operator import builders
from rlt_operator.apply import admission, dry_run

pytestmark = pytest.mark.timeout(90)

REF = builders.RunRef(name="tiny", namespace="team", uid="u-1")
SPEC = validate_spec(example()["spec"], name="tiny", source="test")
CHILDREN = dry_run.checked_children(REF, SPEC, "sft")
JOB = next(b for p, b in CHILDREN if p == "jobs")


def test_each_job_and_statefulset_is_followed_by_the_bare_pod_it_would_make():
    kinds = [(p, b["metadata"]["name"]) for p, b in CHILDREN]
    assert kinds[kinds.index(("jobs", "tiny-sft")) + 1] == ("pods", "tiny-sft" + admission.POD_SUFFIX)
    pod = CHILDREN[kinds.index(("jobs", "tiny-sft")) + 1][1]
    template = JOB["spec"]["template"]
    assert pod["kind"] == "Pod" and pod["spec"] == template["spec"], "the template's pod spec, unchanged"
    assert pod["metadata"]["labels"] == template["metadata"]["labels"] and "ownerReferences" not in pod["metadata"]
    assert admission.pod_owner(pod) == "jobs/tiny-sft"
    spec = validate_spec(server_mode(example())["spec"], name="tiny", source="test")
    rl = [(p, b["metadata"]["name"]) for p, b in dry_run.checked_children(REF, spec, "rl")]
    assert ("pods", "tiny-generator" + admission.POD_SUFFIX) in rl
    rendered = dry_run.checked_children(REF, spec, "rl")
    pod = next(b for p, b in rendered if p == "pods" and "generator" in b["metadata"]["name"])
    assert admission.pod_owner(pod) == "statefulsets/tiny-generator"
    every = [(p, b["metadata"]["name"]) for p, b in dry_run.run_children(REF, spec)]
    assert ("pods", "tiny-distill" + admission.POD_SUFFIX) in every, "rlt validate --server sends the pods too"


# (Status message as kube-apiserver writes it, the refused child's kind, what the refusal must name first)
MESSAGES = [
    (
        'pods "tiny-sft-admission-check" is forbidden: exceeded quota: gpus, requested: requests.nvidia.com/gpu=1, '
        "used: requests.nvidia.com/gpu=0, limited: requests.nvidia.com/gpu=0",
        "pods",
        "ResourceQuota gpus, against spec.resources.trainer.gpus",
    ),
    (
        'persistentvolumeclaims "tiny-data" is forbidden: exceeded quota: no-claims, requested: '
        "persistentvolumeclaims=1,requests.storage=20Gi, used: persistentvolumeclaims=0,requests.storage=0, "
        "limited: persistentvolumeclaims=0,requests.storage=10Gi",
        "persistentvolumeclaims",
        "ResourceQuota no-claims, against spec.storage, spec.storage.size",
    ),
    (
        'jobs.batch "tiny-sft" is forbidden: exceeded quota: no-jobs, requested: count/jobs.batch=1, used: '
        "count/jobs.batch=0, limited: count/jobs.batch=0",
        "jobs",
        "ResourceQuota no-jobs",
    ),
    (
        'pods "x" is forbidden: status unknown for quota: no-gpus, resources: requests.nvidia.com/gpu',
        "pods",
        "ResourceQuota no-gpus",
    ),
    (
        'pods "x" is forbidden: failed quota: compute: must specify limits.cpu for: trainer',
        "pods",
        "ResourceQuota compute, against spec.resources.trainer.cpuLimit",
    ),
    (
        'pods "x" is forbidden: [maximum memory usage per Container is 1Gi, but limit is 8Gi, minimum cpu usage '
        "per Container is 2, but request is 1]",
        "pods",
        "a LimitRange in namespace team (kubectl -n team get limitrange), against "
        "spec.resources.trainer.memoryLimit, spec.resources.trainer.cpu",
    ),
    (
        'pods "x" is forbidden: maximum cpu usage per Pod is 2.  No limit is specified',
        "pods",
        "a LimitRange in namespace team (kubectl -n team get limitrange), against spec.resources.trainer.cpuLimit",
    ),
    (
        'persistentvolumeclaims "tiny-data" is forbidden: maximum storage usage per PersistentVolumeClaim is 1Gi, '
        "but request is 20Gi",
        "persistentvolumeclaims",
        "a LimitRange in namespace team (kubectl -n team get limitrange), against spec.storage.size",
    ),
    (
        "services \"tiny-sft\" is forbidden: ValidatingAdmissionPolicy 'no-services' with binding 'no-services' "
        "denied request: no Services here",
        "services",
        "ValidatingAdmissionPolicy no-services (binding no-services)",
    ),
    (
        'admission webhook "validate.kyverno.svc" denied the request: policy require-team-label',
        "jobs",
        "admission webhook validate.kyverno.svc",
    ),
    (
        'pods "x" is forbidden: violates PodSecurity "restricted:latest": seccompProfile',
        "pods",
        'Pod Security "restricted:latest" of namespace team (label pod-security.kubernetes.io/enforce)',
    ),
    (
        'pods "x" is forbidden: violates PodSecurity "baseline:latest": non-default capabilities (container '
        '"trainer" must not include "IPC_LOCK" in securityContext.capabilities.add)',
        "pods",
        'Pod Security "baseline:latest" of namespace team (label pod-security.kubernetes.io/enforce), against '
        "spec.resources.trainer.ipcLock",
    ),
    (
        'jobs.batch is forbidden: User "system:serviceaccount:rlt-system:rlt" cannot create resource "jobs" in API '
        'group "batch" in the namespace "team"',
        "jobs",
        "RBAC: system:serviceaccount:rlt-system:rlt may not create jobs.batch in namespace team",
    ),
    (
        'pods "x" is forbidden: error looking up service account team/trainer: serviceaccount "trainer" not found',
        "pods",
        "ServiceAccount trainer",
    ),
    (
        'pods "x" is forbidden: no PriorityClass with name training-high was found',
        "pods",
        "PriorityClass training-high (not found), against spec.scheduling.priorityClassName",
    ),
    (
        'configmaps "tiny-config" is forbidden: unable to create new content in namespace team because it is '
        "being terminated",
        "configmaps",
        "namespace team (being deleted)",
    ),
]


@pytest.mark.parametrize("message, plural, names", MESSAGES, ids=[m[2].split(" ")[0] + ":" + m[1] for m in MESSAGES])
def test_a_refusal_names_the_cluster_object_and_the_runs_field(message, plural, names):
    pod = CHILDREN[[p for p, _ in CHILDREN].index("pods")][1]
    child = pod if plural == "pods" else next((b for p, b in CHILDREN if p == plural), JOB)
    r = dry_run.refusal(plural, child, 403, {"code": 403, "reason": "Forbidden", "message": message}, SPEC, "team")
    (line,) = r.lines()
    assert line.startswith(names + ": " + message), line
    assert r.reason == dry_run.REFUSED
    if plural == "pods":
        assert line.endswith("(the API server refused the pod of jobs/tiny-sft)")


def test_a_pods_invalid_field_names_the_runs_field_of_its_template():
    """The image is checked by the pod validator, not the Job's (a Job with " trainer:1 " passes its dry-run)."""
    pod = CHILDREN[[p for p, _ in CHILDREN].index("pods")][1]
    cause = {"field": "spec.containers[0].image", "message": 'Invalid value: " trainer:1 "'}
    r = dry_run.refusal("pods", pod, 422, {"message": "invalid", "details": {"causes": [cause]}}, SPEC)
    assert r.lines()[0].startswith('spec.images.trainer: Invalid value: " trainer:1 "') and r.reason == "ChildInvalid"


class _Server:
    """A stand-in runner for the pure gate: answers per kind from a table (the HTTP path is kmock's and the real
    server's, below and in tests/real_cluster)."""

    def __init__(self, answers: dict[str, tuple[int, dict]]):
        self.answers, self.sent = answers, []

    def dry_run_create(self, plural, namespace, manifest):
        self.sent.append((plural, manifest["metadata"]["name"]))
        return self.answers.get(plural, (201, manifest))


async def test_the_gate_holds_on_a_forbidden_pod_and_on_someone_elses_name_not_on_its_own_child():
    from rlt_operator.status.decision import Action

    actions = [Action("create", "jobs", "tiny-sft", {})]
    decided = {"stage": "sft", "restarts": 0}
    quota = 'pods "p" is forbidden: exceeded quota: gpus, requested: requests.nvidia.com/gpu=1, used: ...'
    memory = dry_run.ChildrenCheck()
    kept, events = await dry_run.gate(_Server({"pods": (403, {"message": quota})}), REF, example()["spec"], decided,
                                      1, actions, memory, 0.0)  # fmt: skip
    assert kept == [] and events[0][:2] == ("Warning", "ChildRefused")
    assert events[0][2].startswith("ResourceQuota gpus, against spec.resources.trainer.gpus: ")
    status = dry_run.with_condition({"phase": "Pending", "stage": "sft"}, memory, dt_now())
    cond = next(c for c in status["conditions"] if c["type"] == "ChildrenValid")
    assert (cond["status"], cond["reason"], status["reason"]) == ("False", "ChildRefused", "ChildRefused")
    taken = _Server({"configmaps": (409, {"message": 'configmaps "tiny-config" already exists'})})
    memory = dry_run.ChildrenCheck()
    kept, _ = await dry_run.gate(taken, REF, example()["spec"], decided, 1, actions, memory, 0.0,
                                 ours=lambda plural, name: False)  # fmt: skip
    assert kept == [] and memory.refusals[0].lines()[0].startswith(
        "metadata.name (configmaps/tiny-config is someone else's object"
    )
    assert memory.refusals[0].reason == "NameConflict"
    memory = dry_run.ChildrenCheck()
    kept, _ = await dry_run.gate(taken, REF, example()["spec"], decided, 1, actions, memory, 0.0,
                                 ours=lambda plural, name: plural == "configmaps")  # fmt: skip
    assert kept == actions and memory.refusals == [], "the run's own ConfigMap (a later stage) is no refusal"
    # the run's own Job exists (an operator restarted mid-stage): its pods count against a quota already, so the
    # pod it would make is not asked (it would be counted twice)
    running = _Server({"jobs": (409, {"message": "exists"}), "pods": (403, {"message": quota})})
    memory = dry_run.ChildrenCheck()
    kept, _ = await dry_run.gate(running, REF, example()["spec"], decided, 1, actions, memory, 0.0,
                                 ours=lambda plural, name: plural == "jobs")  # fmt: skip
    assert kept == actions and ("pods", "tiny-sft" + admission.POD_SUFFIX) not in running.sent


def dt_now():
    import datetime as dt

    return dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)


# --------------------------------------------------------------------------------------------- with kmock

QUOTAS = f"/api/v1/namespaces/{NS}/resourcequotas"
GPU_QUOTA = {
    "apiVersion": "v1",
    "kind": "ResourceQuota",
    "metadata": {"name": "no-gpus"},
    "spec": {"hard": {"requests.nvidia.com/gpu": "0"}},
}


def _children_valid(st: dict) -> dict:
    return next((c for c in st.get("conditions") or [] if c["type"] == "ChildrenValid"), {})


CLAIM_QUOTA = {
    "apiVersion": "v1",
    "kind": "ResourceQuota",
    "metadata": {"name": "no-claims"},
    "spec": {"hard": {"persistentvolumeclaims": "0"}},
}
# (quota, what the run's reason must start with, where it says the refusal was)
HOLDS = [
    (GPU_QUOTA, "ResourceQuota no-gpus, against spec.resources.trainer.gpus: ", "the pod of jobs/tiny-sft"),
    (CLAIM_QUOTA, "ResourceQuota no-claims, against spec.storage: ", "persistentvolumeclaims/tiny-data"),
]


@pytest.mark.parametrize("quota, named, refused", HOLDS, ids=["gpus-on-pods", "no-claims"])
async def test_a_quota_holds_the_run_with_nothing_created_until_it_goes(harness, quota, named, refused):
    await harness.call("POST", QUOTAS, quota)
    await harness.start_operator()
    await harness.create_run(example())
    st = await harness.wait_status("tiny", lambda s: _children_valid(s).get("status") == "False", "held", timeout=20)
    cond = _children_valid(st)
    assert cond["reason"] == "ChildRefused" and st["reason"] == "ChildRefused" and st["phase"] == "Pending"
    assert cond["message"].startswith(named) and f"(the API server refused {refused})" in cond["message"], cond
    await asyncio.sleep(3)  # a back-off's recheck later: still nothing
    for plural in ("configmaps", "persistentvolumeclaims", "services", "jobs", "statefulsets", "pods"):
        assert await harness.list(plural, "rlt.dev/run=tiny") == [], f"{plural} created beside a refusal"
    events = [e for e in await harness.events("tiny") if e.get("reason") == "ChildRefused"]
    assert events and events[0]["message"].startswith(named)
    await harness.call("DELETE", QUOTAS + "/" + quota["metadata"]["name"])
    await harness.wait_object("jobs", "tiny-sft", timeout=40)  # the back-off's next check passes
    st = await harness.wait_status("tiny", lambda s: _children_valid(s).get("status") == "True", "recovered")
    assert "and their pods" in _children_valid(st)["message"]


# Refusals kmock does not run itself (no admission policies, LimitRanger or Pod Security): the test answers the
# dry-runs of that kind with the real server's words, twice, as a refusing object that is then removed.
# (the kind's collection, the Status message, what the run's reason must start with)
ANSWERED = [
    (
        "services",
        "services \"tiny-sft\" is forbidden: ValidatingAdmissionPolicy 'no-services' with binding 'no-services' "
        "denied request: no Services in this namespace",
        "ValidatingAdmissionPolicy no-services (binding no-services): ",
    ),
    (
        "pods",
        'pods "tiny-sft-admission-check" is forbidden: maximum cpu usage per Pod is 2.  No limit is specified',
        "a LimitRange in namespace default (kubectl -n default get limitrange), against "
        "spec.resources.trainer.cpuLimit: ",
    ),
    (
        "pods",
        'pods "tiny-sft-admission-check" is forbidden: violates PodSecurity "restricted:latest": '
        "allowPrivilegeEscalation != false",
        'Pod Security "restricted:latest" of namespace default (label pod-security.kubernetes.io/enforce): ',
    ),
]


@pytest.mark.parametrize("plural, says, named", ANSWERED, ids=["policy", "limitrange", "pod-security"])
async def test_a_refusal_by_policy_limitrange_or_pod_security_holds_the_run_naming_it(harness, plural, says, named):
    import re

    status = {"apiVersion": "v1", "kind": "Status", "status": "Failure", "reason": "Forbidden", "code": 403}
    answered = harness.cluster["post", re.compile(rf".*/namespaces/default/{plural}$"), {"dryRun": "All"}]
    refusing = answered[:2] << 403 << {**status, "message": says}
    await harness.start_operator()
    await harness.create_run(example())
    st = await harness.wait_status("tiny", lambda s: _children_valid(s).get("status") == "False", "held", timeout=20)
    message = _children_valid(st)["message"]
    assert message.startswith(named + says), message
    assert await harness.list("configmaps", "rlt.dev/run=tiny") == [], "created beside a refusal"
    await harness.wait_object("jobs", "tiny-sft", timeout=40)  # the third check passes: the refusal is gone
    assert len(list(refusing)) == 2


def _validate(harness_kubeconfig, tmp_path, monkeypatch, doc: dict) -> list[str]:
    import yaml

    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(doc))
    monkeypatch.setenv("KUBECONFIG", harness_kubeconfig)
    return ["validate", "--no-data", "--no-plan", "--server", str(path)]


async def test_rlt_validate_server_asks_the_pods_too(harness, tmp_path, monkeypatch, capsys):
    import os

    from rlt.cli import main as rlt_main

    argv = _validate(os.environ["KUBECONFIG"], tmp_path, monkeypatch, example())
    assert await asyncio.to_thread(rlt_main, argv) == 0, capsys.readouterr().err
    await harness.call("POST", QUOTAS, GPU_QUOTA)
    capsys.readouterr()
    assert await asyncio.to_thread(rlt_main, argv) == ExitCode.FAILED
    err = capsys.readouterr().err
    assert "INVALID" in err and "ResourceQuota no-gpus, against spec.resources.trainer.gpus" in err, err
    assert await harness.list("pods") == [], "validate --server creates nothing"


async def test_rlt_validate_server_tells_you_may_not_from_invalid(harness, tmp_path, monkeypatch, capsys):
    """A user who may create RLTRuns but not the children (the chart's rltrun-editor role): one line naming the
    verbs and kinds, exit NO_PERMISSION; by a SelfSubjectAccessReview, or, where none can be asked, by the dry-run's
    own RBAC 403s."""
    import os

    from rlt.cli import main as rlt_main

    argv = _validate(os.environ["KUBECONFIG"], tmp_path, monkeypatch, example())
    harness.cluster.forbidden = frozenset({("batch", "jobs"), ("", "pods"), ("", "services")})
    capsys.readouterr()
    assert await asyncio.to_thread(rlt_main, argv) == ExitCode.NO_PERMISSION == 77
    out, err = capsys.readouterr()
    assert "INVALID" not in err and out == ""
    (line,) = err.splitlines()
    assert line.startswith(f"{tmp_path / 'run.yaml'}: NOT PERMITTED: you may not create services, create jobs.batch, "
                           "create pods in namespace default"), line  # fmt: skip
    reviews = [r for r in harness.cluster._requests if r.resource and r.resource.plural == "selfsubjectaccessreviews"]
    assert reviews, "asked by SelfSubjectAccessReview"
    dry_runs = [r for r in harness.cluster._requests if r.params.get("dryRun") == "All"]
    assert dry_runs == [], "no dry-run is sent that could only be refused"
    # no review to ask (its create refused too): the dry-runs' own 403s name the rights
    harness.cluster.forbidden |= {("authorization.k8s.io", "selfsubjectaccessreviews")}
    assert await asyncio.to_thread(rlt_main, argv) == ExitCode.NO_PERMISSION
    (line,) = capsys.readouterr().err.splitlines()
    assert "NOT PERMITTED: you may not create services, create jobs.batch, create pods in namespace default" in line
