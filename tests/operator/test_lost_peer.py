"""A gang that lost a trainer pod: its live trainer pods are deleted with a short grace period (they cannot save
without the lost ranks, and under NCCL they do not notice the loss), while a stop in which every rank lives
(a preemption, an eviction, a stop after a save, a generator that stopped) keeps the pods' own grace period."""

from __future__ import annotations

import datetime as dt

import yaml
from op_harness import EXAMPLES

from rlt_operator import builders as b
from rlt_operator.status import decide as S
from rlt_operator.status.gang_steps import LOST_PEER_GRACE_SECONDS
from rlt_operator.status.observed import Observed, summarize

REF = b.RunRef(name="t", namespace="ns", uid="u1")
NOW = dt.datetime(2026, 1, 1, 12, 0, 0, tzinfo=dt.timezone.utc)


def two_node_spec() -> dict:
    s = yaml.safe_load((EXAMPLES / "rltrun-tiny.yaml").read_text())["spec"]
    s["stages"]["sft"]["enabled"] = s["stages"]["distill"]["enabled"] = False
    s["stages"]["rl"].update(batchSize=16, perDeviceBatchSize=4, numGenerations=4)  # 4 ranks of 4
    s["resources"] = {"trainer": {"nodes": 2, "gpus": 2}}
    s["storage"] = {"accessMode": "ReadWriteMany"}
    return s


def trainer_pod(name: str, phase: str = "Running", exit_code: int | None = None, disruption: bool = False) -> dict:
    state = {"terminated": {"exitCode": exit_code, "reason": "Error"}} if exit_code is not None else {"running": {}}
    conditions = [{"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}]
    body = {
        "metadata": {"name": name, "labels": b.labels("t", b.ROLE_TRAINER, "rl", 0)},
        "status": {
            "phase": phase,
            "conditions": conditions if disruption else [],
            "containerStatuses": [{"name": "trainer", "restartCount": 0, "state": state}],
        },
    }
    return summarize("pods", body)


def decide(*pods: dict):
    job = {
        "name": "t-rl",
        "labels": b.labels("t", b.ROLE_TRAINER, "rl", 0),
        "deleting": False,
        "completions": 2,
        "active": sum(p["phase"] == "Running" for p in pods),
        # the podFailurePolicy ignores a stop after a save and a disruption: the Job counts neither
        "failed": sum(p["phase"] == "Failed" and not p["disrupted"] for p in pods),
        "conditions": [],
    }
    spec = two_node_spec()
    from test_status import base_children

    observed = Observed(**base_children(spec), jobs={"t-rl": job}, pods=list(pods))
    prev = {"phase": "Running", "stage": "rl", "restarts": 0, "startTime": "2026-01-01T11:50:00Z"}
    return S.decide(REF, 1, spec, prev, observed, NOW)


def pod_deletes(decision) -> dict[str, int | None]:
    return {a.name: a.grace_seconds for a in decision.actions if a.verb == "delete" and a.plural == "pods"}


def test_a_failed_trainer_pod_stops_its_live_peers_with_a_short_grace_period():
    d = decide(trainer_pod("t-rl-0-a"), trainer_pod("t-rl-1-b", "Failed", exit_code=1))
    assert d.status["restarts"] == 1 and "t-rl-1-b" in d.status["lastFailure"]
    assert pod_deletes(d) == {"t-rl-0-a": LOST_PEER_GRACE_SECONDS}
    assert ("delete", "jobs", "t-rl") in {(a.verb, a.plural, a.name) for a in d.actions}
    # the Job goes first: its pods are deleted by then, so the Job controller replaces none of them
    verbs = [(a.plural, a.name) for a in d.actions if a.verb == "delete"]
    assert verbs.index(("jobs", "t-rl")) < verbs.index(("pods", "t-rl-0-a"))


def test_a_pod_already_deleting_gets_the_shorter_grace_period_too():
    survivor = {**trainer_pod("t-rl-0-a"), "deleting": True}  # the Job controller's deletion, with its own period
    d = decide(survivor, trainer_pod("t-rl-1-b", "Failed", exit_code=137))
    assert pod_deletes(d) == {"t-rl-0-a": LOST_PEER_GRACE_SECONDS}


def test_a_stop_in_which_every_rank_lives_keeps_the_pods_own_grace_period():
    saved = decide(trainer_pod("t-rl-0-a"), trainer_pod("t-rl-1-b", "Failed", exit_code=75))  # STOPPED
    preempted = decide(trainer_pod("t-rl-0-a"), trainer_pod("t-rl-1-b", "Failed", exit_code=143, disruption=True))
    for d in (saved, preempted):
        assert d.status["restarts"] == 1 and d.status["disruptions"] == 1
        assert pod_deletes(d) == {}, d.actions
