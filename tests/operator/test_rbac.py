"""Every request the operator makes in a full run lifecycle is allowed by rbac.RBAC_RULES, and nothing in
the rules goes unused (least privilege). The requests are the real ones Kopf and the handlers send to the
emulated API; child status is simulated by the test (kmock has no controllers)."""

from __future__ import annotations

import re

import pytest
from op_harness import example, server_mode
from suite_helpers import ROOT
from test_events import PULL, trainer_pod

from rlt_operator.cluster.rbac import (
    CLUSTER_PEERING_RULES,
    CLUSTER_RBAC_RULES,
    LEASE_RULES,
    PEERING_RULES,
    RBAC_RULES,
    allows,
)

pytestmark = pytest.mark.timeout(60)

_PATH = re.compile(
    r"^/(?:api/(?P<cv>v1)|apis/(?P<g>[^/]+)/(?P<v>[^/]+))(?:/namespaces/(?P<ns>[^/]+))?"
    r"/(?P<res>[^/]+)(?:/(?P<name>[^/]+))?(?:/(?P<sub>[^/]+))?$"
)


def permission(method: str, path: str, watch: bool) -> tuple[str, str, str] | None:
    """(apiGroup, resource[/subresource], verb) of one request; None for discovery."""
    m = _PATH.match(path)
    if not m or (m["ns"] is None and m["res"] == "namespaces" and m["name"]):
        return None
    group = m["g"] or ""
    res = m["res"] + (f"/{m['sub']}" if m["sub"] else "")
    verb = {"POST": "create", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}.get(method)
    if method == "GET":
        verb = "watch" if watch else ("get" if m["name"] else "list")
    return group, res, verb


async def test_operator_requests_are_exactly_the_rbac_rules(harness, monkeypatch):
    monkeypatch.delenv("RLT_PROMETHEUS_NAMESPACES", raising=False)
    await harness.start_operator()
    doc = server_mode(example(**{"spec.backoffLimit": 1}))
    doc["spec"]["storage"]["retentionPolicy"] = "Delete"  # so that deletion deletes the PVC too
    await harness.create_run(doc)
    await harness.wait_object("jobs", "tiny-sft")
    await harness.wait(  # a Job without pods yet: its controller's FailedCreate Events are listed
        lambda: any(r.method == "GET" and r.url.path.endswith("/events") for r in harness.operator_requests()),
        "the Job's Events read",
    )
    # A pod problem that comes back is counted on the Event posted for it the first time (events patch).
    for state, reason in ((PULL, "ImagePullBackOff"), ({"running": {}}, None), (PULL, "ImagePullBackOff")):
        await trainer_pod(harness, state)
        await harness.wait_status("tiny", lambda s, r=reason: s.get("reason") == r, f"reason {reason}")
    await harness.wait(
        lambda: any(r.method == "PATCH" and "/events/" in r.url.path for r in harness.operator_requests()),
        "an Event's count patched",
    )
    await harness.trainer_succeeded("tiny", "sft")
    await harness.generators_ready("tiny")
    await harness.trainer_running("tiny", "rl")
    # An operator upgraded with other scrapers updates the generators' policy (networkpolicies patch).
    await harness.stop_operator()
    monkeypatch.setenv("RLT_PROMETHEUS_NAMESPACES", "monitoring")
    await harness.start_operator()
    await harness.wait(
        lambda: any(r.method == "PATCH" and "/networkpolicies/" in r.url.path for r in harness.operator_requests()),
        "the generators' policy patched",
    )
    # A trainer pod fails, its gang restarts: deletes, and the failed pod is kept (pods patch; pods delete with the run)
    await harness.failed_trainer_pod("tiny", "rl", "aaaaa", "RuntimeError: boom")
    await harness.trainer_failed("tiny", "rl")
    await harness.wait_status("tiny", lambda s: s.get("restarts") == 1, "restart")
    await harness.wait(  # the status may be written before the kept pod's patch is sent (a busy machine)
        lambda: any(r.method == "PATCH" and "/pods/" in r.url.path for r in harness.operator_requests()),
        "the failed pod kept (pods patch by the operator, not the test's pod status)",
    )
    await harness.patch_run("tiny", {"spec": {"seed": 7}})  # config follows the spec: configmap patch
    await harness.wait(
        lambda: any(r.method == "PATCH" and "configmaps" in r.url.path for r in harness.operator_requests()),
        "configmap patch",
    )
    await harness.delete_run("tiny")
    await harness.wait_gone("rltruns", "tiny")
    # A run created under Delete and deleted under Retain: its claim's owner reference goes (pvc patch).
    await harness.create_run(example(**{"metadata.name": "kept", "spec.storage": {"retentionPolicy": "Delete"}}))
    await harness.wait_object("persistentvolumeclaims", "kept-data")
    await harness.patch_run("kept", {"spec": {"storage": {"retentionPolicy": "Retain"}}})
    await harness.delete_run("kept")
    await harness.wait_gone("rltruns", "kept")

    used: set[tuple[str, str, str]] = set()
    for r in harness.operator_requests():
        perm = permission(str(r.method.value), r.url.path, r.params.get("watch") == "true")
        if perm is None:
            continue
        used.add(perm)
        assert allows(RBAC_RULES + CLUSTER_RBAC_RULES, *perm), f"{r.method} {r.url.path} needs {perm}"

    granted = {
        (g, res, v)
        for rule in RBAC_RULES + CLUSTER_RBAC_RULES
        for g in rule["apiGroups"]
        for res in rule["resources"]
        for v in rule["verbs"]
    }
    # Granted for a real apiserver's admission (blockOwnerDeletion), which the emulator does not check.
    admission_only = {("rlt.dev", "rltruns/finalizers", "update")}
    assert granted - used - admission_only == set(), "rules the operator never used"


def test_the_rbac_table_in_the_docs_is_the_rules():
    """docs/operator.md's RBAC table says which verbs on which resources, and claims "exactly" the rules: each
    resource's verbs there must be the code's, with none missing or extra on either side."""
    code: dict[tuple[str, str], set[str]] = {}
    for rule in (*RBAC_RULES, *CLUSTER_RBAC_RULES, *PEERING_RULES, *CLUSTER_PEERING_RULES, *LEASE_RULES):
        for group in rule["apiGroups"]:
            for res in rule["resources"]:
                code.setdefault((group, res), set()).update(rule["verbs"])
    text = (ROOT / "docs" / "operator.md").read_text()
    table = text.split("\n## RBAC\n", 1)[1].split("\n\n| apiGroup |", 1)[1].split("\n\n", 1)[0]
    docs: dict[tuple[str, str], set[str]] = {}
    for line in table.splitlines()[2:]:  # after the header's rest and the separator
        group, resources, verbs = (cell.strip() for cell in line.strip("|").split("|")[:3])
        group = "" if group == '""' else group
        names = re.sub(r"\([^)]*\)", "", resources).replace(" or ", ",")  # "(cluster mode)" notes are not names
        for res in (n.strip() for n in names.split(",")):
            docs.setdefault((group, res), set()).update(v.strip() for v in verbs.split(","))
    assert docs == code, {
        k: (docs.get(k), code.get(k)) for k in docs.keys() | code.keys() if docs.get(k) != code.get(k)
    }
