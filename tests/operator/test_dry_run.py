"""The run's children dry-run on the API server before any is created (rlt_operator.apply.dry_run).

Table tests of the map from a child's field (as the API server names it) back to the run's field, and the operator
with the emulated API (kmock): a refused dry-run holds every create, names the spec field, posts an Event; the
sandbox honours dryRun=All (stores nothing). The pods and the cluster's refusals (quota, LimitRange, policy, RBAC): test_admission.py. The real server's
refusals: tests/real_cluster/test_server_dry_run.py and test_server_admission.py.
"""

from __future__ import annotations

import copy
import datetime as dt

import pytest
from op_harness import NS, PATHS, example, server_mode

from rlt.checks.validation import validate_spec
from rlt.contract.exitcodes import ExitCode
from rlt_operator import builders
from rlt_operator.apply import admission, dry_run

pytestmark = pytest.mark.timeout(60)

REF = builders.RunRef(name="tiny", namespace="team", uid="u-1")
NOW = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)


def _spec(doc: dict):
    return validate_spec(doc["spec"], name="tiny", source="test")


def _busy() -> dict:
    """The tiny run with every user-set field the children carry (server mode: generators too)."""
    doc = server_mode(example())
    doc["spec"]["env"] = [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]
    doc["spec"]["scheduling"] = {
        "tolerations": [{"key": "spot", "operator": "Exists", "effect": "NoSchedule"}],
        "nodeSelector": {"pool": "gpu"},
        "podAnnotations": {"team": "a"},
        "queueName": "q1",
        "imagePullSecrets": ["regcred"],
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [{"key": "k", "operator": "Exists"}]}]
                }
            }
        },
    }
    doc["spec"]["hfTokenSecret"] = {"name": "hf", "key": "token"}
    return doc


BUSY = _busy()
SPEC = _spec(BUSY)
CHILDREN = {(p, b["metadata"]["name"]): b for p, b in dry_run.stage_children(REF, SPEC, "rl")}
JOB, STS = CHILDREN[("jobs", "tiny-rl")], CHILDREN[("statefulsets", "tiny-generator")]


def _env_index(child: dict, name: str, container: str = "containers") -> int:
    env = child["spec"]["template"]["spec"][container][0]["env"]
    return max(i for i, e in enumerate(env) if e["name"] == name)


