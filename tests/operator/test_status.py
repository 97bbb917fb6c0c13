"""Pure decisions: (spec, previous status, observed children, now) → status, actions, events."""

from __future__ import annotations

import datetime as dt
import json

import pytest
import yaml
from op_harness import EXAMPLES

from rlt.contract.layout import format_time
from rlt.spec.loading import parse_spec
from rlt_operator import builders as b
from rlt_operator.status import decide as S
from rlt_operator.status import decision as D
from rlt_operator.status import events as E
from rlt_operator.status import gang_steps as G
from rlt_operator.status import patch as W
from rlt_operator.status import records as R
from rlt_operator.status.gang import POD_END_LAG_SECONDS
from rlt_operator.status.observed import Observed, summarize

REF = b.RunRef(name="t", namespace="ns", uid="u1")
NOW = dt.datetime(2026, 1, 1, 12, 0, 0, tzinfo=dt.timezone.utc)
T0 = format_time(NOW - dt.timedelta(minutes=10))


def spec(server=False, sft=True, distill=True, **extra):
    s = yaml.safe_load((EXAMPLES / "rltrun-tiny.yaml").read_text())["spec"]
    s["stages"]["sft"]["enabled"] = sft
    s["stages"]["distill"]["enabled"] = distill
    if server:
        s["stages"]["rl"]["generation"] = {"mode": "server"}
        # the example's one trainer process kept: its batches fit it
        s["resources"] = {"generator": {"replicas": 1, "gpus": 2, "dataParallelSize": 2}, "trainer": {"gpus": 1}}
    s.update(extra)
    return s


def job(stage, restart=0, active=0, complete=False, failed=False):
    conds = [{"type": "Complete", "status": "True"}] if complete else []
    conds += [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "x"}] if failed else []
    return {
        "name": f"t-{stage}",
        "labels": b.labels("t", b.ROLE_TRAINER, stage, restart),
        "deleting": False,
        "completions": 1,
        "active": active,
        "succeeded": 1 if complete else 0,
        "failed": 1 if failed else 0,
        "conditions": conds,
    }


def sts(stage, restart=0, ready=1):
    return {
        "name": "t-generator",
        "labels": b.labels("t", b.ROLE_GENERATOR, stage, restart),
        "deleting": False,
        "replicas": 1,
        "readyReplicas": ready,
    }


def base_children(sp):
    cm = b.configmap(REF, parse_spec(sp))
    return {
        "configmaps": {
            "t-config": {"name": "t-config", "labels": {}, "configHash": cm["metadata"]["annotations"][b.A_CONFIG_HASH]}
        },
        "persistentvolumeclaims": {"t-data": {"name": "t-data", "labels": {}}},
    }


def observed(sp, jobs=(), statefulsets=(), pods=()):
    return Observed(
        **base_children(sp),
        jobs={j["name"]: j for j in jobs},
        statefulsets={s["name"]: s for s in statefulsets},
        pods=list(pods),
    )


def running(stage, restarts=0, **more):
    return {"phase": "Running", "stage": stage, "restarts": restarts, "startTime": T0, **more}


def acts(decision):
    return {(a.verb, a.plural, a.name) for a in decision.actions}


def test_fresh_run_creates_run_wide_children_and_first_stage():
    d = S.decide(REF, 1, spec(), None, Observed(), NOW)
    assert acts(d) == {
        ("create", "configmaps", "t-config"),
        ("create", "persistentvolumeclaims", "t-data"),
        ("create", "services", "t-sft"),
        ("create", "jobs", "t-sft"),
    }
    assert d.status["phase"] == "Pending" and d.status["stage"] == "sft"
    assert d.status["startTime"] == format_time(NOW) and d.status["observedGeneration"] == 1
    assert ("Normal", "StageStarted", "stage sft started") in d.events


# The generator's Service and NetworkPolicy: (re)created whenever the generators are wanted.
GEN_NETWORK = {("create", "services", "t-generator"), ("create", "networkpolicies", "t-generator")}
# (name, spec, prev status, jobs, statefulsets, expected actions, expected phase, expected stage)
TABLE = [
    (
        "generators first",
        spec(server=True, sft=False),
        running("rl"),
        [],
        [],
        GEN_NETWORK | {("create", "statefulsets", "t-generator")},
        "Running",
        "rl",
    ),
    (
        "trainer waits for readiness",
        spec(server=True, sft=False),
        running("rl"),
        [],
        [sts("rl", ready=0)],
        GEN_NETWORK,
        "Running",
        "rl",
    ),
    (
        "trainer once ready",
        spec(server=True, sft=False),
        running("rl"),
        [],
        [sts("rl")],
        GEN_NETWORK | {("create", "services", "t-rl"), ("create", "jobs", "t-rl")},
        "Running",
        "rl",
    ),
    (
        "sft done → rl",
        spec(server=True),
        running("sft"),
        [job("sft", complete=True)],
        [],
        GEN_NETWORK | {("create", "statefulsets", "t-generator")},
        "Running",
        "rl",
    ),
    (
        "stale generators of rl during distill",
        spec(server=True),
        running("rl"),
        [job("sft", complete=True), job("rl", complete=True)],
        [sts("rl")],
        GEN_NETWORK | {("delete", "statefulsets", "t-generator")},
        "Running",
        "distill",
    ),
    (
        "older gang deleted, nothing created yet",
        spec(server=True, sft=False),
        running("rl", restarts=1),
        [job("rl", restart=0, active=1)],
        [sts("rl", restart=0)],
        GEN_NETWORK | {("delete", "jobs", "t-rl"), ("delete", "statefulsets", "t-generator")},
        "Running",
        "rl",
    ),
    (
        "all done → Succeeded, generators freed, Jobs kept",
        spec(server=True, sft=False, distill=False),
        running("rl"),
        [job("rl", complete=True)],
        [sts("rl")],
        {("delete", "statefulsets", "t-generator")},
        "Succeeded",
        "",
    ),
    (
        "inprocess generation: no generators",
        spec(sft=False),
        running("rl"),
        [],
        [],
        {("create", "services", "t-rl"), ("create", "jobs", "t-rl")},
        "Running",
        "rl",
    ),
]


@pytest.mark.parametrize("name, sp, prev, jobs, stss, want, phase, stage", TABLE, ids=[t[0] for t in TABLE])
def test_decision_table(name, sp, prev, jobs, stss, want, phase, stage):
    d = S.decide(REF, 1, sp, prev, observed(sp, jobs, stss), NOW)
    assert acts(d) == want
    assert (d.status["phase"], d.status["stage"]) == (phase, stage)


@pytest.mark.parametrize("restarts, limit, phase", [(0, 2, "Running"), (1, 2, "Running"), (2, 2, "Failed")])
def test_trainer_failure_restarts_the_gang_until_the_backoff_limit(restarts, limit, phase):
    sp = spec(server=True, sft=False, backoffLimit=limit)
    obs = observed(sp, [job("rl", restart=restarts, failed=True)], [sts("rl", restart=restarts)])
    d = S.decide(REF, 1, sp, running("rl", restarts), obs, NOW)
    assert {("delete", "jobs", "t-rl"), ("delete", "statefulsets", "t-generator")} <= acts(d) or phase == "Failed"
    assert d.status["phase"] == phase
    if phase == "Running":
        assert d.status["restarts"] == restarts + 1
        assert d.events[0][:2] == ("Warning", "GangRestart") and d.requeue_after == D.SOON
        assert not any(a.verb == "create" for a in d.actions)
    else:
        assert d.status["reason"] == "BackoffLimitExceeded" and d.status["restarts"] == restarts
        assert ("delete", "statefulsets", "t-generator") in acts(d)
        assert ("delete", "jobs", "t-rl") not in acts(d), "a failed trainer's pods stay for their logs"


@pytest.mark.parametrize(
    "condition, failed_ago, pod_phase, waits",
    [
        ("Failed", 3, "Running", True),
        ("Failed", 3, None, True),
        ("Failed", 3, "Failed", False),
        ("Failed", 20, "Running", False),
        ("FailureTarget", 3, "Running", True),  # Kubernetes 1.31+: failed 1, Failed only once every pod stopped
        ("FailureTarget", 3, "Failed", False),
    ],
)
def test_a_failed_job_waits_for_its_failed_pod_to_be_seen_before_the_restart(condition, failed_ago, pod_phase, waits):
    """The Job watch can run ahead of the pod watch: a restart decided before the failed pod is seen would lose its
    log and exit code. The gang waits (nothing deleted, restarts unchanged) until the pod is seen Failed or
    POD_END_LAG_SECONDS have passed since the Job failed (pod_phase None: the pod is not seen at all)."""
    sp = spec(sft=False)
    failed = job("rl", failed=True)
    failed["conditions"] = [
        {"type": condition, "status": "True", "reason": "BackoffLimitExceeded", "message": "x"}
        | {"lastTransitionTime": format_time(NOW - dt.timedelta(seconds=failed_ago))}
    ]
    pods = [] if pod_phase is None else [observed_pod("t-rl-0-x", b.ROLE_TRAINER, "rl", phase=pod_phase)]
    d = S.decide(REF, 1, sp, running("rl"), observed(sp, [failed], pods=pods), NOW)
    if waits:
        assert not d.actions and d.status["restarts"] == 0 and d.requeue_after == D.SOON
        assert "lastFailedPod" not in d.status
        conditions = {c["type"]: c for c in d.status["conditions"]}
        for kind in ("TrainerRunning", "Ready"):  # the run does not progress meanwhile
            assert (conditions[kind]["status"], conditions[kind]["reason"]) == ("False", "WaitingForFailedPod"), kind
    else:
        assert ("delete", "jobs", "t-rl") in acts(d) and d.status["restarts"] == 1
        assert d.status.get("lastFailedPod") == ("t-rl-0-x" if pod_phase == "Failed" else None)


