"""Pure decisions: (spec, previous status, observed children, now) → status, actions, events."""

from __future__ import annotations

import datetime as dt

import pytest
import yaml
from op_harness import EXAMPLES

from rlt_operator import builders as b
from rlt_operator import status as S

REF = b.RunRef(name="t", namespace="ns", uid="u1")
NOW = dt.datetime(2026, 1, 1, 12, 0, 0, tzinfo=dt.timezone.utc)
T0 = S.fmt_time(NOW - dt.timedelta(minutes=10))


def spec(server=False, sft=True, distill=True, **extra):
    s = yaml.safe_load((EXAMPLES / "rltrun-tiny.yaml").read_text())["spec"]
    s["stages"]["sft"]["enabled"] = sft
    s["stages"]["distill"]["enabled"] = distill
    if server:
        s["stages"]["rl"]["generation"] = {"mode": "server"}
        s["resources"] = {"generator": {"replicas": 1, "gpus": 2, "dataParallelSize": 2}}
    s.update(extra)
    return s


def job(stage, restart=0, active=0, complete=False, failed=False):
    conds = [{"type": "Complete", "status": "True"}] if complete else []
    conds += [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "x"}] if failed else []
    return {"name": f"t-{stage}", "labels": b.labels("t", b.ROLE_TRAINER, stage, restart), "deleting": False,
            "completions": 1, "active": active, "succeeded": 1 if complete else 0, "failed": 1 if failed else 0,
            "conditions": conds}


def sts(stage, restart=0, ready=1):
    return {"name": "t-generator", "labels": b.labels("t", b.ROLE_GENERATOR, stage, restart), "deleting": False,
            "replicas": 1, "readyReplicas": ready}


def base_children(sp):
    cm = b.configmap(REF, S.parse_spec(sp))
    return {"configmaps": {"t-config": {"name": "t-config", "labels": {}, "configHash":
                                        cm["metadata"]["annotations"][b.A_CONFIG_HASH]}},
            "persistentvolumeclaims": {"t-data": {"name": "t-data", "labels": {}}}}


def observed(sp, jobs=(), statefulsets=(), pods=()):
    return S.Observed(**base_children(sp), jobs={j["name"]: j for j in jobs},
                      statefulsets={s["name"]: s for s in statefulsets}, pods=list(pods))


def running(stage, restarts=0, **more):
    return {"phase": "Running", "stage": stage, "restarts": restarts, "startTime": T0, **more}


def acts(decision):
    return {(a.verb, a.plural, a.name) for a in decision.actions}


def test_fresh_run_creates_run_wide_children_and_first_stage():
    d = S.decide(REF, 1, spec(), None, S.Observed(), NOW)
    assert acts(d) == {("create", "configmaps", "t-config"), ("create", "persistentvolumeclaims", "t-data"),
                       ("create", "services", "t-sft"), ("create", "jobs", "t-sft")}
    assert d.status["phase"] == "Pending" and d.status["stage"] == "sft"
    assert d.status["startTime"] == S.fmt_time(NOW) and d.status["observedGeneration"] == 1
    assert ("Normal", "StageStarted", "stage sft started") in d.events


