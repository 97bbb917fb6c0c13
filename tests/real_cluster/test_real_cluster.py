"""The CRD, the chart, the examples and the operator against a real kube-apiserver (+ etcd, + kube-controller-manager
when $KUBEBUILDER_ASSETS has one): what kmock cannot show (CEL cost limits, structural pruning, RBAC, admission,
the Job controller's FailedCreate, garbage collection). `make test-real-cluster`; skipped without the variable.

The tests share one control plane and run in file order: the dry-run install on a fresh cluster comes first.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from conftest import skip_without_assets
from kube_env import RLT, running_operator
from suite_helpers import EXAMPLES
from suite_helpers import wait_for as suite_wait_for

from rlt_operator.builders.common import A_CONFIG_HASH
from rlt_operator.status.model import RLTRunStatus

skip_without_assets()

pytestmark = [pytest.mark.real_cluster, pytest.mark.xdist_group("real_cluster"), pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "rlt-operator"
RELEASE, SYSTEM_NS = "rlt-operator", "rlt-system"
IMAGE = "registry.example.com/rlt/rlt-operator"  # never pulled: no kubelet here


def helm(cluster, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
    r = subprocess.run(["helm", *args], capture_output=True, text=True, env=env, timeout=300)
    if check and r.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)}: rc {r.returncode}\n{r.stdout}\n{r.stderr}")
    return r


def get(cluster, *args: str, kubeconfig: Path | None = None) -> dict | None:
    r = cluster.kubectl("get", *args, "-o", "json", check=False, kubeconfig=kubeconfig)
    return json.loads(r.stdout) if r.returncode == 0 else None


def wait_for(probe, what: str, timeout: float = 60.0):
    """suite_helpers.wait_for with this suite's longer default (a real control plane is slower than kmock)."""
    return suite_wait_for(probe, what, seconds=timeout, every=0.5)


def tiny(name: str, namespace: str, **spec_overrides) -> dict:
    doc = yaml.safe_load((EXAMPLES / "rltrun-tiny.yaml").read_text())
    doc["metadata"] = {"name": name, "namespace": namespace}
    for dotted, value in spec_overrides.items():
        node = doc["spec"]
        *parents, last = dotted.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    return doc


def apply(cluster, doc: dict, *flags: str, check: bool = True) -> subprocess.CompletedProcess:
    return cluster.kubectl("apply", "--server-side", *flags, "-f", "-", stdin=yaml.safe_dump(doc), check=check)


def condition(status: dict, type_: str) -> dict:
    return next((c for c in status.get("conditions") or [] if c["type"] == type_), {})


# ------------------------------------------------------------------------------------------------ install


