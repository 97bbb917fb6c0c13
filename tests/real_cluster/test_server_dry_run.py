"""The run's children dry-run on the real kube-apiserver (rlt_operator.apply.dry_run), and the offline door against it.

- Each class of user-set field, rendered into a child and broken there (the door would refuse the spec itself): the
  real server refuses the child and the refusal names the run's field (the map from child paths back to spec paths).
- The operator with a run whose child the server refuses (a value the offline door accepts today): ChildrenValid
  False naming the spec field, a Warning Event, nothing created, the run not Running; a valid run's children pass.
- `rlt validate --server` on both.
- A differential test: the door's property-test run files (tests/operator/test_door_properties.py); every one that
  `rlt validate` accepts is sent to the server as the RLTRun and as each child the operator renders, with
  dryRun=All; any refusal is a disagreement, named by field. 40 seeded examples in CI; a long run on demand:
      RLT_SERVER_DOOR_EXAMPLES=100000 RLT_SERVER_DOOR_SECONDS=540 KUBEBUILDER_ASSETS=... \
          python -m pytest -q -s tests/real_cluster/test_server_dry_run.py -k differential_the_door
  (past the time budget hypothesis still draws the remaining examples, doing nothing with them: minutes)
  Each disagreement found is kept in COUNTEREXAMPLES below.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml
from conftest import skip_without_assets
from kube_env import RLT, running_operator
from suite_helpers import EXAMPLES
from suite_helpers import wait_for as suite_wait_for

skip_without_assets()

from rlt.checks.validation import validate_spec  # noqa: E402
from rlt_operator import builders  # noqa: E402
from rlt_operator.apply import dry_run  # noqa: E402
from rlt_operator.cluster.kube import Kube  # noqa: E402

pytestmark = [pytest.mark.real_cluster, pytest.mark.xdist_group("real_cluster"), pytest.mark.timeout(1500)]

ROOT = Path(__file__).resolve().parents[2]
CRD = ROOT / "manifests" / "crd" / "rltruns.rlt.dev.yaml"
NS = "dry-run"


def wait_for(probe, what: str, timeout: float = 60.0):
    return suite_wait_for(probe, what, seconds=timeout, every=0.5)


@pytest.fixture(scope="module")
def server(cluster):
    """The RLTRun CRD (applied here when the chart's is not installed, removed again after), a namespace, and the
    PriorityClasses the examples name (a cluster's admin makes them; the pods' dry-run asks the Priority admission
    plugin, which refuses a pod whose class does not exist), removed again after."""
    ours = cluster.ensure_crd(CRD, "rltruns.rlt.dev")
    cluster.create_namespace(NS)  # with its default ServiceAccount: the pods are dry-run too
    classes = sorted(
        {
            str(doc["spec"].get("scheduling", {}).get("priorityClassName"))
            for path in EXAMPLES.glob("rltrun-*.yaml")
            for doc in yaml.safe_load_all(path.read_text())
            if doc and doc.get("spec", {}).get("scheduling", {}).get("priorityClassName")
        }
    )
    for name in classes:
        cluster.kubectl("create", "priorityclass", name, "--value=1000", check=False)
    import kubernetes

    kube = Kube(kubernetes.config.new_client_from_config(config_file=str(cluster.kubeconfig)))
    yield kube
    for name in classes:
        cluster.kubectl("delete", "priorityclass", name, check=False)
    if ours:
        cluster.kubectl("delete", "crd", "rltruns.rlt.dev", "--wait=false", check=False)


def tiny(name: str = "tiny", **spec: object) -> dict:
    doc = yaml.safe_load((EXAMPLES / "rltrun-tiny.yaml").read_text())
    doc["metadata"] = {"name": name, "namespace": NS}
    doc["spec"].update(copy.deepcopy(spec))
    return doc


def children_of(doc: dict, stage: str = "sft") -> dict[tuple[str, str], dict]:
    spec = validate_spec(doc["spec"], name=doc["metadata"]["name"], source="test")
    ref = builders.RunRef(name=doc["metadata"]["name"], namespace=NS, uid=str(uuid.uuid4()))
    return {(p, b["metadata"]["name"]): b for p, b in dry_run.stage_children(ref, spec, stage)}


# ------------------------------------------------------------------------------------ the map, on the real server

BUSY = tiny(
    env=[{"name": "A", "value": "1"}],
    scheduling={
        "tolerations": [{"key": "spot", "operator": "Exists", "effect": "NoSchedule"}],
        "nodeSelector": {"pool": "gpu"},
        "podAnnotations": {"team": "a"},
        "queueName": "q1",
        "priorityClassName": "high",
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [{"key": "k", "operator": "Exists"}]}]
                }
            }
        },
    },
    storage={"retentionPolicy": "Delete"},
)


def _pod(child: dict) -> dict:
    return child["spec"]["template"]["spec"]


def _user_env(child: dict) -> dict:
    return next(e for e in _pod(child)["containers"][0]["env"] if e["name"] == "A")


# (what, child, how the rendered child is broken, the run's field the refusal must name first). Not the image: the
# server checks a pod template's image hardly at all (" trainer:1 " passes a Job's dry-run on 1.36; only the pod
# create refuses it), so image references stay the offline door's.
EDITS = [
    (
        "tolerations",
        "jobs",
        lambda j: _pod(j)["tolerations"][0].update(tolerationSeconds=5),
        "spec.scheduling.tolerations[0]",
    ),
    (
        "resources",
        "jobs",
        lambda j: _pod(j)["containers"][0]["resources"]["requests"].update(cpu="-1"),
        "spec.resources.trainer.cpu",
    ),
    (
        "nodeSelector",
        "jobs",
        lambda j: _pod(j)["nodeSelector"].update({"bad key!": "x"}),
        "spec.scheduling.nodeSelector",
    ),
    (
        "affinity",
        "jobs",
        lambda j: _pod(j)["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"
        ][0]["matchExpressions"][0].update(operator="Bogus"),
        "spec.scheduling.affinity.nodeAffinity",
    ),
    (
        "env",
        "jobs",
        lambda j: _user_env(j).update(value=None, valueFrom={"fieldRef": {"fieldPath": "metadata.bogus"}}),
        "spec.env[0]",
    ),
    (
        "volumes",
        "jobs",
        lambda j: _pod(j)["volumes"][0]["persistentVolumeClaim"].update(claimName=""),
        "metadata.name",
    ),
    (
        "storage",
        "persistentvolumeclaims",
        lambda c: c["spec"]["resources"]["requests"].update(storage="-1Gi"),
        "spec.storage.size",
    ),
    (
        "labels",
        "jobs",
        lambda j: j["spec"]["template"]["metadata"]["labels"].update({"kueue.x-k8s.io/queue-name": "q1!"}),
        "spec.scheduling.queueName",
    ),
    (
        "annotations",
        "jobs",
        lambda j: j["spec"]["template"]["metadata"]["annotations"].update({"bad key!": "x"}),
        "spec.scheduling.podAnnotations",
    ),
    (
        "priorityClassName",
        "jobs",
        lambda j: _pod(j).update(priorityClassName="Bad_Name!"),
        "spec.scheduling.priorityClassName",
    ),
    ("names", "services", lambda s: s["metadata"].update(name="Bad_Name"), "metadata.name"),
]


@pytest.mark.parametrize("what, plural, edit, where", EDITS, ids=[e[0] for e in EDITS])
def test_the_servers_refusal_of_a_child_names_the_runs_field(server, what, plural, edit, where):
    spec = validate_spec(BUSY["spec"], name="tiny", source="test")
    children = children_of(BUSY)
    (key,) = [k for k in children if k[0] == plural and (plural != "services" or k[1] == "tiny-sft")]
    child = copy.deepcopy(children[key])
    edit(child)
    refused = dry_run.check(server, NS, spec, [(plural, child)])
    assert refused, f"the server accepted the broken {what} of {key}"
    line = refused[0].lines()[0]
    assert line.startswith(where), line
    assert server.list(plural, NS) == [] or all(
        i["metadata"]["name"] != child["metadata"]["name"] for i in server.list(plural, NS)
    ), "a dry-run stores nothing"


def test_every_child_of_every_stage_of_the_examples_passes_the_servers_dry_run(server):
    """The valid runs: each example's children, every enabled stage, all accepted (and none stored)."""
    for path in sorted(EXAMPLES.glob("rltrun-*.yaml")):
        doc = yaml.safe_load(path.read_text())
        spec = validate_spec(doc["spec"], name=doc["metadata"]["name"], source=str(path))
        ref = builders.RunRef(name=doc["metadata"]["name"], namespace=NS, uid=str(uuid.uuid4()))
        refused = dry_run.check(server, NS, spec, dry_run.run_children(ref, spec))
        assert refused == [], f"{path.name}: {[r.message for r in refused]}"
    assert server.list("jobs", NS) == []


def test_an_rdma_device_brings_ipc_lock_and_pod_security_baseline_refuses_it_naming_the_field(cluster, server):
    """A trainer given an RDMA device gets IPC_LOCK (NCCL pins its buffers): a namespace without Pod Security
    admits its pod; one that enforces "baseline" refuses it, naming the run's field that sets it (ipcLock), and
    admits it with ipcLock false."""
    doc = tiny(resources={"trainer": {"gpus": 1, "extra": {"rdma/rdma_shared_device_a": "1"}}})
    spec = validate_spec(doc["spec"], name="tiny", source="test")

    def refusals(ns: str) -> list[str]:
        ref = builders.RunRef(name="tiny", namespace=ns, uid=str(uuid.uuid4()))
        return [
            line
            for r in dry_run.check(server, ns, spec, dry_run.checked_children(ref, spec, "sft"))
            for line in r.lines()
        ]

    assert refusals(NS) == []
    strict = "dry-run-baseline"
    cluster.create_namespace(strict)
    cluster.kubectl("label", "namespace", strict, "pod-security.kubernetes.io/enforce=baseline", "--overwrite")
    (line,) = refusals(strict)
    assert "IPC_LOCK" in line and "against spec.resources.trainer.ipcLock" in line, line
    off = validate_spec(
        {**doc["spec"], "resources": {"trainer": {"gpus": 1, "ipcLock": False, "extra": {"rdma/x": "1"}}}}
    )
    ref = builders.RunRef(name="tiny", namespace=strict, uid=str(uuid.uuid4()))
    assert dry_run.check(server, strict, off, dry_run.checked_children(ref, off, "sft")) == [], (
        "ipcLock false: admitted"
    )


# ------------------------------------------------------------------------------------ the operator


@pytest.fixture(scope="module")
def operator(cluster, server, tmp_path_factory):
    work = tmp_path_factory.mktemp("dry-run-operator")
    with running_operator(cluster.kubeconfig, ["--namespace", NS], work, "dry-run-test", tail=30) as (proc, _):
        yield proc


def _get(cluster, *args: str) -> dict | None:
    import json

    r = cluster.kubectl("get", *args, "-n", NS, "-o", "json", check=False)
    return json.loads(r.stdout) if r.returncode == 0 else None


def _condition(cluster, run: str, type_: str) -> dict:
    st = (_get(cluster, "rltrun", run) or {}).get("status") or {}
    return next((c for c in st.get("conditions") or [] if c["type"] == type_), {})


# A value both doors accept that this cluster refuses: the offline door now applies the pod validator's rules that the
# differential run found (a bogus downward-API path is refused offline), so the server-only refusal is the cluster's
# own policy, as an admission policy of a real cluster would be: a ValidatingAdmissionPolicy (GA since 1.30) that
# answers 422 Invalid. A policy names no field, so the refusal names the child and the policy's words (the mapping
# of a named field back to the spec is test_the_servers_refusal_of_a_child_names_the_runs_field, above, on this server).
SERVER_ONLY = [{"name": "REFUSED_BY_POLICY", "value": "1"}]


def _refuse_env_by_policy(cluster, doc: dict) -> None:
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": "no-refused-env"},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {"apiGroups": ["batch"], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["jobs"]}
                ]
            },
            "validations": [
                {
                    "expression": "!object.spec.template.spec.containers.exists(c, has(c.env) && "
                    "c.env.exists(e, e.name == 'REFUSED_BY_POLICY'))",
                    "message": "REFUSED_BY_POLICY is not allowed on this cluster",
                    "reason": "Invalid",  # 422, as the pod validator's refusals; a policy names no field
                }
            ],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": "no-refused-env"},
        "spec": {"policyName": "no-refused-env", "validationActions": ["Deny"]},
    }
    cluster.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all([policy, binding]))
    probe = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "policy-probe", "namespace": NS}}
    probe["spec"] = {"template": {"spec": {"restartPolicy": "Never", "containers": [
        {"name": "c", "image": "busybox", "env": [{"name": "REFUSED_BY_POLICY", "value": "1"}]}]}}}  # fmt: skip

    def refused() -> bool:  # the policy takes effect a moment after it is created
        r = cluster.kubectl("create", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump(probe), check=False)
        return r.returncode != 0 and "REFUSED_BY_POLICY" in r.stderr

    wait_for(refused, "the admission policy in force", timeout=60)