@pytest.mark.parametrize("server_ahead", [3600, -3600])
def test_the_wait_for_the_failed_pod_lasts_at_most_15_s_of_the_operators_clock(server_ahead):
    """The API server's clock may be ahead of the operator's (the Job failed "in the future") or behind: the run's
    loop stamps when it first saw the Job failing (RunMemory.stamp_failures), so the gang waits no longer than
    POD_END_LAG_SECONDS of the operator's own time before it restarts without the pod."""
    from rlt_operator.reconcile import RunMemory

    sp = spec(sft=False)
    failed = job("rl", failed=True) | {"uid": "job-uid"}
    failed["conditions"][0]["lastTransitionTime"] = format_time(NOW + dt.timedelta(seconds=server_ahead))
    mem = RunMemory()
    first = observed(sp, [dict(failed)])
    mem.stamp_failures(first, NOW)
    d = S.decide(REF, 1, sp, running("rl"), first, NOW)
    if server_ahead > 0:  # a failure seen now waits for its pod
        assert not d.actions and d.status["restarts"] == 0 and d.requeue_after == D.SOON
    else:  # the server's clock says it failed an hour ago: the earlier time counts, no wait
        assert ("delete", "jobs", "t-rl") in acts(d) and d.status["restarts"] == 1
    later = NOW + dt.timedelta(seconds=POD_END_LAG_SECONDS + 1)
    again = observed(sp, [dict(failed)])
    mem.stamp_failures(again, later)
    d = S.decide(REF, 1, sp, running("rl"), again, later)
    assert ("delete", "jobs", "t-rl") in acts(d) and d.status["restarts"] == 1
    mem.stamp_failures(observed(sp, []), later)
    assert mem.failures_seen == {}, "a Job gone is forgotten"


def test_a_pod_seen_with_a_config_error_fails_the_run_without_waiting_for_the_failed_pod():
    """A pod of the gang that exited with a config/data error is seen: the run fails at once (no retry can help),
    whatever the Job's pods show yet."""
    sp = spec(server=True, sft=False)
    failed = job("rl", failed=True)
    failed["conditions"][0]["lastTransitionTime"] = format_time(NOW)
    gen = observed_pod(
        "t-generator-0",
        b.ROLE_GENERATOR,
        "rl",
        containers=[{"name": "vllm", "state": {"terminated": {"exitCode": 78, "message": "bad model"}}}],
    )
    d = S.decide(REF, 1, sp, running("rl"), observed(sp, [failed], [sts("rl")], pods=[gen]), NOW)
    assert d.status["phase"] == "Failed" and d.status["reason"] == "ConfigError", d.status


def test_generator_restart_in_current_gang_counts_but_old_gang_pods_do_not():
    sp = spec(server=True, sft=False)
    pod = {
        "name": "t-generator-0",
        "labels": b.labels("t", b.ROLE_GENERATOR, "rl", 0),
        "phase": "Running",
        "restarts": 2,
    }
    old = S.decide(REF, 1, sp, running("rl", 1), observed(sp, [], [sts("rl", restart=1)], [pod]), NOW)
    assert old.status["restarts"] == 1
    cur = S.decide(REF, 1, sp, running("rl", 0), observed(sp, [job("rl", active=1)], [sts("rl")], [pod]), NOW)
    assert cur.status["restarts"] == 1 and "t-generator-0 restarted 2 time(s)" in cur.status["lastFailure"]


def test_suspend_deletes_gpu_pods_and_keeps_data():
    sp = spec(server=True, sft=False, suspend=True)
    d = S.decide(REF, 2, sp, running("rl"), observed(sp, [job("rl", active=1)], [sts("rl")]), NOW)
    assert acts(d) == {("delete", "jobs", "t-rl"), ("delete", "statefulsets", "t-generator")}
    assert d.status["phase"] == "Suspended" and "startTime" not in d.status
    assert all(a.propagation == "Foreground" for a in d.actions)
    resumed = S.decide(REF, 3, spec(server=True, sft=False), d.status, observed(sp), NOW)
    assert ("create", "statefulsets", "t-generator") in acts(resumed)
    assert resumed.status["restarts"] == 0
    assert [e[1] for e in resumed.events] == ["Resumed"]


def test_deadline_fails_the_run_and_stops_the_trainer():
    sp = spec(sft=False, activeDeadlineSeconds=60)
    d = S.decide(REF, 1, sp, running("rl"), observed(sp, [job("rl", active=1)]), NOW)
    assert d.status["phase"] == "Failed" and d.status["reason"] == "DeadlineExceeded"
    assert ("delete", "jobs", "t-rl") in acts(d)
    early = S.decide(
        REF, 1, spec(sft=False, activeDeadlineSeconds=3600), running("rl"), observed(sp, [job("rl", active=1)]), NOW
    )
    assert early.status["phase"] == "Running" and early.requeue_after == pytest.approx(3000)


def test_ttl_after_finished():
    sp = spec(sft=False, distill=False, ttlSecondsAfterFinished=300)
    done = {
        "phase": "Succeeded",
        "stage": "",
        "completionTime": format_time(NOW - dt.timedelta(seconds=100)),
        "completedStages": ["rl"],
    }
    d = S.decide(REF, 1, sp, done, observed(sp, [job("rl", complete=True)]), NOW)
    assert acts(d) == set() and d.requeue_after == pytest.approx(200)
    later = S.decide(REF, 1, sp, done, observed(sp, [job("rl", complete=True)]), NOW + dt.timedelta(seconds=201))
    assert ("delete", "jobs", "t-rl") in acts(later)
    assert later.status["phase"] == "Succeeded"


def test_invalid_spec_names_the_field_and_creates_nothing():
    bad = spec()
    bad["stages"]["rl"]["numGenerations"] = 3
    d = S.decide(REF, 1, bad, None, Observed(), NOW)
    assert d.status["phase"] == "Pending" and d.status["reason"] == "InvalidSpec"
    assert d.status["message"].startswith("spec.stages.rl") and "numGenerations (3)" in d.status["message"]
    assert d.actions == []
    cond = {c["type"]: c for c in d.status["conditions"]}["SpecValid"]
    assert (cond["status"], cond["reason"]) == ("False", "InvalidSpec")
    assert [e[1] for e in d.events] == ["InvalidSpec"]
    fixed = S.decide(REF, 2, spec(), d.status, Observed(), NOW)
    assert "reason" not in fixed.status and ("create", "jobs", "t-sft") in acts(fixed)
    assert {c["type"]: c for c in fixed.status["conditions"]}["SpecValid"]["status"] == "True"


def test_invalid_edit_mid_run_neither_starts_nor_stops_anything_and_is_recoverable():
    """`rlt validate` refuses format preset rcl-default for method rlt: so must the operator, without harm."""
    sp = spec(server=True, sft=False)
    obs = observed(sp, [job("rl", active=1)], [sts("rl")])
    bad = spec(server=True, sft=False, format={"preset": "rcl-default"})
    d = S.decide(REF, 2, bad, running("rl"), obs, NOW)
    assert d.actions == [], "an invalid edit must not delete the generators, the Job or patch the ConfigMap"
    assert d.status["phase"] == "Running" and d.status["reason"] == "InvalidSpec"
    assert d.status["message"].startswith("spec.format.preset:") and "not an rlt prompt format" in d.status["message"]
    again = S.decide(REF, 2, bad, d.status, obs, NOW)
    assert again.events == [], "the InvalidSpec Event is posted once, not every reconcile"
    held = S.decide(REF, 2, bad, running("rl", outputs={"teacherCheckpoint": "/data/t/sft/model"}), obs, NOW)
    assert held.status["outputs"] == {"teacherCheckpoint": "/data/t/sft/model"}, "what exists stays listed"
    fixed = S.decide(REF, 3, sp, again.status, obs, NOW)
    assert fixed.status["phase"] == "Running" and "reason" not in fixed.status
    assert not any(a.verb == "delete" for a in fixed.actions)
    assert ("Normal", "SpecValid", "the spec is valid again; reconciling") in fixed.events


def test_a_run_failed_as_invalid_spec_by_an_older_operator_recovers():
    old = {
        "phase": "Failed",
        "reason": "InvalidSpec",
        "message": "x",
        "conditions": [{"type": "Failed", "status": "True", "reason": "InvalidSpec", "message": "x"}],
    }
    d = S.decide(REF, 2, spec(), old, Observed(), NOW)
    assert d.status["phase"] == "Pending" and ("create", "jobs", "t-sft") in acts(d)


def test_completed_stage_remembered_after_its_job_is_gone():
    sp = spec(sft=True, distill=False)
    d = S.decide(REF, 1, sp, running("rl", completedStages=["sft"]), observed(sp), NOW)
    assert d.status["stage"] == "rl" and ("create", "jobs", "t-rl") in acts(d)


def test_progress_belongs_to_its_stage():
    sp = spec(sft=False, distill=False)
    obs = observed(sp, [job("rl", active=1)])
    d = S.decide(REF, 1, sp, running("rl"), obs, NOW, {"stage": "rl", "step": 3, "rewardMean": -1.5})
    assert d.status["progress"] == {"step": 3, "rewardMean": -1.5, "stepOfTotal": "3", "stepTime": format_time(NOW)}
    d = S.decide(REF, 1, sp, running("rl"), obs, NOW, {"stage": "rl", "step": 3, "totalSteps": 125})
    assert d.status["progress"]["stepOfTotal"] == "3/125"
    other = S.decide(REF, 1, sp, running("rl"), obs, NOW, {"stage": "sft", "step": 9})
    assert other.status["progress"] == {}


def test_config_follows_spec_edits():
    sp = spec()
    obs = observed(sp, [job("sft", active=1)])
    obs.configmaps["t-config"]["configHash"] = "stale"
    d = S.decide(REF, 2, sp, running("sft"), obs, NOW)
    patch = [a for a in d.actions if a.verb == "patch"]
    assert len(patch) == 1 and "run.yaml" in patch[0].body["data"]


def test_each_gang_reads_the_spec_it_was_created_with_whenever_its_pods_start(monkeypatch):
    """An edit mid-gang updates the ConfigMap (for people) but never what the gang's pods read: the snapshot is in
    the Job's immutable pod template, so a pod that starts late (slow image pull) reads the gang's spec."""
    from rlt.checks.validation import load_valid_run
    from rlt.contract.env import RUN_YAML

    CONFIG_ENV = RUN_YAML.name

    old = spec(sft=False)
    new = spec(sft=False)
    new["stages"]["rl"]["learningRate"] = 5e-5
    gang0 = b.trainer_job(REF, parse_spec(old), "rl", 0)["spec"]["template"]["spec"]
    mounted = [v["name"] for v in gang0["volumes"] if "configMap" in v or "projected" in v]
    assert mounted == [], f"a ConfigMap volume changes under running pods: {mounted}"

    obs = observed(new, [job("rl", active=1)])
    obs.configmaps["t-config"]["configHash"] = "old"
    d = S.decide(REF, 2, new, running("rl"), obs, NOW)
    assert ("patch", "configmaps") in {(a.verb, a.plural) for a in d.actions}
    assert not [a for a in d.actions if a.plural in ("jobs", "pods")], d.actions  # the gang itself is left alone

    def read_by_a_pod_of(pod_spec) -> float:
        for c in pod_spec["initContainers"] + pod_spec["containers"]:
            monkeypatch.setenv(CONFIG_ENV, next(e["value"] for e in c["env"] if e["name"] == CONFIG_ENV))
            [arg] = [a for a in c["command"] if a.startswith("env:")]
            rates = {load_valid_run(arg).spec.stages.rl.learning_rate}
        assert len(rates) == 1
        return rates.pop()

    assert read_by_a_pod_of(gang0) == parse_spec(old).stages.rl.learning_rate
    gang1 = b.trainer_job(REF, parse_spec(new), "rl", 1)["spec"]["template"]["spec"]
    assert read_by_a_pod_of(gang1) == 5e-5  # the next gang runs the edit