def test_helm_install_dry_run_server_on_a_fresh_cluster(cluster):
    """docs/install.md suggests it first: Kopf's peering object must not make it fail before its CRD exists."""
    version = cluster.kubectl("version", "-o", "json").stdout
    print("server:", json.loads(version)["serverVersion"]["gitVersion"])
    assert get(cluster, "crd", "rltruns.rlt.dev") is None, "not a fresh cluster"
    r = helm(
        cluster, "install", RELEASE, str(CHART), "-n", SYSTEM_NS, "--create-namespace", "--dry-run=server",
        "--set", f"image.repository={IMAGE}", check=False,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr


def test_the_chart_installs_with_its_crd(cluster):
    helm(
        cluster,
        "install",
        RELEASE,
        str(CHART),
        "-n",
        SYSTEM_NS,
        "--create-namespace",
        "--set",
        f"image.repository={IMAGE}",
    )
    crd = get(cluster, "crd", "rltruns.rlt.dev")
    assert crd is not None, "helm installed no RLTRun CRD (the API server refused it?)"
    assert condition(crd["status"], "Established").get("status") == "True", crd["status"]
    assert get(cluster, "clusterkopfpeering", RELEASE) is not None, "the peering object after a real install"
    # The plain manifests for users without Helm are accepted server-side too (dry run: the release owns them).
    r = cluster.kubectl(
        "apply", "--server-side", "--force-conflicts", "--dry-run=server", "-f",
        str(ROOT / "manifests" / "install" / "rlt-operator.yaml"), check=False,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    # docs/install.md: client-side apply works too (the CRD fits the last-applied annotation).
    r = cluster.kubectl("apply", "--dry-run=server", "-f", str(ROOT / "manifests" / "crd"), check=False)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_every_example_is_accepted_by_the_server(cluster, path):
    for doc in yaml.safe_load_all(path.read_text()):
        ns = (doc.get("metadata") or {}).get("namespace")
        if ns:
            cluster.kubectl("create", "namespace", ns, check=False)
    r = cluster.kubectl("apply", "--server-side", "--dry-run=server", "--validate=strict", "-f", str(path), check=False)
    assert r.returncode == 0, r.stderr
    assert "unknown field" not in r.stderr and "Warning" not in r.stderr, r.stderr


INVALID = [
    # (case, spec overrides or a name, what the server's refusal must say, what it must not)
    ("limit below request", {"resources.trainer.memory": "64Gi", "resources.trainer.memoryLimit": "32Gi"},
     "spec.resources.trainer.memoryLimit: Invalid value", "memoryLimit must be at least the memory request"),
    ("limit below the default request", {"resources.generator.gpus": 1, "resources.generator.cpuLimit": "3"},
     "spec.resources.generator.cpuLimit", "cpuLimit must be at least the CPU request"),
    ("numGenerations 0", {"stages.rl.numGenerations": 0}, "spec.stages.rl.numGenerations", "should be greater than"),
    ("batch not a multiple", {"stages.rl.batchSize": 10, "stages.rl.numGenerations": 4},
     "spec.stages.rl.batchSize", "batchSize must be divisible by numGenerations"),
    ("size with a space", {"storage.size": "1 TB"}, "spec.storage.size", "should match"),
    ("storage of zero", {"storage.size": "0"}, "spec.storage.size", "size must be above 0"),
    ("tp x dp over gpus", {"resources.generator.gpus": 2, "resources.generator.tensorParallelSize": 2,
                           "resources.generator.dataParallelSize": 2},
     "spec.resources.generator.dataParallelSize", "must not exceed gpus"),
    ("colocate without gpus", {"resources.trainer.gpus": 0, "stages.rl.generation": {"mode": "colocate"}},
     "spec.resources.trainer.gpus", "colocate"),
    ("unknown field", {"bogus": 1}, ".spec.bogus", "field not declared in schema"),
    ("run name with a digit first", "1run", "metadata.name", "DNS-1035"),
]  # fmt: skip


@pytest.mark.parametrize("case, change, where, says", INVALID, ids=[c[0] for c in INVALID])
def test_invalid_runs_are_refused_by_the_server_naming_the_field(cluster, case, change, where, says):
    doc = tiny(change, "default") if isinstance(change, str) else tiny("bad", "default", **change)
    r = apply(cluster, doc, "--dry-run=server", "--validate=strict", check=False)
    assert r.returncode != 0, f"the server accepted {case}"
    assert where in r.stderr and says in r.stderr, r.stderr
    # CEL rules never add evaluation errors (modulus by zero, a quantity that does not parse) to a refusal.
    assert "evaluating rule" not in r.stderr and "<nil>" not in r.stderr, r.stderr


def test_a_null_optional_field_the_server_and_rlt_agree(cluster, tmp_path):
    """`maxModelLen: null` (nullable in the CRD, so the server keeps the null): the server's CEL rules read it as
    absent and accept the run, as rlt validate and the suite's CRD harness do (found by the door's long property
    run, where the harness alone refused it)."""
    doc = yaml.safe_load((EXAMPLES / "rltrun-small-2gpu.yaml").read_text())
    doc["metadata"]["namespace"] = "default"
    doc["spec"]["stages"]["rl"]["generation"]["maxModelLen"] = None
    server = apply(cluster, doc, "--dry-run=server", check=False)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(doc))
    local = subprocess.run([*RLT, "validate", "--no-data", "--no-plan", str(path)], capture_output=True, text=True)
    # the suite's CRD harness (tests/operator/test_crd_cel.py) reads it the same way: test_door_cases keeps the case
    assert server.returncode == 0 and local.returncode == 0, (server.stderr, local.stderr)


# ------------------------------------------------------------------------------------------------ the operator


@pytest.fixture(scope="module")
def operator(cluster, tmp_path_factory):
    """`rlt operator` with the chart Deployment's own arguments, as the chart's ServiceAccount (a token from
    `kubectl create token`): every request is held to the chart's RBAC."""
    deploy = get(cluster, "deployment", RELEASE, "-n", SYSTEM_NS)
    assert deploy is not None, "the chart's Deployment (test_the_chart_installs_with_its_crd runs first)"
    pod = deploy["spec"]["template"]["spec"]
    args = pod["containers"][0]["args"]
    token = cluster.kubectl("create", "token", pod["serviceAccountName"], "-n", SYSTEM_NS, "--duration=2h").stdout
    work = tmp_path_factory.mktemp("operator")
    kubeconfig = cluster.write_kubeconfig(work / "sa.kubeconfig", {"token": token.strip()})
    # In the release namespace, as the chart's pod: its leader Lease is where the chart's Role grants it.
    with running_operator(kubeconfig, args, work, "real-cluster-test", pod_namespace=SYSTEM_NS) as (proc, log_path):
        yield {"proc": proc, "log": log_path, "kubeconfig": kubeconfig}


def run_status(cluster, name: str, ns: str) -> dict:
    return (get(cluster, "rltrun", name, "-n", ns) or {}).get("status") or {}


def test_a_toleration_with_seconds_is_accepted_by_the_server_as_by_rlt(cluster, tmp_path):
    """tolerationSeconds rides out a spot node's taint. The CRD once carried the int64 extremes as bounds, which the
    server keeps as float64 and refused ("Minimum boundary value must be of type integer"), while rlt validate
    accepted the run; now both accept it."""
    toleration = {"key": "cloud.google.com/gke-spot", "operator": "Exists", "effect": "NoExecute"}
    doc = tiny("spot", "default", **{"scheduling.tolerations": [{**toleration, "tolerationSeconds": 3600}]})
    server = apply(cluster, doc, "--dry-run=server", check=False)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(doc))
    local = subprocess.run([*RLT, "validate", "--no-data", "--no-plan", str(path)], capture_output=True, text=True)
    assert server.returncode == 0 and local.returncode == 0, (server.stderr, local.stderr)