def test_a_run_whose_child_the_server_refuses_is_held_and_says_why(cluster, server, operator, tmp_path):
    doc = tiny("refused", env=SERVER_ONLY)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(doc))
    _refuse_env_by_policy(cluster, doc)
    offline = subprocess.run([*RLT, "validate", "--no-data", "--no-plan", str(path)], capture_output=True, text=True)
    assert offline.returncode == 0, f"the offline door refuses it now: pick another value\n{offline.stderr}"
    cluster.kubectl("apply", "--server-side", "-f", "-", stdin=yaml.safe_dump(doc))
    cond = wait_for(
        lambda: (c := _condition(cluster, "refused", "ChildrenValid")).get("status") == "False" and c,
        "ChildrenValid False",
        timeout=90,
    )
    # a policy's 422 names no field but the policy: the cluster refuses it (not a field of the run to fix)
    assert cond["reason"] == "ChildRefused" and "REFUSED_BY_POLICY is not allowed" in cond["message"], cond
    assert cond["message"].startswith("ValidatingAdmissionPolicy no-refused-env"), cond
    assert "jobs/refused-sft" in cond["message"], cond
    time.sleep(6)  # a resync later: still nothing
    status = _get(cluster, "rltrun", "refused")["status"]
    assert status["phase"] != "Running" and status["reason"] == "ChildRefused", status
    for kind in ("jobs", "configmaps", "pvc", "pods"):
        items = (_get(cluster, kind, "-l", "rlt.dev/run=refused") or {}).get("items")
        assert items == [], f"{kind} created beside a refused child: {items}"
    events = _get(cluster, "events", "--field-selector", "involvedObject.name=refused,reason=ChildRefused")
    assert events and events["items"] and events["items"][0]["type"] == "Warning"
    assert "REFUSED_BY_POLICY is not allowed" in events["items"][0]["message"]
    # rlt validate --server says the same, and exits 1
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
    cmd = [*RLT, "validate", "--no-data", "--no-plan", "--server", str(path)]
    online = subprocess.run(cmd, capture_output=True, text=True, env=env)
    assert online.returncode == 1 and "REFUSED_BY_POLICY is not allowed" in online.stderr, online.stderr
    cluster.kubectl("delete", "rltrun", "refused", "-n", NS)
    cluster.kubectl("delete", "validatingadmissionpolicybinding,validatingadmissionpolicy", "no-refused-env")