# (child kind, child field as the API server names it, the run's field)
TABLE = [
    ("jobs", "spec.template.spec.containers[0].resources.requests[cpu]", "spec.resources.trainer.cpu"),
    ("jobs", "spec.template.spec.containers[0].resources.limits[memory]", "spec.resources.trainer.memoryLimit"),
    ("jobs", "spec.template.spec.containers[0].resources.requests[nvidia.com/gpu]", "spec.resources.trainer.gpus"),
    (
        "jobs",
        "spec.template.spec.containers[0].resources.requests[example.com/fpga]",
        "spec.resources.trainer.extra[example.com/fpga]",
    ),  # noqa: E501
    ("statefulsets", "spec.template.spec.containers[0].resources.requests[memory]", "spec.resources.generator.memory"),  # noqa: E501
    ("jobs", "spec.template.spec.tolerations[0].tolerationSeconds", "spec.scheduling.tolerations[0].tolerationSeconds"),  # noqa: E501
    ("statefulsets", "spec.template.spec.nodeSelector", "spec.scheduling.nodeSelector"),
    (
        "jobs",
        "spec.template.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].operator",
        "spec.scheduling.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].operator",
    ),  # noqa: E501
    ("jobs", "spec.template.spec.imagePullSecrets[0].name", "spec.scheduling.imagePullSecrets[0].name"),
    ("jobs", "spec.template.spec.containers[0].image", "spec.images.trainer"),
    ("jobs", "spec.template.spec.initContainers[0].image", "spec.images.trainer"),
    ("statefulsets", "spec.template.spec.containers[0].image", "spec.images.generator"),
    ("statefulsets", "spec.template.spec.containers[0].imagePullPolicy", "spec.images.pullPolicy"),
    ("jobs", f"spec.template.spec.containers[0].env[{_env_index(JOB, 'B')}].value", "spec.env[1].value"),
    ("statefulsets", f"spec.template.spec.containers[0].env[{_env_index(STS, 'A')}].name", "spec.env[0].name"),
    (
        "jobs",
        f"spec.template.spec.initContainers[0].env[{_env_index(JOB, 'HF_TOKEN', 'initContainers')}].valueFrom.secretKeyRef.name",
        "spec.hfTokenSecret.name",
    ),  # noqa: E501
    ("jobs", "spec.template.spec.volumes[1].emptyDir.sizeLimit", "spec.resources.trainer.sharedMemory"),
    ("statefulsets", "spec.template.spec.volumes[0].persistentVolumeClaim.claimName", "metadata.name"),
    ("jobs", "spec.template.metadata.annotations", "spec.scheduling.podAnnotations"),
    ("jobs", "spec.template.annotations", "spec.scheduling.podAnnotations"),  # as kube-apiserver 1.36 names it
    ("jobs", "spec.template.spec.subdomain", "metadata.name"),
    ("jobs", "spec.completions", "spec.resources.trainer.nodes"),
    ("statefulsets", "spec.replicas", "spec.resources.generator.replicas"),
    ("jobs", "metadata.name", "metadata.name"),
    ("persistentvolumeclaims", "spec.resources.requests[storage]", "spec.storage.size"),
    ("persistentvolumeclaims", "spec.accessModes", "spec.storage.accessMode"),
    ("configmaps", "data", "spec (the whole spec: the pods' config)"),
    ("jobs", "spec.template.spec.securityContext.runAsUser", dry_run.OPERATOR),
]


@pytest.mark.parametrize("plural, path, where", TABLE, ids=[f"{t[0]}:{t[1]}" for t in TABLE])
def test_a_childs_field_maps_back_to_the_runs_field(plural, path, where):
    child = JOB if plural == "jobs" else STS if plural == "statefulsets" else {}
    assert dry_run.spec_field(plural, child, path, SPEC) == where


def test_a_label_refusal_names_the_queue_when_its_value_is_the_queues():
    says = 'Invalid value: "q1": a valid label must be...'
    assert dry_run.spec_field("jobs", JOB, "metadata.labels", SPEC, says) == "spec.scheduling.queueName"
    assert dry_run.spec_field("jobs", JOB, "metadata.labels", SPEC, 'Invalid value: "tiny-"') == "metadata.name"
    assert dry_run.spec_field("jobs", JOB, "spec.template.labels", SPEC, says) == "spec.scheduling.queueName"


def test_the_stage_renders_what_decide_creates():
    kinds = [(p, b["metadata"]["name"]) for p, b in dry_run.stage_children(REF, SPEC, "rl")]
    assert ("statefulsets", "tiny-generator") in kinds and ("jobs", "tiny-rl") in kinds
    sft = [(p, b["metadata"]["name"]) for p, b in dry_run.stage_children(REF, SPEC, "sft")]
    assert ("statefulsets", "tiny-generator") not in sft and ("jobs", "tiny-sft") in sft
    every = dry_run.run_children(REF, SPEC)
    assert ("jobs", "tiny-distill") in [(p, b["metadata"]["name"]) for p, b in every]


def test_a_servers_status_becomes_one_line_per_field_naming_the_spec_field():
    answer = {
        "kind": "Status",
        "code": 422,
        "message": 'Job.batch "tiny-rl" is invalid: [...]',
        "details": {
            "causes": [
                {
                    "reason": "FieldValueInvalid",
                    "message": "Invalid value: -1: must be greater than or equal to 0",
                    "field": "spec.template.spec.tolerations[0].tolerationSeconds",
                }
            ]
        },
    }
    r = dry_run.refusal("jobs", JOB, 422, answer, SPEC)
    (line,) = r.lines()
    assert line.startswith("spec.scheduling.tolerations[0].tolerationSeconds: Invalid value: -1")
    assert "jobs/tiny-rl at spec.template.spec.tolerations[0].tolerationSeconds" in line