def test_the_operator_reconciles_a_run_under_the_charts_service_account(cluster, operator):
    ns = "team-a"
    cluster.create_namespace(ns)
    apply(cluster, tiny("tiny", ns))
    run = get(cluster, "rltrun", "tiny", "-n", ns)
    # No scheduler or kubelet runs here, so no pod ever runs: the run is Pending in its first stage (issue 45: never
    # Running while nothing runs), with Ready False saying what it waits for.
    st = wait_for(lambda: run_status(cluster, "tiny", ns).get("stage") == "sft" and run_status(cluster, "tiny", ns),
                  "stage sft", timeout=90)  # fmt: skip
    assert st["phase"] == "Pending" and condition(st, "Ready")["status"] == "False", st
    # Every child accepted by the server, each the run's (owner UID and label).
    for kind, name in (
        ("configmap", "tiny-config"),
        ("pvc", "tiny-data"),
        ("job", "tiny-sft"),
        ("service", "tiny-sft"),
    ):
        child = wait_for(lambda k=kind, n=name: get(cluster, k, n, "-n", ns), f"{kind}/{name}")
        assert child["metadata"]["labels"]["rlt.dev/run"] == "tiny"
        if kind != "pvc":  # the retained claim has no owner reference (the GC would delete it with the run)
            assert child["metadata"]["ownerReferences"][0]["uid"] == run["metadata"]["uid"]
        shown = get(cluster, kind, name, "-n", ns, "--show-managed-fields")
        managers = {m["manager"] for m in shown["metadata"].get("managedFields") or []}
        assert "rlt-operator" in managers, managers
    # Status not pruned: what the operator wrote is what the server kept (every field is in the CRD's schema).
    RLTRunStatus.model_validate(st)
    assert st["observedGeneration"] == 1 and st["stage"] == "sft" and condition(st, "SpecValid")["status"] == "True"
    fields = get(cluster, "rltrun", "tiny", "-n", ns, "--show-managed-fields")["metadata"]["managedFields"]
    assert "rlt-operator" in {m["manager"] for m in fields if m.get("subresource") == "status"}, fields
    if cluster.has_controllers:
        # The real Job controller makes the pods; no scheduler runs here, so none has a node: not "Scheduled".
        wait_for(lambda: (get(cluster, "pods", "-n", ns, "-l", "rlt.dev/run=tiny") or {}).get("items"), "pods")
        st = wait_for(
            lambda: (
                condition(run_status(cluster, "tiny", ns), "PodsSchedulable").get("reason") == "NotScheduled"
                and run_status(cluster, "tiny", ns)
            ),
            "PodsSchedulable NotScheduled",
        )
        assert condition(st, "PodsSchedulable")["status"] == "Unknown"
        # What on-call reads first: the default columns as a real server prints them (the Trainer column is a
        # filtered JSONPath, which kmock's printer never evaluated).
        table = cluster.kubectl("get", "rlt", "-A").stdout.splitlines()
        assert table[0].split()[:5] == ["NAMESPACE", "NAME", "PHASE", "STAGE", "TRAINER"], table[0]
        row = next(line.split() for line in table[1:] if line.split()[:2] == [ns, "tiny"])
        assert row[2:5] == ["Pending", "sft", "WaitingForPods"], table

    # Deletion: the finalizer runs, the children go (the pods by garbage collection), the retained claim stays.
    cluster.kubectl("delete", "rltrun", "tiny", "-n", ns, "--wait=false")
    wait_for(lambda: get(cluster, "rltrun", "tiny", "-n", ns) is None, "the run deleted", timeout=60)
    for kind, name in (("configmap", "tiny-config"), ("job", "tiny-sft"), ("service", "tiny-sft")):
        wait_for(lambda k=kind, n=name: get(cluster, k, n, "-n", ns) is None, f"{kind}/{name} deleted")
    assert get(cluster, "pvc", "tiny-data", "-n", ns) is not None, "retentionPolicy Retain keeps the claim"
    if cluster.has_controllers:
        wait_for(
            lambda: not (get(cluster, "pods", "-n", ns, "-l", "rlt.dev/run=tiny") or {}).get("items"),
            "pods garbage-collected",
            timeout=90,
        )