def test_a_valid_runs_children_pass_and_are_created(cluster, server, operator, tmp_path):
    doc = tiny("valid", storage={"retentionPolicy": "Delete"})
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(doc))
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
    online = subprocess.run(
        [*RLT, "validate", "--no-data", "--no-plan", "--server", str(path)], capture_output=True, text=True, env=env
    )
    assert online.returncode == 0, online.stderr
    cluster.kubectl("apply", "--server-side", "-f", "-", stdin=yaml.safe_dump(doc))
    cond = wait_for(
        lambda: (c := _condition(cluster, "valid", "ChildrenValid")).get("status") == "True" and c,
        "ChildrenValid True",
        timeout=90,
    )
    assert "stage sft" in cond["message"]
    wait_for(lambda: _get(cluster, "job", "valid-sft"), "the Job created")
    cluster.kubectl("delete", "rltrun", "valid", "-n", NS)


# ------------------------------------------------------------------------------------ the differential test

sys.path.insert(0, str(ROOT / "tests" / "operator"))  # the door's property-test strategies
EXAMPLES_ASKED = int(os.environ.get("RLT_SERVER_DOOR_EXAMPLES", "0"))
SECONDS = float(os.environ.get("RLT_SERVER_DOOR_SECONDS", "0")) or None  # a long run's time budget