# (name, spec, prev status, jobs, statefulsets, expected actions, expected phase, expected stage)
TABLE = [
    ("generators first", spec(server=True, sft=False), running("rl"), [], [],
     {("create", "services", "t-generator"), ("create", "statefulsets", "t-generator")}, "Running", "rl"),
    ("trainer waits for readiness", spec(server=True, sft=False), running("rl"), [], [sts("rl", ready=0)],
     {("create", "services", "t-generator")}, "Running", "rl"),
    ("trainer once ready", spec(server=True, sft=False), running("rl"), [], [sts("rl")],
     {("create", "services", "t-generator"), ("create", "services", "t-rl"), ("create", "jobs", "t-rl")},
     "Running", "rl"),
    ("sft done → rl", spec(server=True), running("sft"), [job("sft", complete=True)], [],
     {("create", "services", "t-generator"), ("create", "statefulsets", "t-generator")}, "Running", "rl"),
    ("stale generators of rl during distill", spec(server=True), running("rl"),
     [job("sft", complete=True), job("rl", complete=True)], [sts("rl")],
     {("delete", "statefulsets", "t-generator"), ("create", "services", "t-generator")}, "Running", "distill"),
    ("older gang deleted, nothing created yet", spec(server=True, sft=False), running("rl", restarts=1),
     [job("rl", restart=0, active=1)], [sts("rl", restart=0)],
     {("delete", "jobs", "t-rl"), ("delete", "statefulsets", "t-generator"), ("create", "services", "t-generator")},
     "Running", "rl"),
    ("all done → Succeeded, generators freed, Jobs kept", spec(server=True, sft=False, distill=False), running("rl"),
     [job("rl", complete=True)], [sts("rl")], {("delete", "statefulsets", "t-generator")}, "Succeeded", ""),
    ("inprocess generation: no generators", spec(sft=False), running("rl"), [], [],
     {("create", "services", "t-rl"), ("create", "jobs", "t-rl")}, "Running", "rl"),
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
        assert d.events[0][:2] == ("Warning", "GangRestart") and d.requeue_after == S.SOON
        assert not any(a.verb == "create" for a in d.actions)
    else:
        assert d.status["reason"] == "BackoffLimitExceeded" and d.status["restarts"] == restarts
        assert ("delete", "statefulsets", "t-generator") in acts(d)
        assert ("delete", "jobs", "t-rl") not in acts(d), "a failed trainer's pods stay for their logs"


def test_generator_restart_in_current_gang_counts_but_old_gang_pods_do_not():
    sp = spec(server=True, sft=False)
    pod = {"name": "t-generator-0", "labels": b.labels("t", b.ROLE_GENERATOR, "rl", 0), "phase": "Running",
           "restarts": 2}
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
    early = S.decide(REF, 1, spec(sft=False, activeDeadlineSeconds=3600), running("rl"),
                     observed(sp, [job("rl", active=1)]), NOW)
    assert early.status["phase"] == "Running" and early.requeue_after == pytest.approx(3000)


def test_ttl_after_finished():
    sp = spec(sft=False, distill=False, ttlSecondsAfterFinished=300)
    done = {"phase": "Succeeded", "stage": "", "completionTime": S.fmt_time(NOW - dt.timedelta(seconds=100)),
            "completedStages": ["rl"]}
    d = S.decide(REF, 1, sp, done, observed(sp, [job("rl", complete=True)]), NOW)
    assert acts(d) == set() and d.requeue_after == pytest.approx(200)
    later = S.decide(REF, 1, sp, done, observed(sp, [job("rl", complete=True)]), NOW + dt.timedelta(seconds=201))
    assert ("delete", "jobs", "t-rl") in acts(later)
    assert later.status["phase"] == "Succeeded"


def test_invalid_spec_names_the_field_and_is_sticky():
    bad = spec()
    bad["stages"]["rl"]["numGenerations"] = 3
    d = S.decide(REF, 1, bad, None, S.Observed(), NOW)
    assert d.status["phase"] == "Failed" and d.status["reason"] == "InvalidSpec"
    assert d.status["message"].startswith("spec.stages.rl") and "numGenerations (3)" in d.status["message"]
    assert d.actions == []
    again = S.decide(REF, 2, spec(), d.status, S.Observed(), NOW)
    assert again.status["phase"] == "Failed", "terminal phases stick (like a Job's)"


def test_completed_stage_remembered_after_its_job_is_gone():
    sp = spec(sft=True, distill=False)
    d = S.decide(REF, 1, sp, running("rl", completedStages=["sft"]), observed(sp), NOW)
    assert d.status["stage"] == "rl" and ("create", "jobs", "t-rl") in acts(d)


def test_progress_belongs_to_its_stage():
    sp = spec(sft=False, distill=False)
    obs = observed(sp, [job("rl", active=1)])
    d = S.decide(REF, 1, sp, running("rl"), obs, NOW, {"stage": "rl", "step": 3, "rewardMean": -1.5})
    assert d.status["progress"] == {"step": 3, "rewardMean": -1.5}
    other = S.decide(REF, 1, sp, running("rl"), obs, NOW, {"stage": "sft", "step": 9})
    assert other.status["progress"] == {}


def test_config_follows_spec_edits():
    sp = spec()
    obs = observed(sp, [job("sft", active=1)])
    obs.configmaps["t-config"]["configHash"] = "stale"
    d = S.decide(REF, 2, sp, running("sft"), obs, NOW)
    patch = [a for a in d.actions if a.verb == "patch"]
    assert len(patch) == 1 and "run.yaml" in patch[0].body["data"]


def test_merge_patch_only_touches_changes_and_own_fields():
    assert S.merge_patch({"phase": "Pending", "x": 1, "reason": "r"}, {"phase": "Running"}) == \
        {"phase": "Running", "reason": None}


def test_gpu_children_of_an_earlier_run_with_the_same_name_are_replaced():
    sp = spec(sft=False)
    old = dict(job("rl", active=1), owner="an-earlier-uid")
    d = S.decide(REF, 1, sp, running("rl"), observed(sp, [old]), NOW)
    assert ("delete", "jobs", "t-rl") in acts(d) and ("create", "jobs", "t-rl") not in acts(d)
    mine = dict(job("rl", active=1), owner="u1")
    assert acts(S.decide(REF, 1, sp, running("rl"), observed(sp, [mine]), NOW)) == {("create", "services", "t-rl")}


@pytest.mark.parametrize("name", ["7b-run", "a" * 41])
def test_run_names_children_cannot_carry_are_invalid(name):
    d = S.decide(b.RunRef(name=name, namespace="ns", uid="u"), 1, spec(), None, S.Observed(), NOW)
    assert d.status["reason"] == "InvalidSpec" and d.status["message"].startswith("metadata.name")
    assert d.actions == []