def test_merge_patch_only_touches_changes_and_own_fields():
    assert W.merge_patch({"phase": "Pending", "x": 1, "reason": "r"}, {"phase": "Running"}) == {
        "phase": "Running",
        "reason": None,
    }
    # the fields the operator owns are the status model's, as the CRD lists them: a field added there is owned
    from rlt_operator import crd

    assert set(W.OWN_STATUS_FIELDS) == set(crd.status_schema()["properties"]) and "disruptions" in W.OWN_STATUS_FIELDS
    assert W.merge_patch({"disruptions": 1, "trainerShape": {}}, {}) == {"disruptions": None, "trainerShape": None}


def test_gpu_children_of_an_earlier_run_with_the_same_name_are_replaced():
    sp = spec(sft=False)
    old = dict(job("rl", active=1), owner="an-earlier-uid")
    d = S.decide(REF, 1, sp, running("rl"), observed(sp, [old]), NOW)
    assert ("delete", "jobs", "t-rl") in acts(d) and ("create", "jobs", "t-rl") not in acts(d)
    mine = dict(job("rl", active=1), owner="u1")
    assert acts(S.decide(REF, 1, sp, running("rl"), observed(sp, [mine]), NOW)) == {("create", "services", "t-rl")}


@pytest.mark.parametrize("name", ["7b-run", "a" * 41])
def test_run_names_children_cannot_carry_are_invalid(name):
    d = S.decide(b.RunRef(name=name, namespace="ns", uid="u"), 1, spec(), None, Observed(), NOW)
    assert d.status["reason"] == "InvalidSpec" and d.status["message"].startswith("metadata.name")
    assert d.actions == []


def test_volume_condition_follows_the_claim():
    sp = spec(sft=False)
    obs = observed(sp, [job("rl", active=1)])
    obs.persistentvolumeclaims["t-data"]["phase"] = "Pending"
    d = S.decide(REF, 1, sp, running("rl"), obs, NOW)
    cond = {c["type"]: c for c in d.status["conditions"]}["VolumeReady"]
    assert (cond["status"], cond["reason"]) == ("False", "ClaimPending") and "t-data" in cond["message"]
    obs.persistentvolumeclaims["t-data"]["phase"] = "Bound"
    d = S.decide(REF, 1, sp, d.status, obs, NOW)
    assert {c["type"]: c for c in d.status["conditions"]}["VolumeReady"]["status"] == "True"


def pod_body(name, role, stage, restart=0, phase="Running", conditions=(), containers=(), init=()):
    return {
        "metadata": {"name": name, "labels": b.labels("t", role, stage, restart)},
        "status": {
            "phase": phase,
            "conditions": list(conditions),
            "initContainerStatuses": list(init),
            "containerStatuses": list(containers),
        },
    }


def observed_pod(*args, **kwargs):
    """A pod as the operator observes it (summarized), from pod_body's arguments."""
    return summarize("pods", pod_body(*args, **kwargs))


UNSCHEDULABLE = pod_body(
    "t-rl-0-x",
    b.ROLE_TRAINER,
    "rl",
    phase="Pending",
    conditions=[
        {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": "0/4 nodes are available: 4 Insufficient nvidia.com/gpu.",
        }
    ],
)
IMAGE_PULL = pod_body(
    "t-generator-0",
    b.ROLE_GENERATOR,
    "rl",
    phase="Pending",
    containers=[
        {
            "name": "vllm",
            "restartCount": 0,
            "state": {"waiting": {"reason": "ImagePullBackOff", "message": 'Back-off pulling image "ghcr.io/x/gen:0"'}},
        }
    ],
)
OOM = pod_body(
    "t-rl-0-x",
    b.ROLE_TRAINER,
    "rl",
    phase="Failed",
    containers=[
        {"name": "trainer", "restartCount": 0, "state": {"terminated": {"reason": "OOMKilled", "exitCode": 137}}}
    ],
)


def conds(d):
    return {c["type"]: c for c in d.status["conditions"]}


def test_unschedulable_trainer_is_not_running_and_is_reported_once():
    sp = spec(sft=False)
    pods = [summarize("pods", UNSCHEDULABLE)]
    d = S.decide(REF, 1, sp, running("rl"), observed(sp, [job("rl", active=1)], pods=pods), NOW)
    c = conds(d)
    assert c["TrainerRunning"]["status"] == "False" and "0/1 trainer pods running" in c["TrainerRunning"]["message"]
    assert (c["PodsSchedulable"]["status"], c["PodsSchedulable"]["reason"]) == ("False", "Unschedulable")
    assert "Insufficient nvidia.com/gpu" in c["PodsSchedulable"]["message"]
    assert d.status["reason"] == "Unschedulable" and "t-rl-0-x" in d.status["message"]
    assert [e[:2] for e in d.events] == [("Warning", "Unschedulable")]
    again = S.decide(REF, 1, sp, d.status, observed(sp, [job("rl", active=1)], pods=pods), NOW)
    assert again.events == []
    ok = [observed_pod("t-rl-0-x", b.ROLE_TRAINER, "rl")]
    fine = S.decide(REF, 1, sp, again.status, observed(sp, [job("rl", active=1)], pods=ok), NOW)
    assert conds(fine)["TrainerRunning"]["status"] == "True" and conds(fine)["PodsSchedulable"]["status"] == "True"
    assert "reason" not in fine.status


def test_a_readwriteonce_trainer_that_cannot_join_its_generators_releases_them_after_a_timeout():
    """RWO: every pod of the run goes to the generators' node. A trainer pod unschedulable there does not keep the
    generators' GPUs for good: after 10 min both are deleted (an uncounted gang restart that says why) and placed
    again together; before that, and with a ReadWriteMany volume, the run keeps waiting."""
    rwo = spec(server=True, sft=False, backoffLimit=0)
    rwx = spec(server=True, sft=False, backoffLimit=0, storage={"accessMode": "ReadWriteMany"})

    def pending_for(minutes):
        body = pod_body(
            "t-rl-0-x",
            b.ROLE_TRAINER,
            "rl",
            phase="Pending",
            conditions=[
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": "0/4 nodes are available: 1 Insufficient nvidia.com/gpu, 3 node(s) didn't match pod "
                    "affinity rules.",
                    "lastTransitionTime": format_time(NOW - dt.timedelta(minutes=minutes)),
                }
            ],
        )
        return summarize("pods", body)

    def decide(sp, minutes):
        obs = observed(sp, [job("rl", active=1)], [sts("rl")], [pending_for(minutes)])
        return S.decide(REF, 1, sp, running("rl"), obs, NOW)

    waiting = decide(rwo, 5)
    assert waiting.status["restarts"] == 0 and not any(a.verb == "delete" for a in waiting.actions)
    released = decide(rwo, 11)
    assert released.status["phase"] == "Running"
    assert (released.status["restarts"], released.status["disruptions"], released.status["replacements"]) == (1, 0, 1)
    assert {("delete", "jobs", "t-rl"), ("delete", "statefulsets", "t-generator")} <= acts(released)
    assert "unschedulable for 11 min beside the generators (ReadWriteOnce" in released.status["lastFailure"]
    assert any(
        e[1] == "GangRestart" and "re-placement 1: counted against replacementLimit" in e[2] for e in released.events
    )
    assert "backoffUntil" not in released.status  # the pods did nothing wrong: placed again at once
    assert decide(rwx, 60).status["restarts"] == 0  # pods of an RWX run may go to any node: nothing to release


def test_readwriteonce_re_placements_are_counted_and_bounded_by_the_replacement_limit():
    """A fragmented cluster where the trainer never fits beside the generators does not cycle for ever: each
    re-placement is a restart (status.restarts, hence rlt_run_restarts and RLTRunRestartLoop) counted in
    status.replacements, and the one past spec.replacementLimit fails the run naming the bound. backoffLimit 0
    shows they are not counted against it."""
    sp = spec(server=True, sft=False, backoffLimit=0, replacementLimit=2)
    stuck = pod_body(
        "t-rl-0-x",
        b.ROLE_TRAINER,
        "rl",
        phase="Pending",
        conditions=[
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/4 nodes are available: 3 node(s) didn't match pod affinity rules.",
                "lastTransitionTime": format_time(NOW - dt.timedelta(minutes=12)),
            }
        ],
    )
    prev = running("rl")
    for gang in range(3):
        stuck["metadata"]["labels"] = b.labels("t", b.ROLE_TRAINER, "rl", gang)
        obs = observed(sp, [job("rl", restart=gang, active=1)], [sts("rl", restart=gang)], [summarize("pods", stuck)])
        d = S.decide(REF, 1, sp, {**prev, "restarts": gang}, obs, NOW)
        prev = d.status
        if gang < 2:
            assert (d.status["phase"], d.status["restarts"], d.status["replacements"]) == (
                "Running",
                gang + 1,
                gang + 1,
            )
    assert (d.status["phase"], d.status["reason"]) == ("Failed", "ReplacementLimitExceeded")
    assert "re-placements exhausted (replacementLimit 2)" in d.status["message"]
    assert "unschedulable for 12 min beside the generators" in d.status["message"]
    assert d.status["restarts"] == 2 and d.status["replacements"] == 2


def test_image_pull_back_off_of_a_generator_is_a_condition_and_an_event():
    sp = spec(server=True, sft=False)
    pods = [summarize("pods", IMAGE_PULL)]
    d = S.decide(REF, 1, sp, running("rl"), observed(sp, [], [sts("rl", ready=0)], pods=pods), NOW)
    c = conds(d)["PodsHealthy"]
    assert (c["status"], c["reason"]) == ("False", "ImagePullBackOff") and "ghcr.io/x/gen:0" in c["message"]
    assert ("Warning", "ImagePullBackOff") in [e[:2] for e in d.events]