class _Server:
    """A stand-in runner for the pure gate: answers from a table (the HTTP path is kmock's and the real server's)."""

    def __init__(self, answers: dict[str, tuple[int, dict]]):
        self.answers, self.sent = answers, []

    def dry_run_create(self, plural, namespace, manifest):
        self.sent.append((plural, manifest["metadata"]["name"]))
        return self.answers.get(plural, (201, manifest))


async def test_the_gate_holds_every_create_while_a_child_is_refused_and_checks_once_per_stage():
    from rlt_operator.status.decision import Action

    bad = {"message": "bad", "details": {"causes": [{"field": "spec.template.spec.nodeSelector", "message": "no"}]}}
    server, memory = _Server({"jobs": (422, bad)}), dry_run.ChildrenCheck()
    actions = [Action("create", "configmaps", "tiny-config", {}), Action("delete", "jobs", "old")]
    decided = {"stage": "sft", "restarts": 0}
    kept, events = await dry_run.gate(server, REF, BUSY["spec"], decided, 1, actions, memory, 0.0)
    assert [a.verb for a in kept] == ["delete"], "no create while refused; deletes go on"
    assert events == [("Warning", dry_run.REASON, memory.refusals[0].message)]
    assert "spec.scheduling.nodeSelector: no" in events[0][2]
    sent = len(server.sent)
    assert ("pods", "tiny-sft" + admission.POD_SUFFIX) in server.sent, "the Job's pod is asked too"
    kept, events = await dry_run.gate(server, REF, BUSY["spec"], decided, 1, actions, memory, 1.0)
    assert len(server.sent) == sent and events == [] and [a.verb for a in kept] == ["delete"], "once, then quiet"
    assert memory.requeue(1.0) == pytest.approx(1.0), "the reconcile comes back when the check is due"
    # back-off: again 2 s after the first refusal, then 4 s after the second (doubling, capped)
    await dry_run.gate(server, REF, BUSY["spec"], decided, 1, actions, memory, 2.0)
    assert len(server.sent) == 2 * sent, "a refusal is checked again after its back-off"
    await dry_run.gate(server, REF, BUSY["spec"], decided, 1, actions, memory, 5.9)
    assert len(server.sent) == 2 * sent and memory.requeue(5.9) == pytest.approx(0.1)
    await dry_run.gate(server, REF, BUSY["spec"], decided, 1, actions, memory, 6.0)
    assert len(server.sent) == 3 * sent
    ok = _Server({})
    kept, _ = await dry_run.gate(ok, REF, BUSY["spec"], decided, 2, actions, memory, 6.5)  # a new generation
    assert kept == actions and memory.refusals == [] and memory.requeue(6.5) is None
    status = dry_run.with_condition({"phase": "Pending", "stage": "sft"}, memory, NOW)
    assert [(c["type"], c["status"]) for c in status["conditions"] if c["type"] == "ChildrenValid"] == [
        ("ChildrenValid", "True")
    ]