def test_a_missing_priority_class_holds_the_run_before_any_child(cluster, operator):
    """The Priority admission plugin refuses a pod whose PriorityClass does not exist: the operator's dry-run of the
    pod its Job would make finds it first (once it was the Job controller's FailedCreate, after every child was
    made), so the run holds naming the PriorityClass and the run's field, with nothing created."""
    ns = "team-b"
    cluster.create_namespace(ns)
    apply(cluster, tiny("prio", ns, **{"scheduling.priorityClassName": "training-high"}))
    st = wait_for(
        lambda: (
            condition(run_status(cluster, "prio", ns), "ChildrenValid").get("reason") == "ChildRefused"
            and run_status(cluster, "prio", ns)
        ),
        "ChildrenValid ChildRefused",
        timeout=90,
    )
    message = condition(st, "ChildrenValid")["message"]
    assert message.startswith("PriorityClass training-high (not found), against spec.scheduling.priorityClassName")
    assert "no PriorityClass with name training-high was found" in message and st["reason"] == "ChildRefused"
    for kind in ("configmaps", "pvc", "jobs"):
        assert not (get(cluster, kind, "-n", ns, "-l", "rlt.dev/run=prio") or {}).get("items"), kind
    cluster.kubectl("delete", "rltrun", "prio", "-n", ns)