def crash_looping(last_reason: str, exit_code: int) -> dict:
    """A generator pod whose vllm container crash-loops, its last exit being `last_reason`."""
    last = {"terminated": {"reason": last_reason, "exitCode": exit_code}}
    waiting = {"waiting": {"reason": "CrashLoopBackOff"}}
    container = {"name": "vllm", "restartCount": 3, "state": waiting, "lastState": last}
    return pod_body("g", b.ROLE_GENERATOR, "rl", containers=[container])


@pytest.mark.parametrize(
    "body, reason",
    [
        (OOM, "OOMKilled"),
        (crash_looping("Error", 1), "CrashLoopBackOff"),  # a plain crash: the loop is the news
        (crash_looping("OOMKilled", 137), "OOMKilled"),  # a loop of OOM kills: the cause is
    ],
)
def test_pod_reasons_are_read_from_the_pod_status(body, reason):
    assert summarize("pods", body)["problem"]["reason"] == reason


def test_a_config_error_exit_fails_the_run_at_once_without_a_gang_restart():
    sp = spec(server=True, sft=False)
    pod = observed_pod(
        "t-rl-0-x",
        b.ROLE_TRAINER,
        "rl",
        phase="Failed",
        containers=[{"name": "validate", "state": {"terminated": {"reason": "Error", "exitCode": 78}}}],
    )
    d = S.decide(REF, 1, sp, running("rl"), observed(sp, [job("rl", failed=True)], [sts("rl")], [pod]), NOW)
    assert d.status["phase"] == "Failed" and d.status["reason"] == "ConfigError" and d.status["restarts"] == 0
    assert "CONFIG_ERROR (78)" in d.status["message"]
    assert ("delete", "statefulsets", "t-generator") in acts(d) and not any(a.verb == "create" for a in d.actions)
    # the pod may be gone: the Job's own reason says the FailJob rule matched
    failed = dict(
        job("rl", failed=True),
        conditions=[
            {
                "type": "Failed",
                "status": "True",
                "reason": "PodFailurePolicy",
                "message": "Container trainer ... exit code 65 ...",
            }
        ],
    )
    d = S.decide(REF, 1, sp, running("rl"), observed(sp, [failed], [sts("rl")]), NOW)
    assert d.status["reason"] == "ConfigError"


def test_a_capacity_misfit_in_the_preflight_sets_capacity_ok_false_and_fails_at_once():
    """The trainer pod's init container (rlt.checks.preflight) exited 78 with the plan's `capacity:` line: CapacityOK
    False with that line, the run Failed/ConfigError with no gang restart; another config error sets no CapacityOK."""
    sp = spec(server=True, sft=False)
    line = (
        "capacity: all: run volume at its fullest (during rl) needs 340.4 GiB but has 200.0 GiB; change "
        "storage.size or stages.rl.saveTotalLimit (rlt plan of stage rl, GPUs of the default 80.0 GiB; ...)"
    )

    def failed_preflight(message):
        terminated = {"reason": "Error", "exitCode": 78, "message": f"a warning\n{message}\n"}
        pod = observed_pod(
            "t-rl-0-x",
            b.ROLE_TRAINER,
            "rl",
            phase="Failed",
            containers=[{"name": "validate", "state": {"terminated": terminated}}],
        )
        return S.decide(REF, 1, sp, running("rl"), observed(sp, [job("rl", failed=True)], [sts("rl")], [pod]), NOW)

    d = failed_preflight(line)
    assert d.status["phase"] == "Failed" and d.status["reason"] == "ConfigError" and d.status["restarts"] == 0
    assert line in d.status["message"]
    cap = conds(d)["CapacityOK"]
    assert (cap["status"], cap["reason"]) == ("False", "CapacityExceeded")
    assert cap["message"] == "stage rl: " + line.removeprefix("capacity: ")
    assert not any(a.verb == "create" for a in d.actions)
    other = failed_preflight("stage rl: the volume already holds it, finished under a different spec (...)")
    assert other.status["reason"] == "ConfigError" and "CapacityOK" not in conds(other)


def preflight_pod(name, code, message, restart=0, phase="Running"):
    """A trainer pod of the rl gang whose init container `validate` terminated with `code` and `message` (its
    termination message, as the kubelet reports it)."""
    terminated = {"reason": "Completed" if code == 0 else "Error", "exitCode": code, "message": message}
    return observed_pod(
        name, b.ROLE_TRAINER, "rl", restart, phase, init=[{"name": "validate", "state": {"terminated": terminated}}]
    )


def test_capacity_ok_is_true_with_the_plan_unknown_when_skipped_and_false_wins():
    """CapacityOK from the preflight's termination message: True (Fits) with the plan's headline when the check
    passed, Unknown (NotChecked) when RLT_CAPACITY_CHECK=false skipped it, absent before any preflight ended, and
    a misfit of any pod of the gang (exit 78) makes it False over a True of another pod or of an earlier status."""
    sp = spec(server=True, sft=False)
    fits = (
        "capacity: fits: stage rl: GPU memory per trainer process 65.5 of 80.0 GiB; run volume at its fullest "
        "(during rl) 368.8 of 1024.0 GiB (GPUs of the default 80.0 GiB)\n"
    )
    skipped = "capacity: not checked: RLT_CAPACITY_CHECK=false in spec.env\n"
    misfit = "capacity: all: run volume at its fullest (during rl) needs 340.4 GiB but has 200.0 GiB; change ...\n"

    def decide(pods, prev=None, failed=False, now=NOW):
        kids = observed(sp, [job("rl", active=0 if failed else 1, failed=failed)], [sts("rl")], pods)
        return S.decide(REF, 1, sp, prev or running("rl"), kids, now)

    d = decide([preflight_pod("t-rl-0-a", 0, fits), preflight_pod("t-rl-0-b", 0, skipped)])
    cap = conds(d)["CapacityOK"]
    assert (cap["status"], cap["reason"]) == ("True", "Fits")
    assert cap["message"] == fits.strip().removeprefix("capacity: fits: ")
    assert d.status["phase"] == "Running" and d.status.get("reason") is None

    cap = conds(decide([preflight_pod("t-rl-0-a", 0, skipped)]))["CapacityOK"]
    assert (cap["status"], cap["reason"]) == ("Unknown", "NotChecked")
    assert cap["message"] == "stage rl: the capacity check was skipped (RLT_CAPACITY_CHECK=false in spec.env)"

    pending = observed_pod("t-rl-0-a", b.ROLE_TRAINER, "rl", phase="Pending")
    assert "CapacityOK" not in conds(decide([pending])), "no preflight has ended yet: no condition"
    older_gang = preflight_pod("t-rl-0-a", 0, fits, restart=0)
    assert "CapacityOK" not in conds(decide([older_gang], running("rl", restarts=1)))

    healthy = decide([preflight_pod("t-rl-0-a", 0, fits)])
    worse = decide(
        [preflight_pod("t-rl-0-a", 0, fits), preflight_pod("t-rl-0-b", 78, misfit, phase="Failed")],
        prev=healthy.status,
        failed=True,
        now=NOW + dt.timedelta(minutes=1),
    )
    cap = conds(worse)["CapacityOK"]
    assert (cap["status"], cap["reason"]) == ("False", "CapacityExceeded")
    assert cap["message"] == "stage rl: " + misfit.strip().removeprefix("capacity: ")
    assert cap["lastTransitionTime"] == format_time(NOW + dt.timedelta(minutes=1)), "True -> False is a transition"
    assert worse.status["reason"] == "ConfigError"
    either_order = decide([preflight_pod("t-rl-0-b", 78, misfit, phase="Failed"), preflight_pod("t-rl-0-a", 0, fits)])
    assert conds(either_order)["CapacityOK"]["status"] == "False"