def disagreements(server, doc: dict, folder: Path) -> tuple[bool, list[str]]:
    """(accepted by `rlt validate`, what the server refuses of it): the RLTRun itself and every child the operator
    renders from it, each sent with dryRun=All. One line per refused field, the run's field first."""
    from test_door_properties import door

    accepted, _, read = door(doc, folder)
    if not accepted or not isinstance(read, dict):
        return False, []
    read = copy.deepcopy(read)
    read.setdefault("metadata", {})["namespace"] = NS
    name = read["metadata"]["name"]
    out = []
    code, answer = server.dry_run_create("rltruns", NS, read)
    if code not in (200, 201):
        out.append(f"RLTRun (HTTP {code}): {answer.get('message') or answer}"[:500])
        return True, out
    try:
        spec = validate_spec(read["spec"], name=name, source="differential")
    except Exception as err:  # noqa: BLE001 - the operator's reading must accept what rlt validate did
        return True, [f"the operator's reading refuses it: {err}"[:500]]
    ref = builders.RunRef(name=name, namespace=NS, uid=str(uuid.uuid4()))
    refused = dry_run.check(server, NS, spec, dry_run.run_children(ref, spec), dry_run.CLI_CODES)
    return True, [line for r in refused for line in r.lines()]


@pytest.fixture
def door_folder(tmp_path):
    here = Path.cwd()
    os.chdir(ROOT)  # the examples name their files from the repository root
    yield tmp_path
    os.chdir(here)