def test_someone_elses_object_is_a_name_conflict_and_survives_the_runs_deletion(cluster, operator):
    ns = "team-c"
    cluster.create_namespace(ns)
    cluster.kubectl("create", "configmap", "mine-config", "-n", ns, "--from-literal=theirs=yes")
    before = get(cluster, "configmap", "mine-config", "-n", ns)
    apply(cluster, tiny("mine", ns, **{"storage.retentionPolicy": "Delete"}))
    st = wait_for(  # the dry-run's 409 for a name that is not the run's: nothing is created
        lambda: (
            condition(run_status(cluster, "mine", ns), "ChildrenValid").get("reason") == "NameConflict"
            and run_status(cluster, "mine", ns)
        ),
        "NameConflict",
        timeout=60,
    )
    assert "configmaps/mine-config is someone else's object" in condition(st, "ChildrenValid")["message"]
    assert get(cluster, "job", "mine-sft", "-n", ns) is None, "no pods beside a name conflict"
    assert get(cluster, "pvc", "mine-data", "-n", ns) is None, "nothing beside a name conflict"
    cluster.kubectl("delete", "rltrun", "mine", "-n", ns)
    after = get(cluster, "configmap", "mine-config", "-n", ns)
    assert after is not None and after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]


def test_a_child_the_server_refuses_is_on_the_run_with_the_servers_message(cluster, operator):
    """A ResourceQuota that allows no Job: the server answers the Job's dry-run with 403; the run holds with
    nothing created and says so (status written, condition naming the quota, Event) instead of retrying in
    silence. (Pod-level refusals: test_server_admission.py.)"""
    ns = "team-d"
    cluster.create_namespace(ns)
    cluster.kubectl("create", "quota", "no-jobs", "-n", ns, "--hard=count/jobs.batch=0")
    apply(cluster, tiny("quota", ns))
    st = wait_for(
        lambda: (
            condition(run_status(cluster, "quota", ns), "ChildrenValid").get("reason") == "ChildRefused"
            and run_status(cluster, "quota", ns)
        ),
        "ChildRefused",
        timeout=60,
    )
    message = condition(st, "ChildrenValid")["message"]
    assert message.startswith("ResourceQuota no-jobs: ") and "exceeded quota: no-jobs" in message, message
    assert "jobs/quota-sft" in message and st.get("phase"), st
    assert get(cluster, "configmap", "quota-config", "-n", ns) is None, "nothing created beside the refused Job"
    events = get(cluster, "events", "-n", ns, "--field-selector", "involvedObject.name=quota,reason=ChildRefused")
    assert events and events["items"], "a Warning Event on the run"
    cluster.kubectl("delete", "rltrun", "quota", "-n", ns)