def test_a_generator_that_is_stopping_stops_the_trainer_at_once_uncounted():
    """A generator pod of the running gang being deleted by someone else (a drain's eviction, preemption): the gang
    restarts now as a disruption, so the trainer gets SIGTERM and saves at its next boundary while the stopping
    generator's preStop keeps serving it; waiting for the pod to end would leave the trainer to crash on its next
    request. A generator deleted with its StatefulSet (the operator's own restart) is no news."""
    sp = spec(server=True, sft=False, backoffLimit=0)
    body = pod_body("t-generator-0", b.ROLE_GENERATOR, "rl")
    body["metadata"]["deletionTimestamp"] = format_time(NOW)
    body["status"]["conditions"] = [{"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}]
    stopping = summarize("pods", body)
    obs = observed(sp, [job("rl", active=1)], [sts("rl")], [stopping])
    d = S.decide(REF, 1, sp, running("rl"), obs, NOW)
    assert d.status["phase"] == "Running" and (d.status["restarts"], d.status["disruptions"]) == (1, 1)
    assert {("delete", "jobs", "t-rl"), ("delete", "statefulsets", "t-generator")} <= acts(d)
    assert "generator pod t-generator-0 is stopping" in d.status["lastFailure"]
    assert "backoffUntil" not in d.status
    going = dict(sts("rl"), deleting=True)
    d = S.decide(REF, 1, sp, running("rl"), observed(sp, [job("rl", active=1)], [going], [stopping]), NOW)
    assert d.status["restarts"] == 0


def test_a_disruption_restarts_the_gang_without_counting_against_the_backoff_limit():
    sp = spec(server=True, sft=False, backoffLimit=1)

    def evicted(r):
        return observed_pod(
            "t-generator-0",
            b.ROLE_GENERATOR,
            "rl",
            restart=r,
            phase="Failed",
            conditions=[{"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}],
        )

    def crashed(r):
        return observed_pod(
            "t-rl-0-x",
            b.ROLE_TRAINER,
            "rl",
            restart=r,
            phase="Failed",
            containers=[{"name": "trainer", "state": {"terminated": {"reason": "Error", "exitCode": 1}}}],
        )

    def step(prev, r, pod):
        return S.decide(
            REF, 1, sp, prev, observed(sp, [job("rl", restart=r, active=1)], [sts("rl", restart=r)], [pod]), NOW
        )

    d = step(running("rl"), 0, crashed(0))  # counted: 1 of 1
    assert (d.status["phase"], d.status["restarts"]) == ("Running", 1)
    d = step(d.status, 1, evicted(1))  # the limit is used up, but a disruption is not a failure
    assert d.status["phase"] == "Running" and (d.status["restarts"], d.status["disruptions"]) == (2, 1)
    assert "not counted" in d.events[0][2]
    d = step(d.status, 2, crashed(2))
    assert d.status["phase"] == "Failed" and d.status["reason"] == "BackoffLimitExceeded"
    assert "exit code 1" in d.status["message"]


def test_a_trainer_that_stopped_on_sigterm_after_saving_is_a_disruption_every_time():
    """Exit 75 (rlt.stages.preemption): the gang saved and stopped; however often, it never uses up backoffLimit."""
    sp = spec(sft=False, backoffLimit=0)

    def stopped(r, code=75):
        return observed_pod(
            "t-rl-0-x",
            b.ROLE_TRAINER,
            "rl",
            restart=r,
            phase="Failed",
            containers=[{"name": "trainer", "state": {"terminated": {"reason": "Error", "exitCode": code}}}],
        )

    prev = running("rl")
    for r in range(3):
        d = S.decide(REF, 1, sp, prev, observed(sp, [job("rl", restart=r, active=1)], [], [stopped(r)]), NOW)
        assert d.status["phase"] == "Running" and (d.status["restarts"], d.status["disruptions"]) == (r + 1, r + 1)
        assert "stopped on SIGTERM after saving a checkpoint (exit 75" in d.status["lastFailure"]
        assert ("delete", "jobs", "t-rl") in acts(d)
        prev = d.status
    d = S.decide(REF, 1, sp, prev, observed(sp, [job("rl", restart=3, active=1)], [], [stopped(3, 143)]), NOW)
    assert d.status["phase"] == "Failed" and d.status["reason"] == "BackoffLimitExceeded"  # a plain SIGTERM death
    rules = b.pod_failure_policy()["rules"]
    assert {"action": "Ignore", "onExitCodes": {"operator": "In", "values": [75]}} in rules


def test_pods_of_a_job_kueue_suspended_are_disruptions_not_failures():
    """Kueue evicts a workload by suspending its Job: the Job controller deletes the pods (no DisruptionTarget) and
    may count them failed. Three evictions with backoffLimit 0 leave the run Running; the restarts are uncounted."""
    sp = spec(sft=False, backoffLimit=0)

    def suspended_job(r, failed):
        body = {
            "metadata": {"name": "t-rl", "labels": b.labels("t", b.ROLE_TRAINER, "rl", r)},
            "spec": {"completions": 1, "suspend": True},
            "status": {
                "failed": failed,
                "conditions": [
                    {"type": "Suspended", "status": "True", "reason": "JobSuspended", "message": "Job suspended"}
                ],
            },
        }
        return summarize("jobs", body)

    def killed(r):  # SIGTERM outside the training loop: 143, no DisruptionTarget
        return observed_pod(
            "t-rl-0-x",
            b.ROLE_TRAINER,
            "rl",
            restart=r,
            phase="Failed",
            containers=[{"name": "trainer", "state": {"terminated": {"reason": "Error", "exitCode": 143}}}],
        )

    prev = running("rl")
    for r, (failed, pods) in enumerate([(0, [killed(0)]), (1, [killed(1)]), (1, [])]):
        d = S.decide(REF, 1, sp, prev, observed(sp, [suspended_job(r, failed)], [], pods), NOW)
        assert d.status["phase"] == "Running", d.status
        assert (d.status["restarts"], d.status["disruptions"]) == (r + 1, r + 1)
        assert "suspended (a Kueue eviction or preemption)" in d.status["lastFailure"]
        prev = d.status
    # the same pod end without a suspended Job is a failure: the limit applies
    d = S.decide(REF, 1, sp, prev, observed(sp, [job("rl", restart=3, active=1)], [], [killed(3)]), NOW)
    assert d.status["phase"] == "Failed" and d.status["reason"] == "BackoffLimitExceeded"


def test_a_restart_blocked_by_a_pod_stuck_terminating_says_so_once():
    """Gang 0's Job is being deleted (Foreground) and its pod never goes (NotReady node): the restart waits, and
    past the pod's deletionTimestamp (deletion + grace) PodsHealthy=False / PodStuckTerminating names the pod,
    its node and the way out, with one Warning Event; a pod still within its grace period is not reported."""
    sp = spec(sft=False)
    old_job = dict(job("rl", restart=0, active=1), deleting=True)

    def old_pod(deleted_ago: float) -> dict:
        body = pod_body("t-rl-0-abc", b.ROLE_TRAINER, "rl", restart=0, phase="Running")
        body["metadata"]["deletionTimestamp"] = format_time(NOW - dt.timedelta(seconds=deleted_ago))
        body["spec"] = {"nodeName": "gpu-node-7"}
        return summarize("pods", body)

    prev = running("rl", restarts=1)
    d = S.decide(REF, 1, sp, prev, observed(sp, [old_job], [], [old_pod(-300)]), NOW)  # within its grace
    assert not any(c.get("reason") == "PodStuckTerminating" for c in d.status["conditions"])
    assert not any(a.verb == "create" and a.plural == "jobs" for a in d.actions)  # the restart waits

    d = S.decide(REF, 1, sp, prev, observed(sp, [old_job], [], [old_pod(600)]), NOW)
    cond = next(c for c in d.status["conditions"] if c["type"] == "PodsHealthy")
    assert (cond["status"], cond["reason"]) == ("False", "PodStuckTerminating")
    for fragment in ("pod t-rl-0-abc", "gpu-node-7", "kubectl -n ns delete pod t-rl-0-abc --grace-period=0 --force"):
        assert fragment in cond["message"], cond["message"]
    assert [e for e in d.events if e[1] == "PodStuckTerminating"][0][0] == "Warning"
    assert not any(a.verb == "create" and a.plural == "jobs" for a in d.actions)
    later = NOW + dt.timedelta(minutes=5)
    d2 = S.decide(REF, 1, sp, d.status, observed(sp, [old_job], [], [old_pod(600)]), later)  # the same pod
    assert not [e for e in d2.events if e[1] == "PodStuckTerminating"], "one Event, not one per reconcile"


def shaped(stage, gpus, **kw):
    j = job(stage, **kw)
    j["labels"][b.L_SHAPE] = f"1x{gpus}"
    return j


def test_disabling_the_running_stage_stops_its_job_before_the_next_stage_starts():
    sp = spec(sft=False)
    sp["stages"]["rl"]["enabled"] = False
    d = S.decide(REF, 2, sp, running("rl"), observed(sp, [job("rl", active=1)]), NOW)
    assert d.status["stage"] == "distill"
    assert ("delete", "jobs", "t-rl") in acts(d) and ("create", "jobs", "t-distill") not in acts(d)
    gone = S.decide(REF, 2, sp, d.status, observed(sp, []), NOW)
    assert ("create", "jobs", "t-distill") in acts(gone)


def test_disabling_the_last_unfinished_stage_while_it_runs_stops_its_job_and_the_run_succeeds():
    """The run ends (every enabled stage finished); the disabled stage's Job must not keep its GPUs."""
    sp = spec(sft=False)
    sp["stages"]["distill"]["enabled"] = False
    prev = running("distill", completedStages=["rl"])
    d = S.decide(REF, 2, sp, prev, observed(sp, [job("rl", complete=True), job("distill", active=1)]), NOW)
    assert d.status["phase"] == "Succeeded"
    assert ("delete", "jobs", "t-distill") in acts(d), "the disabled stage's Job runs on after Succeeded"
    assert ("delete", "jobs", "t-rl") not in acts(d), "a finished Job is kept (its logs) until the TTL"
    sp["ttlSecondsAfterFinished"] = 0
    after = observed(sp, [job("rl", complete=True), job("distill")])
    after.services = {"t-distill": {"name": "t-distill", "labels": b.labels("t", b.ROLE_TRAINER, "distill", 0)}}
    later = S.decide(REF, 2, sp, d.status, after, NOW)
    assert {("delete", "jobs", "t-distill"), ("delete", "services", "t-distill")} <= acts(later), "the TTL takes it too"


def test_a_new_trainer_shape_replaces_the_gang_before_any_checkpoint_uncounted():
    sp = spec(sft=False, resources={"trainer": {"gpus": 4}})
    sp["stages"]["rl"]["perDeviceBatchSize"] = 1  # rl's 8 completions over 4 (or the kept 8) processes
    prev = running("rl", trainerShape={"stage": "rl", "nodes": 1, "gpus": 8})
    d = S.decide(REF, 2, sp, prev, observed(sp, [shaped("rl", 8, active=1)]), NOW)
    assert ("delete", "jobs", "t-rl") in acts(d) and d.status["restarts"] == 0
    assert d.status["trainerShape"] == {"stage": "rl", "nodes": 1, "gpus": 4}
    new = S.decide(REF, 2, sp, d.status, observed(sp, []), NOW)
    created = next(a for a in new.actions if a.verb == "create" and a.plural == "jobs")
    assert created.body["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"][b.GPU] == "4"


def test_the_trainer_shape_is_frozen_once_the_stage_has_a_checkpoint():
    sp = spec(sft=False, resources={"trainer": {"gpus": 4}})
    sp["stages"]["rl"]["perDeviceBatchSize"] = 1  # rl's 8 completions over 4 (or the kept 8) processes
    prev = running(
        "rl",
        trainerShape={"stage": "rl", "nodes": 1, "gpus": 8},
        progress={"step": 30, "lastCheckpoint": "/data/t/rl/checkpoints/checkpoint-25"},
    )
    d = S.decide(REF, 2, sp, prev, observed(sp, [shaped("rl", 8, active=1)]), NOW)
    assert not any(a.plural == "jobs" for a in d.actions), "no restart burnt on an edit ZeRO cannot resume"
    c = conds(d)["SpecApplied"]
    assert (c["status"], c["reason"]) == ("False", "ShapeFrozen") and "next stage" in c["message"]
    # a gang restart of the same stage keeps the checkpoint's shape
    restarted = dict(d.status, restarts=1)
    again = S.decide(REF, 2, sp, restarted, observed(sp, []), NOW)
    created = next(a for a in again.actions if a.verb == "create" and a.plural == "jobs")
    assert created.body["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"][b.GPU] == "8"


def test_a_run_finished_in_time_but_observed_after_its_deadline_succeeded():
    sp = spec(sft=False, distill=False, activeDeadlineSeconds=60)
    d = S.decide(REF, 1, sp, running("rl"), observed(sp, [job("rl", complete=True)]), NOW)
    assert d.status["phase"] == "Succeeded"


def test_conditions_describe_the_current_state_while_suspended_and_after_success():
    sp = spec(server=True, sft=False)
    waiting = S.decide(REF, 1, sp, running("rl"), observed(sp, [], [sts("rl", ready=0)]), NOW)
    assert "waiting for generators" in conds(waiting)["TrainerRunning"]["message"]
    susp = S.decide(REF, 2, spec(server=True, sft=False, suspend=True), waiting.status, observed(sp), NOW)
    c = conds(susp)
    assert (c["TrainerRunning"]["status"], c["TrainerRunning"]["reason"]) == ("False", "Suspended")
    assert "waiting" not in c["TrainerRunning"]["message"] and c["GeneratorsReady"]["reason"] == "Suspended"
    starting = S.decide(REF, 1, spec(sft=False, distill=False), running("rl"), observed(sp, [job("rl", active=1)]), NOW)
    assert conds(starting)["TrainerRunning"]["status"] == "False"  # no Running pod seen yet
    done = S.decide(
        REF, 1, spec(sft=False, distill=False), starting.status, observed(sp, [job("rl", complete=True)]), NOW
    )
    c = conds(done)["TrainerRunning"]
    assert done.status["phase"] == "Succeeded" and (c["reason"], c["message"]) == ("Finished", "run succeeded")


def test_outputs_appear_when_they_exist():
    sp = spec()
    d = S.decide(REF, 1, sp, None, Observed(), NOW)
    assert d.status["outputs"] == {}
    d = S.decide(REF, 1, sp, running("rl", completedStages=["sft"]), observed(sp), NOW)
    assert d.status["outputs"] == {"teacherCheckpoint": "/data/t/sft/model"}


def test_last_failure_stays_after_the_restart():
    sp = spec(server=True, sft=False)
    d = S.decide(REF, 1, sp, running("rl"), observed(sp, [job("rl", failed=True)], [sts("rl")]), NOW)
    assert d.status["restarts"] == 1 and d.status["lastFailure"]
    after = S.decide(REF, 1, sp, d.status, observed(sp), NOW)
    assert after.status["lastFailure"] == d.status["lastFailure"]
    assert "lastFailure" not in W.merge_patch(d.status, after.status)


def test_each_stage_start_finish_and_trainer_creation_has_an_event():
    sp = spec(sft=True, distill=False)
    d = S.decide(REF, 1, sp, running("sft"), observed(sp, [job("sft", complete=True)]), NOW)
    reasons = [(e[1], e[2]) for e in d.events]
    assert ("StageCompleted", "stage sft completed") in reasons and ("StageStarted", "stage rl started") in reasons
    assert ("TrainerCreated", "stage rl: trainer Job t-rl created (gang 0)") in reasons
    assert E.events_for(d, []) == [e for e in d.events if e[1] != "TrainerCreated"], "no Event for a create not sent"


def test_a_volume_that_cannot_attach_is_a_condition():
    sp = spec(sft=False)

    def stuck_for(seconds):
        since = format_time(NOW - dt.timedelta(seconds=seconds))
        return observed_pod(
            "t-rl-0-x",
            b.ROLE_TRAINER,
            "rl",
            phase="Pending",
            conditions=[
                {"type": "PodScheduled", "status": "True"},
                {"type": "PodReadyToStartContainers", "status": "False", "lastTransitionTime": since},
            ],
        )

    def seen(pods):
        o = observed(sp, [job("rl", active=1)], pods=pods)
        o.persistentvolumeclaims["t-data"]["phase"] = "Bound"  # bound: the claim is fine, its attachment is not
        return o

    early = S.decide(REF, 1, sp, running("rl"), seen([stuck_for(30)]), NOW)
    assert conds(early)["VolumeReady"]["status"] == "True", "a minute of attaching is normal"
    late = S.decide(REF, 1, sp, early.status, seen([stuck_for(600)]), NOW)
    c = conds(late)["VolumeReady"]
    assert (c["status"], c["reason"]) == ("False", "VolumeNotAttached") and format_time(NOW) == c["lastTransitionTime"]
    assert format_time(NOW - dt.timedelta(seconds=600)) in c["message"], "since when it waits"
    assert late.status["reason"] == "VolumeNotAttached"
    assert ("Warning", "VolumeNotAttached") in [e[:2] for e in late.events]
    # Still stuck a few minutes on: the same condition, the same transition time, no second Event.
    then = NOW + dt.timedelta(minutes=3)
    still = S.decide(REF, 1, sp, late.status, seen([stuck_for(600)]), then)  # the same pod, since the same time
    assert conds(still)["VolumeReady"] == c, "the condition flapped through True, or its message changed"
    assert "VolumeNotAttached" not in [e[1] for e in still.events], "one Event while it lasts, not one a reconcile"
    attached = S.decide(REF, 1, sp, still.status, seen([]), then)
    assert (conds(attached)["VolumeReady"]["status"], attached.status.get("reason")) == ("True", None)


def state(d, type_="StagesCurrent"):
    c = conds(d)[type_]
    return c["status"], c["reason"]


def test_a_finished_stage_records_its_spec_and_a_later_edit_is_reported_not_applied():
    sp = spec(sft=False)
    d = S.decide(REF, 1, sp, running("rl"), observed(sp, jobs=[job("rl", complete=True)]), NOW)
    record = d.status["stageSpecs"]["rl"]
    assert json.loads(record["fields"])["stages.rl.steps"] == sp["stages"]["rl"]["steps"]
    assert state(d) == ("True", "Current")

    # A field rl's output does not depend on (checkpoint cadence): nothing to report.
    cadence = spec(sft=False)
    cadence["stages"]["rl"]["saveSteps"] = 7
    again = S.decide(REF, 2, cadence, d.status, observed(cadence, jobs=[job("rl", complete=True)]), NOW)
    assert state(again) == ("True", "Current")

    edited = spec(sft=False)
    edited["stages"]["rl"]["steps"] = sp["stages"]["rl"]["steps"] + 1
    e = S.decide(REF, 3, edited, d.status, observed(edited, jobs=[job("rl", complete=True)]), NOW)
    steps = sp["stages"]["rl"]["steps"]
    message = next(c["message"] for c in e.status["conditions"] if c["type"] == "StagesCurrent")
    assert state(e) == ("False", "FinishedStageEdited")
    assert f"stage rl finished under a different spec (stages.rl.steps {steps} -> {steps + 1})" in message
    assert ("Warning", "FinishedStageEdited", message) in e.events
    assert e.status["stageSpecs"]["rl"] == record, "the record keeps the spec the stage finished under"
    assert not any(a.name == "t-rl" for a in e.actions), "a finished stage is not run again"
    # Reported once: the next reconcile under the same edit posts no second Event; restoring clears it.
    assert not [
        ev
        for ev in S.decide(REF, 3, edited, e.status, observed(edited, jobs=[job("rl", complete=True)]), NOW).events
        if ev[1] == "FinishedStageEdited"
    ]
    back = S.decide(REF, 4, sp, e.status, observed(sp, jobs=[job("rl", complete=True)]), NOW)
    assert state(back) == ("True", "Current")


def test_merge_patch_removes_keys_gone_from_a_map():
    assert W.merge_patch({"stageSpecs": {"sft": 1, "rl": 2}}, {"stageSpecs": {"rl": 2}}) == {
        "stageSpecs": {"sft": None, "rl": 2}
    }


def test_a_previous_status_with_what_this_operator_no_longer_writes_is_read_not_refused():
    """decide() reads the previous status into the typed model: a condition type an older operator wrote, or a field
    the model does not know, is dropped (the written status replaces the list), never a reconcile that fails forever."""
    sp = spec(sft=False)
    old = {"type": "TrainerHealthy", "status": "True", "reason": "Old", "message": "x", "lastTransitionTime": T0}
    prev = running("rl", conditions=[old], someOldField=1)
    d = S.decide(REF, 1, sp, prev, observed(sp, [job("rl", active=1)]), NOW)
    assert "TrainerHealthy" not in conds(d) and "someOldField" not in d.status
    assert conds(d)["TrainerRunning"]["status"] == "False" and d.status["phase"] == "Running"
    patch = W.merge_patch(prev, d.status)
    assert [c["type"] for c in patch["conditions"]] == [c["type"] for c in d.status["conditions"]]


# --------------------------------------------------------------------------- the steps of decide, one table each


def carried(prev=None, generation=1):
    return S.carried_status(prev or {}, generation)


@pytest.mark.parametrize(
    "prev, phase, reason, held",
    [
        ({}, "Pending", None, False),  # a valid spec: SpecValid True, nothing held
        ({"phase": "Failed", "reason": "InvalidSpec", "message": "x"}, "Pending", None, False),  # older operator's
        ({"phase": "Succeeded", "reason": "Succeeded", "message": "m"}, "Succeeded", "Succeeded", False),
    ],
)
def test_step_valid_spec(prev, phase, reason, held):
    st = carried(prev)
    assert S.valid_spec(REF, spec(), st, NOW) is not None
    assert (st.phase, st.reason) == (phase, reason)
    assert [c.status for c in st.conditions if c.type == "SpecValid"] == ["True"]
    bad = carried(prev)
    assert S.valid_spec(REF, spec(backoffLimit=-1), bad, NOW) is None
    assert [c.status for c in bad.conditions if c.type == "SpecValid"] == ["False"]
    assert bad.reason == (reason if phase == "Succeeded" else "InvalidSpec"), "a terminal run keeps its reason"


@pytest.mark.parametrize(
    "sp, prev, done, ended, phase, reason",
    [
        (spec(sft=False, distill=False), running("rl"), ["rl"], True, "Succeeded", "Succeeded"),
        (spec(sft=False, distill=False, activeDeadlineSeconds=60), running("rl"), ["rl"], True, "Succeeded", None),
        (spec(sft=False, activeDeadlineSeconds=60), running("rl"), [], True, "Failed", "DeadlineExceeded"),
        (spec(sft=False, activeDeadlineSeconds=60, suspend=True), running("rl"), [], False, "Running", None),
        (spec(sft=False, activeDeadlineSeconds=6000), running("rl"), [], False, "Running", None),
        (spec(sft=False), {"phase": "Failed", "reason": "ConfigError"}, [], True, "Failed", "ConfigError"),
    ],
)
def test_step_run_ended(sp, prev, done, ended, phase, reason):
    st = carried(prev)
    assert S.run_ended(parse_spec(sp), st, done, NOW) is ended
    assert st.phase == phase
    assert reason is None or st.reason == reason


@pytest.mark.parametrize(
    "prev, done, stage, progress_kept",
    [
        (running("rl", progress={"step": 3}), [], "rl", True),
        (running("sft", progress={"step": 3}), [], "rl", False),  # sft disabled meanwhile: rl starts afresh
        (running("rl", progress={"step": 3}), ["rl"], "distill", False),
    ],
)
def test_step_current_stage(prev, done, stage, progress_kept):
    st = carried(prev)
    assert S.current_stage(parse_spec(spec(sft=False)), st, done) == stage
    assert st.stage == stage and (st.progress.step == 3) is progress_kept


@pytest.mark.parametrize(
    "jobs, stopped",
    [
        ([job("rl", active=1)], []),
        ([job("sft", active=1)], ["t-sft"]),
        ([job("sft", complete=True)], []),
        ([{**job("sft", active=1), "deleting": True}], []),
    ],
)
def test_step_stop_other_stages(jobs, stopped):
    sp = spec()
    plan = D.Plan(observed(sp, jobs))
    assert S.stop_other_stages(REF, "rl", plan.obs, plan) == stopped
    assert [(a.verb, a.name) for a in plan.actions] == [("delete", n) for n in stopped]


@pytest.mark.parametrize(
    "sp, prev, requeue, phase",
    [
        (spec(), running("rl"), None, "Running"),
        (spec(activeDeadlineSeconds=900), running("rl"), 300.0, "Running"),  # started 10 min ago
        (spec(activeDeadlineSeconds=900), {"phase": "Suspended"}, 900.0, "Pending"),  # the clock starts again
    ],
)
def test_step_activate(sp, prev, requeue, phase):
    st = carried(prev)
    assert S.activate(parse_spec(sp), st, NOW) == requeue
    assert st.phase == phase and st.start_time is not None and st.reason is None


@pytest.mark.parametrize(
    "prev, jobs, stss, waiting, has_job, has_sts",
    [
        (running("rl"), [job("rl", active=1)], [sts("rl")], False, True, True),
        (running("rl", 1), [job("rl", active=1)], [sts("rl")], True, False, False),  # an older gang
        (running("rl"), [job("rl", active=1)], [sts("sft")], True, True, False),  # generators of another stage
        (running("rl"), [{**job("rl", active=1), "deleting": True}], [], True, False, False),
    ],
)
def test_step_gang_children(prev, jobs, stss, waiting, has_job, has_sts):
    sp = spec(server=True, sft=False)
    st = carried(prev)
    plan = D.Plan(observed(sp, jobs, stss))
    g = G.gang_children(REF, parse_spec(sp), "rl", st, plan.obs, plan, [], NOW)
    assert (g.waiting, g.job is not None, g.sts is not None) == (waiting, has_job, has_sts)
    assert g.gens_needed and g.job_name == "t-rl" and st.phase == "Running"


@pytest.mark.parametrize(
    "restarts, failed, limit, outcome, phase",
    [
        (0, False, 1, None, "Running"),
        (0, True, 1, G.RESTART, "Running"),
        (1, True, 1, "Failed", "Failed"),
    ],
)
def test_step_gang_outcome(restarts, failed, limit, outcome, phase):
    sp = parse_spec(spec(server=True, sft=False, backoffLimit=limit))
    st = carried(running("rl", restarts))
    plan = D.Plan(observed(spec(), [job("rl", restart=restarts, active=1, failed=failed)]))
    g = G.gang_children(REF, sp, "rl", st, plan.obs, plan, [], NOW)
    assert G.gang_outcome(REF, sp, g, st, plan.obs, plan, NOW) == outcome
    assert st.phase == phase
    assert st.restarts == restarts + (outcome == G.RESTART)


@pytest.mark.parametrize(
    "progress, stage, step, of",
    [
        ({"stage": "rl", "step": 3, "totalSteps": 40}, "rl", 3, "3/40"),
        ({"stage": "sft", "step": 3, "totalSteps": 40}, "rl", None, None),  # another stage's read is not ours
        ({"stage": "rl", "step": 5}, "rl", 5, "5"),
        (None, "rl", None, None),
    ],
)
def test_step_read_progress(progress, stage, step, of):
    st = carried(running(stage))
    R.read_progress(progress, stage, st, NOW)
    assert (st.progress.step, st.progress.step_of_total) == (step, of)


def test_step_time_moves_with_the_step_only_and_a_restarted_operator_keeps_the_stall_clock():
    """RLTRunStalled measures from the last step change. The status keeps its time (progress.stepTime), so an
    operator that restarts (a new Metrics) starts the clock from there, not from its own start: a run stalled for
    20 minutes is not given a fresh window."""
    from prometheus_client import CollectorRegistry

    from rlt.contract import metrics as catalogue
    from rlt.contract.layout import parse_time
    from rlt_operator.cluster.operator_metrics import OperatorMetrics

    st = carried(running("rl"))
    R.read_progress({"stage": "rl", "step": 3}, "rl", st, NOW)
    assert parse_time(st.progress.step_time) == NOW
    later = NOW + dt.timedelta(minutes=20)
    R.read_progress({"stage": "rl", "step": 3}, "rl", st, later)  # read again, no step: the clock stays
    assert parse_time(st.progress.step_time) == NOW
    R.read_progress({"stage": "rl", "step": 4}, "rl", st, later)
    assert parse_time(st.progress.step_time) == later

    status = st.model_dump(by_alias=True, exclude_none=True, mode="json")
    status["progress"]["stepTime"] = format_time(NOW)  # stalled since NOW
    registry = CollectorRegistry()
    OperatorMetrics(registry).run("team", "r1", status, "rlt")  # the first sight of the run by a new operator process
    clock = registry.get_sample_value(catalogue.RUN_STEP_TIME, {"namespace": "team", "run": "r1"})
    assert clock == NOW.timestamp()


# --------------------------------------------------------------------------- restarts: back-off and the failing pod


def crashed_trainer(restart, line="RuntimeError: CUDA error: an illegal memory access was encountered"):
    return observed_pod(
        "t-rl-0-x",
        b.ROLE_TRAINER,
        "rl",
        restart=restart,
        phase="Failed",
        containers=[
            {"name": "trainer", "state": {"terminated": {"reason": "Error", "exitCode": 1, "message": f"...\n{line}"}}}
        ],
    )


@pytest.mark.parametrize("failures, delay", [(1, 10.0), (2, 20.0), (3, 40.0), (6, 300.0), (40, 300.0)])
def test_restart_back_off_doubles_per_counted_failure_and_is_capped(failures, delay):
    assert G.restart_delay(failures) == delay
    assert G.restart_delay(0) == 0.0


def test_a_failed_gang_is_followed_by_the_next_only_after_the_back_off():
    sp = spec(sft=False, backoffLimit=3)
    d = S.decide(REF, 1, sp, running("rl"), observed(sp, [job("rl", active=1)], [], [crashed_trainer(0)]), NOW)
    assert d.status["restarts"] == 1 and d.status["backoffUntil"] == format_time(NOW + dt.timedelta(seconds=10))
    assert "not before " + d.status["backoffUntil"] in next(e[2] for e in d.events if e[1] == "GangRestart")
    # The old gang is gone 4 s later: nothing is created before the back-off ends, and the run says why.
    later = NOW + dt.timedelta(seconds=4)
    w = S.decide(REF, 1, sp, d.status, observed(sp), later)
    assert not any(a.plural == "jobs" for a in w.actions) and w.requeue_after == pytest.approx(6.0)
    trainer = next(c for c in w.status["conditions"] if c["type"] == "TrainerRunning")
    assert "waits 6s" in trainer["message"] and "back-off" in trainer["message"]
    go = S.decide(REF, 1, sp, w.status, observed(sp), NOW + dt.timedelta(seconds=10))
    assert ("create", "jobs", "t-rl") in acts(go) and "backoffUntil" not in go.status
    # A second counted failure waits twice as long.
    d2 = S.decide(REF, 1, sp, go.status, observed(sp, [job("rl", 1, active=1)], [], [crashed_trainer(1)]), later)
    assert d2.status["backoffUntil"] == format_time(later + dt.timedelta(seconds=20))


def test_a_disruption_restarts_without_back_off():
    sp = spec(sft=False)
    evicted = observed_pod(
        "t-rl-0-x",
        b.ROLE_TRAINER,
        "rl",
        phase="Failed",
        conditions=[{"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}],
    )
    d = S.decide(REF, 1, sp, running("rl"), observed(sp, [job("rl", active=1)], [], [evicted]), NOW)
    assert d.status["restarts"] == 1 and "backoffUntil" not in d.status
    assert ("create", "jobs", "t-rl") in acts(S.decide(REF, 1, sp, d.status, observed(sp), NOW))


def test_the_failed_message_and_event_carry_the_pods_exit_code_and_last_line():
    sp = spec(sft=False, backoffLimit=0)
    obs = observed(sp, [job("rl", active=0, failed=True)], [], [crashed_trainer(0)])
    d = S.decide(REF, 1, sp, running("rl"), obs, NOW)
    assert d.status["reason"] == "BackoffLimitExceeded"
    said = "pod t-rl-0-x exit code 1: RuntimeError: CUDA error: an illegal memory access was encountered"
    assert said in d.status["message"]
    assert any(e[1] == "BackoffLimitExceeded" and said in e[2] for e in d.events)


def kept(pod, uid="u1"):
    """A pod as observed once the run owns it (kept for its logs)."""
    return {**pod, "owner": uid}


def test_the_failed_gangs_failed_pod_is_handed_to_the_run_before_its_job_is_deleted_and_only_the_last_is_kept():
    sp = spec(sft=False, backoffLimit=1)
    # the Job controller's tracking finalizer beside someone else's: only the Job's goes (a real 1.36 control plane
    # never lifts it from a pod another kind controls, tests/real_cluster)
    finalizers = ["batch.kubernetes.io/job-tracking", "example.com/audit"]
    job_owned = {**crashed_trainer(0), "owner": "job-uid-0", "finalizers": finalizers}
    d = S.decide(REF, 1, sp, running("rl"), observed(sp, [job("rl", active=1)], [], [job_owned]), NOW)
    assert d.status["restarts"] == 1 and d.status["lastFailedPod"] == "t-rl-0-x"
    patch = next(a for a in d.actions if (a.verb, a.plural) == ("patch", "pods"))
    assert patch.name == "t-rl-0-x"
    owners = patch.body["metadata"]["ownerReferences"]
    assert [(o["kind"], o["uid"], o["controller"]) for o in owners] == [("RLTRun", "u1", True)]  # not its Job's
    assert patch.body["metadata"]["finalizers"] == ["example.com/audit"]
    order = [(a.verb, a.plural) for a in d.actions]
    assert order.index(("patch", "pods")) < order.index(("delete", "jobs"))  # kept before the Job goes
    assert any(e[1] == "GangRestart" and "kubectl -n ns logs t-rl-0-x" in e[2] for e in d.events)
    # Later reconciles keep it, and do not patch it again.
    again = S.decide(REF, 1, sp, d.status, observed(sp, [], [], [kept(crashed_trainer(0))]), NOW)
    assert not [a for a in again.actions if a.plural == "pods"] and again.status["lastFailedPod"] == "t-rl-0-x"
    # The next gang fails too (the run fails): its pod is kept, the one kept before is deleted.
    second = {**crashed_trainer(1), "name": "t-rl-0-y", "owner": "job-uid-1"}
    obs = observed(sp, [job("rl", 1, active=0, failed=True)], [], [kept(crashed_trainer(0)), second])
    f = S.decide(REF, 1, sp, {k: v for k, v in d.status.items() if k != "backoffUntil"}, obs, NOW)
    assert f.status["phase"] == "Failed" and f.status["lastFailedPod"] == "t-rl-0-y"
    assert ("patch", "pods", "t-rl-0-y") in acts(f) and ("delete", "pods", "t-rl-0-x") in acts(f)
    assert any(e[1] == "BackoffLimitExceeded" and "kubectl -n ns logs t-rl-0-y" in e[2] for e in f.events)
    # A kept pod someone deleted is no longer named.
    gone = S.decide(REF, 1, sp, f.status, observed(sp, [job("rl", 1, active=0, failed=True)]), NOW)
    assert "lastFailedPod" not in gone.status
    # A pod of someone else's (another run's) is never deleted as a kept one.
    other = S.decide(REF, 1, sp, f.status, observed(sp, [], [], [kept(crashed_trainer(0), uid="u2")]), NOW)
    assert not [a for a in other.actions if a.plural == "pods"]


def test_a_generator_pod_is_not_kept_its_fixed_name_would_block_the_statefulset():
    sp = spec(server=True, sft=False)
    gen = observed_pod("t-generator-0", b.ROLE_GENERATOR, "rl", phase="Failed")
    d = S.decide(REF, 1, sp, running("rl"), observed(sp, [job("rl", active=1)], [sts("rl")], [gen]), NOW)
    assert d.status["restarts"] == 1 and "lastFailedPod" not in d.status
    assert not [a for a in d.actions if a.plural == "pods"]


# --------------------------------------------------------------------------- honest status


def with_snapshot(j, sp):
    """A Job as observed, with the spec its gang was created with (its pods' RLT_RUN_YAML)."""
    return {**j, "snapshot": b.pod_config(REF, parse_spec(sp))}


def edited_lr(lr=5e-5, **kw):
    sp = spec(sft=False, **kw)
    sp["stages"]["rl"]["learningRate"] = lr
    return sp


def test_the_observed_job_carries_its_gangs_snapshot():
    sp = spec(sft=False)
    manifest = b.trainer_job(REF, parse_spec(sp), "rl", 0)
    assert summarize("jobs", manifest)["snapshot"] == b.pod_config(REF, parse_spec(sp))
    assert R.gang_spec(summarize("jobs", manifest)).stages.rl.learning_rate == parse_spec(sp).stages.rl.learning_rate


def test_a_finished_stage_records_the_spec_its_gang_ran_not_the_current_one():
    """An accepted mid-stage edit never reached the gang: the stage finished under the gang's snapshot. The edit is
    reported, and restoring the truth is not."""
    ran, now = spec(sft=False), edited_lr()
    done = [with_snapshot(job("rl", complete=True), ran)]
    d = S.decide(REF, 2, now, running("rl"), observed(now, done), NOW)
    assert (
        json.loads(d.status["stageSpecs"]["rl"]["fields"])["stages.rl.learningRate"]
        == ran["stages"]["rl"]["learningRate"]
    )
    assert (
        state(d) == ("False", "FinishedStageEdited")
        and "stages.rl.learningRate" in conds(d)["StagesCurrent"]["message"]
    )
    restored = S.decide(REF, 3, ran, d.status, observed(ran, done), NOW)
    assert state(restored) == ("True", "Current")


def test_an_accepted_edit_the_running_gang_does_not_run_yet_is_spec_applied_false():
    ran = spec(sft=False)
    running_job = [with_snapshot(job("rl", active=1), ran)]
    same = S.decide(REF, 1, ran, running("rl"), observed(ran, running_job), NOW)
    assert "SpecApplied" not in conds(same)
    edit = edited_lr()
    d = S.decide(REF, 2, edit, same.status, observed(edit, running_job), NOW)
    assert state(d, "SpecApplied") == ("False", "PendingGangRestart")
    message = conds(d)["SpecApplied"]["message"]
    assert "stages.rl.learningRate" in message and "5e-05" in message and "next gang restart" in message
    assert d.status["observedGeneration"] == 2, "accepted: observedGeneration says so; SpecApplied says not yet"
    # What the operator applies at once is never pending.
    at_once = spec(sft=False, backoffLimit=7, activeDeadlineSeconds=99999)
    assert "SpecApplied" not in conds(S.decide(REF, 3, at_once, running("rl"), observed(at_once, running_job), NOW))
    # A logging cadence leaves finished stages current, yet the running gang still logs at its old one: pending.
    cadence = spec(sft=False)
    cadence["stages"]["rl"]["loggingSteps"] = 7
    c = S.decide(REF, 3, cadence, same.status, observed(cadence, running_job), NOW)
    assert state(c, "SpecApplied") == ("False", "PendingGangRestart")
    assert "stages.rl.loggingSteps" in conds(c)["SpecApplied"]["message"]
    # The next gang runs the edit: applied.
    next_gang = [with_snapshot(job("rl", active=1), edit)]
    applied = S.decide(REF, 3, edit, d.status, observed(edit, next_gang), NOW)
    assert state(applied, "SpecApplied") == ("True", "Applied")


def test_an_invalid_spec_still_reads_progress_and_a_finished_stage():
    ran = spec(sft=False)
    bad = spec(sft=False, format={"preset": "rcl-default"})
    live = [with_snapshot(job("rl", active=1), ran)]
    d = S.decide(REF, 2, bad, running("rl"), observed(ran, live), NOW, {"stage": "rl", "step": 30, "totalSteps": 40})
    assert d.status["reason"] == "InvalidSpec" and d.status["progress"]["stepOfTotal"] == "30/40"
    finished = [with_snapshot(job("rl", complete=True), ran)]
    f = S.decide(REF, 2, bad, d.status, observed(ran, finished), NOW)
    assert f.status["completedStages"] == ["rl"] and f.actions == []
    assert (
        state(f, "TrainerRunning") == ("False", "Held")
        and "waits for a valid spec" in conds(f)["TrainerRunning"]["message"]
    )
    assert (
        json.loads(f.status["stageSpecs"]["rl"]["fields"])["stages.rl.learningRate"]
        == ran["stages"]["rl"]["learningRate"]
    )
    assert ("Normal", "StageCompleted", "stage rl completed") in f.events
    fixed = S.decide(REF, 3, ran, f.status, observed(ran, finished), NOW)
    assert fixed.status["stage"] == "distill"


@pytest.mark.parametrize(
    "sp, jobs, stss, pods, reason",
    [
        (spec(sft=False), [job("rl", active=1)], [], [], "WaitingForPods"),
        (spec(sft=False), [job("rl", active=1)], [], [observed_pod("t-rl-0-x", b.ROLE_TRAINER, "rl")], "Running"),
        (spec(sft=False), [], [], [], "WaitingForPods"),  # the trainer Job is being created
        (spec(server=True, sft=False), [], [sts("rl", ready=0)], [], "WaitingForGenerators"),
        (spec(sft=False), [{**job("rl", active=0), "suspended": True}], [], [], "WaitingForAdmission"),
    ],
)
def test_the_trainer_column_tells_training_from_waiting(sp, jobs, stss, pods, reason):
    d = S.decide(REF, 1, sp, running("rl"), observed(sp, jobs, stss, pods), NOW)
    assert d.status["phase"] == "Running" and state(d, "TrainerRunning")[1] == reason
    back_off = S.decide(
        REF, 1, sp, running("rl", 1, backoffUntil=format_time(NOW + dt.timedelta(seconds=5))), observed(sp), NOW
    )
    assert state(back_off, "TrainerRunning") == ("False", "RestartBackOff")


def test_stage_specs_stay_compact_for_kubectl_describe_and_an_older_map_is_read():
    sp = spec(sft=False)
    d = S.decide(REF, 1, sp, running("rl"), observed(sp, jobs=[job("rl", complete=True)]), NOW)
    shown = yaml.safe_dump(d.status["stageSpecs"], width=10**6)
    assert len(shown.splitlines()) == 3, shown  # rl:, fields: {...} on one line, fingerprint
    older = dict(d.status["stageSpecs"]["rl"])
    older["fields"] = {k: json.dumps(v) for k, v in json.loads(older["fields"]).items()}  # an older operator's map
    again = S.decide(
        REF, 1, sp, {**d.status, "stageSpecs": {"rl": older}}, observed(sp, jobs=[job("rl", complete=True)]), NOW
    )
    assert again.status["stageSpecs"] == d.status["stageSpecs"] and state(again) == ("True", "Current")


def test_logging_cadence_is_recorded_but_no_edit_of_a_finished_stage():
    sp = spec(sft=False)
    d = S.decide(REF, 1, sp, running("rl"), observed(sp, jobs=[job("rl", complete=True)]), NOW)
    assert "stages.rl.loggingSteps" in json.loads(d.status["stageSpecs"]["rl"]["fields"])  # as an older operator's
    logged = spec(sft=False)
    logged["stages"]["rl"]["loggingSteps"] = 5
    again = S.decide(REF, 2, logged, d.status, observed(logged, jobs=[job("rl", complete=True)]), NOW)
    assert state(again) == ("True", "Current"), conds(again)["StagesCurrent"]["message"]