def test_differential_the_door_and_the_real_server_agree_on_generated_run_files(server, door_folder):
    hypothesis = pytest.importorskip("hypothesis")
    from hypothesis import HealthCheck, given, settings
    from test_door_properties import run_documents

    start, counts, found = time.monotonic(), {"examples": 0, "accepted": 0}, []

    @settings(
        max_examples=EXAMPLES_ASKED or 40,
        derandomize=not EXAMPLES_ASKED,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(run_documents())
    def examples(doc):
        if SECONDS and time.monotonic() - start > SECONDS:
            return
        counts["examples"] += 1
        accepted, lines = disagreements(server, doc, door_folder)
        counts["accepted"] += accepted
        if lines:
            found.append((lines, doc))
        if EXAMPLES_ASKED and counts["examples"] % 250 == 0:
            print(f"differential: {counts} {len(found)} disagreements, {time.monotonic() - start:.0f}s", flush=True)

    assert hypothesis is not None
    examples()
    print(f"\ndifferential: {counts['examples']} examples, {counts['accepted']} accepted by rlt validate, "
          f"{len(found)} disagreements with the real server, {time.monotonic() - start:.0f}s")  # fmt: skip
    for lines, doc in found[:20]:
        print("DISAGREEMENT", lines[:3], "\n", yaml.safe_dump(doc.get("spec"), width=200)[:1500])
    assert not found, f"{len(found)} run files rlt validate accepts and the server refuses, e.g. {found[0][0]}"


# Each disagreement found (by the differential run: none in 16,934 examples so far; or by hand), as a run file's
# spec changes on the tiny example: the door and the server agree on it now (fixed), or it is a known one (xfail,
# strict: it fails loudly once the door refuses it, and then moves to the fixed ones).
COUNTEREXAMPLES: list[tuple[str, dict, str]] = [
    # fixed: rlt.spec.pod_rules refuses the downward-API paths the pod validator refuses
    (
        "downward-api-field-path",
        {"env": [{"name": "W", "valueFrom": {"fieldRef": {"fieldPath": "metadata.bogus"}}}]},
        "",
    ),
]


@pytest.mark.parametrize(
    "case, spec",
    [
        pytest.param(c, sp, id=c, marks=[pytest.mark.xfail(strict=True, reason=known)] if known else [])
        for c, sp, known in COUNTEREXAMPLES
    ],
)
def test_a_counterexample_of_the_differential_run(server, door_folder, case, spec):
    accepted, lines = disagreements(server, tiny(case, **spec), door_folder)
    assert not lines, f"rlt validate accepts it (accepted={accepted}), the server refuses: {lines}"