def test_the_documented_job_status_patch_is_accepted_and_the_old_one_refused(cluster):
    """docs/operator.md and the sandbox's banner "finish" a Job with COMPLETE_JOB_PATCH; a real server's Job status
    rules refuse the bare Complete condition the docs used to show."""
    from rlt_sandbox.sandbox import COMPLETE_JOB_PATCH

    ns = "team-e"
    cluster.create_namespace(ns)
    job = {  # managed by no controller here, as in the sandbox: its status is whatever is patched in
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "idiom", "namespace": ns},
        "spec": {
            "managedBy": "example.com/nobody",
            "template": {
                "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "registry.example.com/x:1"}]}
            },
        },
    }
    apply(cluster, job)
    patch = ["patch", "job", "idiom", "-n", ns, "--subresource=status", "--type=merge", "--dry-run=server", "-p"]
    old = '{"status":{"succeeded":1,"conditions":[{"type":"Complete","status":"True"}]}}'
    refused = cluster.kubectl(*patch, old, check=False)
    assert refused.returncode != 0 and "SuccessCriteriaMet" in refused.stderr, refused.stderr
    r = cluster.kubectl(*patch, COMPLETE_JOB_PATCH, check=False)
    assert r.returncode == 0, r.stderr
    # The kubelet emulator's own Job statuses (rlt_sandbox.kubelet_emulator) pass the same rules.
    from rlt_sandbox.kubelet_model import job_terminal_conditions

    start = {"startTime": "2026-01-01T00:00:00Z", "active": 0}
    done = {"reason": "CompletionsReached", "message": "Reached expected number of succeeded pods"}
    failed = {"reason": "BackoffLimitExceeded", "message": "Job has reached the specified backoff limit"}
    for status in (
        {**start, "succeeded": 1, "completionTime": "2026-01-01T00:01:00Z",
         "conditions": job_terminal_conditions("SuccessCriteriaMet", "Complete", done)},
        {**start, "failed": 1, "conditions": job_terminal_conditions("FailureTarget", "Failed", failed)},
    ):  # fmt: skip
        r = cluster.kubectl(*patch, json.dumps({"status": status}), check=False)
        assert r.returncode == 0, f"{r.stderr}\n{status}"


def test_a_failed_gangs_pod_outlives_its_job_under_the_real_garbage_collector(cluster, operator):
    """The operator keeps a failed gang's trainer pod for its logs by handing it to the run before it deletes the
    Job (gang.kept_pod_patch): the real Job controller and garbage collector must then leave it, and take it with
    the run."""
    if not cluster.has_controllers:
        pytest.skip("needs kube-controller-manager (the Job controller, the garbage collector) in $KUBEBUILDER_ASSETS")
    ns = "team-g"
    cluster.create_namespace(ns)
    apply(cluster, tiny("keep", ns))
    run_uid = get(cluster, "rltrun", "keep", "-n", ns)["metadata"]["uid"]
    pods = wait_for(lambda: (get(cluster, "pods", "-n", ns, "-l", "job-name=keep-sft") or {}).get("items"), "pods")
    pod, job_uid = pods[0]["metadata"]["name"], pods[0]["metadata"]["ownerReferences"][0]["uid"]
    # What a kubelet would report (none runs here): the trainer container exited 1 with its last line.
    terminated = {"exitCode": 1, "reason": "Error", "message": "RuntimeError: the last line"}
    status = {
        "phase": "Failed",
        "containerStatuses": [
            {"name": "trainer", "image": IMAGE, "imageID": "", "ready": False, "restartCount": 0,
             "state": {"terminated": terminated}}
        ],
    }  # fmt: skip
    cluster.kubectl("patch", "pod", pod, "-n", ns, "--subresource=status", "--type=merge", "-p",
                    json.dumps({"status": status}))  # fmt: skip
    st = wait_for(
        lambda: run_status(cluster, "keep", ns).get("lastFailedPod") == pod and run_status(cluster, "keep", ns),
        "status.lastFailedPod",
        timeout=90,
    )
    # the failed gang's Job is gone (replaced after the back-off), its pod is not
    wait_for(
        lambda: (
            (get(cluster, "job", "keep-sft", "-n", ns) or {"metadata": {"uid": job_uid}})["metadata"]["uid"] != job_uid
        ),
        "the failed Job deleted",
        timeout=90,
    )
    kept = wait_for(lambda: get(cluster, "pod", pod, "-n", ns), "the kept pod")
    assert [r["uid"] for r in kept["metadata"]["ownerReferences"]] == [run_uid], kept["metadata"]
    assert not kept["metadata"].get("deletionTimestamp"), "the garbage collector took it with the Job"
    # the Job controller's tracking finalizer went with the Job: left on, it keeps the pod Terminating for ever
    assert "batch.kubernetes.io/job-tracking" not in (kept["metadata"].get("finalizers") or []), kept["metadata"]
    assert st["restarts"] >= 1, st
    cluster.kubectl("delete", "rltrun", "keep", "-n", ns, "--wait=false")
    wait_for(lambda: get(cluster, "pod", pod, "-n", ns) is None, "the kept pod gone with the run", timeout=90)


