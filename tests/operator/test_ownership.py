"""The operator writes and deletes only its own objects, and a write the API server refuses is on the run.

Kopf + the real handlers against the emulated API (kmock). Foreign objects: objects of every child kind that carry
a child's name but not the run's owner reference (someone else's), created before the run.
"""

from __future__ import annotations

import asyncio
import re

import pytest
from op_harness import NS, PATHS, example, server_mode

from rlt_operator import builders
from rlt_operator.apply.writes import BACKOFF_CAP, BACKOFF_FIRST, ChildWrites, rejected

pytestmark = pytest.mark.timeout(60)


def _foreign(plural: str, name: str) -> dict:
    """A minimal valid object of the kind, labelled as someone else's."""
    kind = {
        "configmaps": ("v1", "ConfigMap", {"data": {"theirs": "yes"}}),
        "persistentvolumeclaims": (
            "v1",
            "PersistentVolumeClaim",
            {"spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}},
        ),
        "services": ("v1", "Service", {"spec": {"ports": [{"port": 80}]}}),
        "statefulsets": ("apps/v1", "StatefulSet", {"spec": {"replicas": 1, "serviceName": "theirs"}}),
        "jobs": ("batch/v1", "Job", {"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "x"}]}}}}),
        "networkpolicies": ("networking.k8s.io/v1", "NetworkPolicy", {"spec": {"podSelector": {}}}),
    }[plural]
    return {
        "apiVersion": kind[0],
        "kind": kind[1],
        "metadata": {"name": name, "labels": {"team": "someone-else"}},
        **kind[2],
    }


# (foreign object, the run that wants that name: sft first, or rl with generators first)
FIRST_STAGE = example(**{"spec.storage": {"retentionPolicy": "Delete"}})
GENERATORS_FIRST = server_mode(example(**{"spec.stages.sft.enabled": False}))
GENERATORS_FIRST["spec"]["storage"]["retentionPolicy"] = "Delete"
CASES = [
    ("configmaps", "tiny-config", FIRST_STAGE),
    ("persistentvolumeclaims", "tiny-data", FIRST_STAGE),
    ("jobs", "tiny-sft", FIRST_STAGE),
    ("services", "tiny-sft", FIRST_STAGE),
    ("statefulsets", "tiny-generator", GENERATORS_FIRST),
    ("services", "tiny-generator", GENERATORS_FIRST),
    ("networkpolicies", builders.generator_policy_name("tiny"), GENERATORS_FIRST),
]


def _written(condition_type: str, reason: str):
    def check(st):
        return any(
            c["type"] == condition_type and c["status"] == "False" and c["reason"] == reason
            for c in st.get("conditions") or []
        )

    return check


@pytest.mark.parametrize("plural, name, doc", CASES, ids=[f"{c[0]}/{c[1]}" for c in CASES])
async def test_a_foreign_object_with_a_childs_name_is_a_conflict_never_written_nor_deleted(harness, plural, name, doc):
    theirs = await harness.call("POST", PATHS[plural].format(ns=NS), _foreign(plural, name))
    await harness.start_operator()
    await harness.create_run(doc)

    # found by the dry-run before any child is created (rlt_operator.apply.dry_run): the run holds with nothing made
    st = await harness.wait_status("tiny", _written("ChildrenValid", "NameConflict"), "NameConflict on the run")
    cond = next(c for c in st["conditions"] if c["type"] == "ChildrenValid")
    assert f"{plural}/{name} is someone else's object" in cond["message"] and st["reason"] == "NameConflict", st
    events = await harness.wait(
        lambda: _events_with(harness, "NameConflict"), "a NameConflict Warning Event", timeout=10
    )
    assert f"{plural}/{name}" in events[0]["message"] and events[0]["type"] == "Warning"
    await asyncio.sleep(1.0)  # a few more reconciles
    now = await harness.get(plural, name)
    assert now["metadata"].get("ownerReferences") is None, "adopted someone else's object"
    assert now["metadata"]["labels"] == {"team": "someone-else"}
    assert now["metadata"]["resourceVersion"] == theirs["metadata"]["resourceVersion"], "written into"
    # Nothing that would run pods against someone else's object (or be someone else's) is created.
    ours = [
        f"{p}/{o['metadata']['name']}"
        for p in ("configmaps", "services", "jobs", "statefulsets", "networkpolicies", "persistentvolumeclaims")
        for o in await harness.list(p, "rlt.dev/run=tiny")
    ]
    assert ours == [], f"a child was created beside a name conflict: {ours}"

    await harness.delete_run("tiny")
    await harness.wait_gone("rltruns", "tiny")
    assert await harness.get(plural, name) is not None, f"deleting the run deleted someone else's {plural}/{name}"
    left = [
        f"{p}/{o['metadata']['name']}"
        for p in ("configmaps", "services", "jobs", "statefulsets", "networkpolicies", "persistentvolumeclaims")
        for o in await harness.list(p, "rlt.dev/run=tiny")
    ]
    assert left == [], f"the run's own children left behind: {left}"


async def _events_with(harness, reason):
    found = [e for e in await harness.events("tiny") if e["reason"] == reason]
    return found or None


async def test_an_earlier_runs_labelled_child_is_a_conflict_and_survives_deletion(harness):
    """A ConfigMap with the run's label but another run's owner UID (a leftover of an earlier run of the same name,
    or a copy): never patched (the spec's run.yaml is not written into it) nor deleted."""
    other = _foreign("configmaps", "tiny-config")
    other["metadata"]["labels"] = {"rlt.dev/run": "tiny", "rlt.dev/role": "config"}
    other["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "rlt.dev/v1alpha1",
            "kind": "RLTRun",
            "name": "tiny",
            "uid": "an-earlier-run",
            "controller": True,
        }
    ]
    theirs = await harness.call("POST", PATHS["configmaps"].format(ns=NS), other)
    await harness.start_operator()
    await harness.create_run(example())
    await harness.wait_status("tiny", _written("ChildrenWritten", "NameConflict"), "NameConflict on the run")
    await asyncio.sleep(1.0)
    assert (await harness.get("configmaps", "tiny-config"))["metadata"]["resourceVersion"] == theirs["metadata"][
        "resourceVersion"
    ]
    await harness.delete_run("tiny")
    await harness.wait_gone("rltruns", "tiny")
    assert await harness.get("configmaps", "tiny-config") is not None


async def test_a_refused_child_write_is_a_condition_and_event_with_the_servers_message(harness):
    """A 422 on the trainer Job (a real server's answer to an invalid pass-through toleration): the status is still
    written, with the server's message in ChildrenWritten and the run's reason, and a Warning Event; once the server
    accepts the Job, the condition turns True."""
    message = 'Job.batch "tiny-sft" is invalid: spec.template.spec.tolerations[0].operator: Unsupported value: "Exist"'
    status = {"apiVersion": "v1", "kind": "Status", "status": "Failure", "reason": "Invalid", "code": 422}
    refused = (
        # the real create only: the dry-run before it passes (a refused dry-run is test_dry_run's)
        harness.cluster["post", re.compile(r".*/namespaces/default/jobs$"), lambda r: "dryRun" not in r.params][:1]
        << 422
        << {
            **status,
            "message": message,
        }
    )
    await harness.start_operator()
    await harness.create_run(example())
    st = await harness.wait_status("tiny", _written("ChildrenWritten", "ChildRejected"), "ChildRejected on the run")
    cond = next(c for c in st["conditions"] if c["type"] == "ChildrenWritten")
    assert message in cond["message"] and "HTTP 422" in cond["message"] and "jobs/tiny-sft" in cond["message"]
    assert st.get("phase") and st["reason"] == "ChildRejected" and message in st["message"]
    assert (await harness.get("configmaps", "tiny-config")) is not None, "the other children were written"
    events = await harness.wait(lambda: _events_with(harness, "ChildRejected"), "a ChildRejected Event", timeout=10)
    assert message in events[0]["message"] and events[0]["type"] == "Warning"
    # After the refusal and its back-off, the Job is created and the condition clears.
    await harness.wait_object("jobs", "tiny-sft", timeout=15)
    await harness.wait_status(
        "tiny",
        lambda s: any(c["type"] == "ChildrenWritten" and c["status"] == "True" for c in s.get("conditions") or []),
        "ChildrenWritten True",
    )
    assert len(list(refused)) == 1
    assert len([e for e in await harness.events("tiny") if e["reason"] == "ChildRejected"]) == 1, "one Event"


def test_refused_writes_back_off_exponentially_to_a_cap():
    writes = ChildWrites()
    p = rejected("create", "jobs", "tiny-sft", 422, "invalid")
    waits = []
    for _ in range(8):
        assert writes.failed(p, 100.0) == (not waits), "an Event only for a new problem"
        waits.append(writes.next_try[p.key] - 100.0)
    assert waits[:4] == [BACKOFF_FIRST, BACKOFF_FIRST * 2, BACKOFF_FIRST * 4, BACKOFF_FIRST * 8]
    assert waits[-1] == BACKOFF_CAP and not writes.due(p.key, 100.0 + BACKOFF_CAP - 1)
    writes.succeeded(p.key)
    assert writes.due(p.key, 0.0) and writes.problems == {}


async def test_the_operators_writes_identify_it(harness):
    """User agent and field manager of every child write and of the status: rlt-operator, not the client library's
    OpenAPI-Generator/<version>/python (what `managedFields` and audit logs would show on a real cluster)."""
    from rlt import __version__

    await harness.start_operator()
    await harness.create_run(example())
    await harness.wait_object("jobs", "tiny-sft")
    await harness.wait_status("tiny", lambda s: bool(s.get("phase")), "a status")
    writes = [
        r
        for r in harness.cluster._requests
        if r.method in ("POST", "PATCH") and ("/rltruns/tiny/status" in r.url.path or r.url.path.endswith("/jobs"))
    ]
    assert {r.url.path.rsplit("/", 1)[-1] for r in writes} >= {"status", "jobs"}
    for r in writes:
        assert r.headers.get("User-Agent") == f"rlt-operator/{__version__}", r.headers.get("User-Agent")
        assert r.params.get("fieldManager") == "rlt-operator", r.url