async def test_the_gate_asks_about_the_trainer_shape_the_gang_is_created_with():
    """A trainer edited to 4 GPUs after the stage's checkpoint keeps its 8 (status.trainerShape): the dry-run asks
    about the 8-GPU pod decide creates, not the 4-GPU one the spec names (a quota may allow one and not the other)."""
    from rlt_operator.status.decision import Action

    doc = example(**{"spec.resources": {"trainer": {"gpus": 4}}})
    doc["spec"]["stages"]["rl"]["perDeviceBatchSize"] = 1  # rl's 8 completions over 4 (or the kept 8) processes
    doc["spec"]["stages"]["sft"].update(batchSize=8, perDeviceBatchSize=1)
    server, memory = _Server({}), dry_run.ChildrenCheck()
    sent: list[dict] = []
    answer = server.dry_run_create
    server.dry_run_create = lambda plural, ns, manifest: (sent.append(manifest), answer(plural, ns, manifest))[1]
    decided = {"stage": "rl", "restarts": 1, "trainerShape": {"stage": "rl", "nodes": 1, "gpus": 8}}
    await dry_run.gate(server, REF, doc["spec"], decided, 2, [Action("create", "jobs", "tiny-rl", {})], memory, 0.0)
    pod = next(m for m in sent if m["kind"] == "Pod" and m["metadata"]["name"].startswith("tiny-rl"))
    assert pod["spec"]["containers"][0]["resources"]["limits"][builders.GPU] == "8"


# --------------------------------------------------------------------------------------------- with kmock


async def test_the_sandbox_stores_nothing_on_a_dry_run_create(harness):
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "probe"}, "data": {"a": "b"}}
    path = PATHS["configmaps"].format(ns=NS)
    answer = await harness.call("POST", f"{path}?dryRun=All", cm)
    assert answer["metadata"]["name"] == "probe" and answer["metadata"].get("uid")
    assert await harness.get("configmaps", "probe") is None, "a dry-run create is stored nowhere"
    await harness.call("POST", path, cm)
    with pytest.raises(AssertionError, match="409"):
        await harness.call("POST", f"{path}?dryRun=All", cm)  # the server's answer for a taken name


async def test_a_refused_dry_run_holds_the_run_naming_the_spec_field_and_creates_nothing(harness):
    import re

    cause = {
        "reason": "FieldValueNotSupported",
        "message": 'Unsupported value: "Exist": supported values: "Equal", "Exists"',
        "field": "spec.template.spec.tolerations[0].operator",
    }
    status = {"apiVersion": "v1", "kind": "Status", "status": "Failure", "reason": "Invalid", "code": 422}
    dry_runs_of_jobs = harness.cluster["post", re.compile(r".*/namespaces/default/jobs$"), {"dryRun": "All"}]
    refusing = (
        dry_runs_of_jobs
        << 422
        << {**status, "message": 'Job.batch "tiny-sft" is invalid', "details": {"causes": [cause]}}
    )
    await harness.start_operator()
    await harness.create_run(example())

    def invalid(st):
        return any(c["type"] == "ChildrenValid" and c["status"] == "False" for c in st.get("conditions") or [])

    st = await harness.wait_status("tiny", invalid, "ChildrenValid False")
    cond = next(c for c in st["conditions"] if c["type"] == "ChildrenValid")
    assert cond["reason"] == "ChildInvalid" and cond["message"].startswith("spec.scheduling.tolerations[0].operator")
    assert "jobs/tiny-sft" in cond["message"] and st["reason"] == "ChildInvalid" and st["phase"] == "Pending"
    ready = next(c for c in st["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "False" and ready["reason"] == "ChildInvalid"
    events = await harness.wait(lambda: _events_with(harness, "ChildInvalid"), "a ChildInvalid Event", timeout=10)
    assert events[0]["type"] == "Warning" and "spec.scheduling.tolerations[0].operator" in events[0]["message"]
    for plural, name in (("configmaps", "tiny-config"), ("persistentvolumeclaims", "tiny-data"), ("jobs", "tiny-sft")):
        assert await harness.get(plural, name) is None, f"{plural}/{name} created beside a refused child"
    assert await harness.list("pods") == []
    assert len(list(refusing)) >= 1, "the refusal came from the dry-run"


async def test_a_valid_run_passes_the_dry_run_and_its_children_are_created(harness):
    await harness.start_operator()
    doc = copy.deepcopy(example())
    await harness.create_run(doc)
    await harness.wait_object("jobs", "tiny-sft")

    def valid(st):
        return any(c["type"] == "ChildrenValid" and c["status"] == "True" for c in st.get("conditions") or [])

    st = await harness.wait_status("tiny", valid, "ChildrenValid True")
    assert "stage sft" in next(c for c in st["conditions"] if c["type"] == "ChildrenValid")["message"]


async def _events_with(harness, reason: str) -> list[dict]:
    return [e for e in await harness.events("tiny") if e.get("reason") == reason]


async def test_rlt_validate_server_names_the_spec_field_and_exits_1(harness, tmp_path, monkeypatch, capsys):
    import asyncio
    import os
    import re

    import yaml

    from rlt.cli import main as rlt_main

    kubeconfig = os.environ["KUBECONFIG"]  # the harness's, set by tests/operator/conftest.py at import
    # The client library fixes its default kubeconfig path when first imported: not while this test points
    # KUBECONFIG elsewhere, or the operators of later tests in this process could not log in.
    import kubernetes.config  # noqa: F401

    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(example()))
    argv = ["validate", "--no-data", "--no-plan", "--server", str(path)]
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "none"))
    assert await asyncio.to_thread(rlt_main, argv) == ExitCode.UNAVAILABLE  # 69: no verdict, neither ok nor INVALID
    assert f"{path}: NOT CHECKED: --server: no cluster to ask" in capsys.readouterr().err
    monkeypatch.setenv("KUBECONFIG", kubeconfig)
    assert await asyncio.to_thread(rlt_main, argv) == 0, capsys.readouterr().err
    assert await harness.list("jobs") == [], "validate --server creates nothing"
    cause = {"field": "spec.template.spec.nodeSelector", "message": 'Invalid value: "bad key!"'}
    status = {"kind": "Status", "status": "Failure", "reason": "Invalid", "code": 422, "message": "invalid"}
    jobs = harness.cluster["post", re.compile(r".*/namespaces/default/jobs$"), {"dryRun": "All"}]
    refusing = jobs << 422 << {**status, "details": {"causes": [cause]}}
    capsys.readouterr()
    assert await asyncio.to_thread(rlt_main, argv) == 1
    err = capsys.readouterr().err
    assert "INVALID" in err and 'spec.scheduling.nodeSelector: Invalid value: "bad key!"' in err, err
    assert "jobs/tiny-sft" in err and len(list(refusing)) >= 1