def test_generators_and_suspend_on_the_real_server(cluster, operator):
    """rl with vLLM generators first: the StatefulSet, its Service and NetworkPolicy are accepted (the StatefulSet
    controller makes the pods), then suspend releases them and keeps the data."""
    ns = "team-f"
    cluster.create_namespace(ns)
    doc = tiny("gen", ns, **{"stages.sft.enabled": False, "stages.rl.generation": {"mode": "server"}})
    doc["spec"]["resources"] = {"generator": {"gpus": 1}, "trainer": {"gpus": 1}}
    apply(cluster, doc)
    for kind, name in (
        ("statefulset", "gen-generator"),
        ("service", "gen-generator"),
        ("networkpolicy", "gen-generator"),
    ):
        wait_for(lambda k=kind, n=name: get(cluster, k, n, "-n", ns), f"{kind}/{name}")
    st = wait_for(lambda: condition(run_status(cluster, "gen", ns), "GeneratorsReady") and run_status(cluster, "gen", ns),
                  "GeneratorsReady")  # fmt: skip
    assert condition(st, "GeneratorsReady")["status"] == "False" and st["stage"] == "rl"
    if cluster.has_controllers:
        wait_for(lambda: get(cluster, "pod", "gen-generator-0", "-n", ns), "the StatefulSet controller's pod")
    # An operator upgrade that changes the policy's rules (its scrapers) reaches a run already going: an old hash and
    # old rules stand for it here, and the operator, as the chart's ServiceAccount, patches both back on the server.
    policy = get(cluster, "networkpolicy", "gen-generator", "-n", ns)
    current = policy["metadata"]["annotations"][A_CONFIG_HASH]
    stale = {"metadata": {"annotations": {A_CONFIG_HASH: "stale"}}, "spec": {"ingress": []}}
    since = time.time()
    cluster.kubectl("patch", "networkpolicy", "gen-generator", "-n", ns, "--type=merge", "-p", json.dumps(stale))

    def kept_current() -> dict | None:
        now = get(cluster, "networkpolicy", "gen-generator", "-n", ns)
        same = now["metadata"]["annotations"][A_CONFIG_HASH] == current and now["spec"] == policy["spec"]
        return now if same else None

    wait_for(kept_current, "the policy patched back to the operator's rules", timeout=120)
    patched = [
        (w.user, w.code) for w in cluster.audit_writes(since) if (w.verb, w.resource) == ("patch", "networkpolicies")
    ]
    assert (operator_user(cluster), 200) in patched, patched
    cluster.kubectl("patch", "rltrun", "gen", "-n", ns, "--type=merge", "-p", '{"spec":{"suspend":true}}')
    wait_for(lambda: run_status(cluster, "gen", ns).get("phase") == "Suspended", "phase Suspended")
    wait_for(lambda: get(cluster, "statefulset", "gen-generator", "-n", ns) is None, "generators released")
    assert get(cluster, "pvc", "gen-data", "-n", ns) is not None and get(cluster, "configmap", "gen-config", "-n", ns)
    cluster.kubectl("delete", "rltrun", "gen", "-n", ns)


