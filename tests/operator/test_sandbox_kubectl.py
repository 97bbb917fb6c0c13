"""What kubectl and helm need from `rlt sandbox` beyond get/apply: Events (listed, and per object in describe),
OpenAPI v3 for `kubectl explain` and client-side validation, `helm install` (and --dry-run), and `kubectl get -w`
keeping its columns. Real kubectl and helm binaries against the emulated API (not a cluster)."""

from __future__ import annotations

import subprocess
import time

import pytest
from suite_helpers import ROOT, TINY, find_tool, wait_for

from rlt_sandbox.sandbox import COMPLETE_JOB_PATCH

KUBECTL = find_tool("kubectl")
HELM = find_tool("helm")

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(KUBECTL is None or HELM is None, reason="kubectl/helm not installed"),
]


def test_events_explain_validation_and_helm_dry_run(start_sandbox):
    sandbox = start_sandbox()
    kubectl = sandbox.kubectl
    # client-side validation on (no --validate=false): kubectl finds fieldValidation in the OpenAPI v3 document
    assert "rltrun.rlt.dev/tiny created" in kubectl("apply", "-f", str(TINY))
    other = TINY.read_text().replace("name: tiny", "name: other")
    sandbox.run("kubectl", "apply", "-f", "-", input=other)

    events = wait_for(lambda: (out := kubectl("get", "events")).count("rltrun/") >= 4 and out, "events of 2 runs")
    assert events.splitlines()[0].split() == ["NAME", "LAST", "SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"]
    assert "rltrun/tiny" in events and "rltrun/other" in events

    described = kubectl("describe", "rltrun", "tiny")
    section = described.split("Events:", 1)[1]
    assert "stage sft started" in section
    # only this run's Events: its trainer event names tiny's Job, never other's
    assert section.count("stage sft started") == 1

    explained = kubectl("explain", "rltrun.spec.stages.rl")
    assert "GRPO of the teacher with the RLT reward" in explained
    assert "numGenerations" in explained and "G: completions per question." in explained
    assert "Optimizer steps." in kubectl("explain", "rltrun.spec.stages.rl.steps")

    install = ["rlt", str(ROOT / "charts/rlt-operator"), "--namespace", "default"]
    install += ["--set", "image.repository=example.org/rlt-operator"]
    dry = sandbox.run("helm", "install", "--dry-run", *install)
    assert "kind: Deployment" in dry.stdout and "STATUS: pending-install" in dry.stdout
    assert kubectl("get", "deployments", "-A", "-o", "name").strip() == ""  # a dry run creates nothing
    # a real install: Helm's release record is a protobuf Secret, which the glue decodes
    sandbox.run("helm", "install", *install)
    assert "deployed" in sandbox.run("helm", "list", "--namespace", "default").stdout
    assert kubectl("get", "deployments", "-o", "name").split() == ["deployment.apps/rlt-rlt-operator"]
    # the chart's peering object for its two replicas (Kopf's CRDs come from the chart's crds/, already served here)
    assert kubectl("get", "clusterkopfpeerings", "-o", "name").split() == [
        "clusterkopfpeering.kopf.dev/rlt-rlt-operator"
    ]
    assert kubectl("get", "poddisruptionbudgets", "-o", "name").split() == [
        "poddisruptionbudget.policy/rlt-rlt-operator"
    ]
    release = kubectl("get", "secret", "sh.helm.release.v1.rlt.v1", "-o", "jsonpath={.type} {.metadata.labels.status}")
    assert release == "helm.sh/release.v1 deployed"  # updated (PUT, protobuf) from pending-install
    sandbox.run("helm", "uninstall", "rlt", "--namespace", "default")


def test_watch_keeps_its_columns_and_does_not_repeat_rows(start_sandbox):
    sandbox = start_sandbox()
    sandbox.kubectl("apply", "-f", str(TINY))
    sandbox.kubectl_until("WaitingForPods", "get", "rlt")  # the Job exists; no pod runs without --run-pods
    watch = subprocess.Popen(
        [KUBECTL, "get", "rlt", "-w", "--request-timeout=0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=sandbox.client_env,
    )
    try:
        header = watch.stdout.readline().split()
        first = watch.stdout.readline().split()
        sandbox.kubectl("patch", "job", "tiny-sft", "--subresource=status", "--type=merge", "-p", COMPLETE_JOB_PATCH)
        later = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not any("rl" in line for line in later):
            later.append(watch.stdout.readline().split())
    finally:
        watch.kill()
        watch.wait()
    assert header == ["NAME", "PHASE", "STAGE", "TRAINER", "STEP", "REWARD", "RESTARTS", "REASON", "AGE"]
    assert first[:3] == ["tiny", "Pending", "sft"]
    # after the first row every update is still a row of the same columns (it used to be the bare name)
    assert later and all(len(row) >= 5 and row[0] == "tiny" for row in later), later
    assert ["tiny", "Running", "rl"] in [row[:3] for row in later]


def test_not_found_reads_as_the_api_servers(start_sandbox):
    """`kubectl get rlt nope` says what a cluster says, not how to declare the object in the emulator."""
    sandbox = start_sandbox()
    res = sandbox.run("kubectl", "get", "rlt", "nope", ok=False)
    assert res.returncode == 1
    assert res.stderr.strip().splitlines()[-1] == 'Error from server (NotFound): rltruns.rlt.dev "nope" not found', (
        res.stderr
    )
    res = sandbox.run("kubectl", "get", "pod", "nope", "-n", "default", ok=False)
    assert 'pods "nope" not found' in res.stderr and "kmock" not in res.stderr, res.stderr