def test_a_server_that_does_not_answer_is_no_verdict_on_the_run():
    """`rlt validate --server` against a server that refuses the connection: NotChecked (exit 69), not INVALID."""
    from rlt.checks.validation import NotChecked
    from rlt.spec.loading import parse_run
    from rlt_operator.apply.server_check import server_problems

    class Unreachable:  # a hand-written stand-in (a mock) for a Kube whose API server refuses every connection
        def __getattr__(self, name):
            def call(*args, **kwargs):
                raise ConnectionRefusedError(111, "Connection refused")

            return call

    with pytest.raises(NotChecked, match=r"--server: the API server did not answer \(ConnectionRefusedError"):
        server_problems([parse_run(example())], runner=Unreachable())


def test_a_run_invalid_in_the_pods_is_said_so_with_no_server_to_ask(tmp_path, monkeypatch, capsys):
    """No cluster to ask is no verdict (exit 69) only for a run nothing else refuses: a relative dataset path, which
    no pod can read, keeps the run INVALID (exit 1), the missing server said beside it."""
    import kubernetes.config  # noqa: F401 - fixes its default kubeconfig path before KUBECONFIG points elsewhere
    import yaml

    from rlt.cli import main as rlt_main

    doc = example()
    doc["spec"]["dataset"] = {"source": "./rows.jsonl"}
    (tmp_path / "rows.jsonl").write_text('{"question": "q", "solution": "s", "reasoning_trace": "t"}\n' * 8)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(doc))
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "none"))
    assert rlt_main(["validate", "--no-data", "--no-plan", "--server", str(path)]) == 1
    err = capsys.readouterr().err
    assert f"{path}: INVALID" in err and "spec.dataset.source" in err and "--server: no cluster to ask" in err