def test_the_operator_was_never_forbidden(cluster, operator):
    """Under the chart's own ServiceAccount: no request of the operator was refused by RBAC."""
    log = operator["log"].read_text()
    refused = ("HTTP 403", "Forbidden", "forbidden")
    # the quota and PriorityClass tests' refusals (the pod dry-run's), a namespace's default ServiceAccount not made
    # yet (the pod dry-run is retried), the Job controller's own
    expected = ("exceeded quota", "FailedCreate", "no PriorityClass with name", "error looking up service account")
    forbidden = [
        line for line in log.splitlines() if any(r in line for r in refused) and not any(e in line for e in expected)
    ]
    assert forbidden == [], "\n".join(forbidden[:10])
    assert operator["proc"].poll() is None, "the operator exited"


def operator_user(cluster) -> str:
    """The chart's ServiceAccount as the API server names a request's user (the operator fixture runs as it)."""
    deploy = get(cluster, "deployment", RELEASE, "-n", SYSTEM_NS)
    return f"system:serviceaccount:{SYSTEM_NS}:{deploy['spec']['template']['spec']['serviceAccountName']}"


def test_the_charts_service_account_reads_and_renews_its_own_lease_only(cluster, operator):
    """The chart's Role grants get and update on the Lease named as the peering (the one the replicas elect by),
    create on leases; the real authorizer refuses the same verbs on another Lease of the namespace."""
    deploy = get(cluster, "deployment", RELEASE, "-n", SYSTEM_NS)
    container = deploy["spec"]["template"]["spec"]["containers"][0]
    (peering,) = [a.split("=", 1)[1] for a in container["args"] if a.startswith("--peering=")]
    who = operator_user(cluster)

    def may(verb: str, resource: str) -> bool:
        r = cluster.kubectl("auth", "can-i", verb, resource, "-n", SYSTEM_NS, "--as", who, check=False)
        return r.stdout.strip() == "yes"

    assert get(cluster, "lease", peering, "-n", SYSTEM_NS) is not None, "the operator took its Lease"
    assert may("get", f"leases/{peering}") and may("update", f"leases/{peering}") and may("create", "leases")
    assert not may("get", "leases/someone-else") and not may("update", "leases/someone-else")
    assert not may("delete", f"leases/{peering}") and not may("list", "leases")


def test_day_two_upgrade_rollback_and_uninstall_on_the_real_server(cluster):
    """The day-two script's Helm steps against the real server (last: it uninstalls the release the operator
    fixture runs under): `helm upgrade` changes the Deployment in place (a strategic-merge patch the sandbox
    refuses), `helm rollback` puts it back, and `helm uninstall` keeps the CRD (helm.sh/resource-policy: keep) and
    so every run, as docs/operator.md says."""
    ns = "team-z"
    cluster.create_namespace(ns)
    apply(cluster, tiny("survivor", ns))

    def args() -> str:
        pod = get(cluster, "deployment", RELEASE, "-n", SYSTEM_NS)["spec"]["template"]["spec"]
        return " ".join(pod["containers"][0]["args"])

    assert "--log-format=json" not in args()
    helm(cluster, "upgrade", RELEASE, str(CHART), "-n", SYSTEM_NS, "--reuse-values", "--set", "operator.logFormat=json")
    assert "--log-format=json" in args(), args()
    helm(cluster, "rollback", RELEASE, "1", "-n", SYSTEM_NS)
    assert "--log-format=json" not in args(), args()
    history = json.loads(helm(cluster, "history", RELEASE, "-n", SYSTEM_NS, "-o", "json").stdout)
    assert [h["revision"] for h in history] == [1, 2, 3] and history[-1]["description"] == "Rollback to 1", history
    helm(cluster, "uninstall", RELEASE, "-n", SYSTEM_NS)
    assert get(cluster, "deployment", RELEASE, "-n", SYSTEM_NS) is None
    assert get(cluster, "crd", "rltruns.rlt.dev") is not None, "the CRD went with the release (and every run)"
    assert get(cluster, "rltrun", "survivor", "-n", ns) is not None
