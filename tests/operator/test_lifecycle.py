"""Kopf + the real handlers against the emulated API. Child status is simulated by the test (kmock has no controllers)."""

from __future__ import annotations

import asyncio
import json

import pytest
from op_harness import NS, example, server_mode

from rlt.checks.driver import driver_problem

pytestmark = pytest.mark.timeout(60)


async def wait_for_events(harness, run: str, wanted: set[str]) -> list[str]:
    """Kopf posts Events in the background, after the status patch: wait for them rather than read once."""

    async def reasons():
        got = [e["reason"] for e in await harness.events(run)]
        return got if wanted <= set(got) else None

    return await harness.wait(reasons, f"events {sorted(wanted)}")


async def test_create_makes_first_stage_children(harness):
    await harness.start_operator()
    await harness.create_run(example())
    cm = await harness.wait_object("configmaps", "tiny-config")
    assert "run.yaml" in cm["data"]
    pvc = await harness.wait_object("persistentvolumeclaims", "tiny-data")
    job = await harness.wait_object("jobs", "tiny-sft")
    run = await harness.get("rltruns", "tiny")
    assert "ownerReferences" not in pvc["metadata"], "the volume is retained by default"
    for child in (cm, job):
        ref = child["metadata"]["ownerReferences"][0]
        assert ref["uid"] == run["metadata"]["uid"] and ref["controller"] is True
        assert child["metadata"]["labels"]["rlt.dev/run"] == "tiny"
    assert job["metadata"]["labels"]["rlt.dev/stage"] == "sft"
    # The Job exists but none of its pods runs yet: Pending, not Ready, whatever the Job's age.
    st = await harness.wait_status("tiny", lambda s: s.get("stage") == "sft", "stage sft")
    assert st["phase"] == "Pending"
    assert {c["type"]: c["status"] for c in st["conditions"]}["Ready"] == "False"
    await harness.trainer_running("tiny", "sft")
    st = await harness.wait_status("tiny", lambda s: s.get("phase") == "Running", "Running")
    assert {c["type"]: c["status"] for c in st["conditions"]}["Ready"] == "True"
    assert st["stage"] == "sft" and st["restarts"] == 0 and st["observedGeneration"] == 1


async def test_stages_generators_trainer_to_succeeded(harness):
    """sft Job → rl generators, trainer only once they are ready → distill → Succeeded, generators gone."""
    await harness.start_operator()
    await harness.create_run(server_mode(example()))
    await harness.trainer_running("tiny", "sft")
    await harness.trainer_succeeded("tiny", "sft")

    sts = await harness.wait_object("statefulsets", "tiny-generator")
    assert sts["metadata"]["labels"]["rlt.dev/stage"] == "rl"
    container = sts["spec"]["template"]["spec"]["containers"][0]
    assert container["command"][container["command"].index("--model") + 1] == "/data/tiny/sft/model"
    await harness.wait_object("services", "tiny-generator")
    st = await harness.wait_status("tiny", lambda s: s.get("stage") == "rl", "stage rl")
    assert {c["type"]: c["status"] for c in st["conditions"]}["GeneratorsReady"] == "False"
    assert await harness.get("jobs", "tiny-rl") is None, "trainer must wait for the generators"

    await harness.generators_ready("tiny")
    job = await harness.trainer_running("tiny", "rl")
    env = {e["name"]: e.get("value") for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["MASTER_ADDR"] == "tiny-rl-0.tiny-rl.default.svc" and env["NNODES"] == "2"
    assert job["spec"]["completionMode"] == "Indexed" and job["spec"]["completions"] == 2
    await harness.wait_object("services", "tiny-rl")
    await harness.trainer_succeeded("tiny", "rl")

    # distill serves the RL teacher: the rl generator is replaced by one labelled distill.
    async def distill_generator():
        s = await harness.get("statefulsets", "tiny-generator")
        return s if s and s["metadata"]["labels"]["rlt.dev/stage"] == "distill" else None

    sts = await harness.wait(distill_generator, "distill generator")
    cmd = sts["spec"]["template"]["spec"]["containers"][0]["command"]
    assert cmd[cmd.index("--model") + 1] == "/data/tiny/rl/model"
    await harness.generators_ready("tiny")
    await harness.trainer_running("tiny", "distill")
    await harness.trainer_succeeded("tiny", "distill")

    st = await harness.wait_status("tiny", lambda s: s.get("phase") == "Succeeded", "Succeeded")
    assert st["completedStages"] == ["sft", "rl", "distill"] and st["completionTime"]
    assert st["outputs"] == {
        "teacherCheckpoint": "/data/tiny/rl/model",
        "distilledDataset": "/data/tiny/distill/dataset.jsonl",
    }
    await harness.wait_gone("statefulsets", "tiny-generator")
    for stage in ("sft", "rl", "distill"):  # trainer Jobs stay for their logs (no TTL set)
        assert await harness.get("jobs", f"tiny-{stage}") is not None
    await wait_for_events(harness, "tiny", {"StageStarted", "Succeeded"})


async def test_pod_failure_gang_restart_then_backoff_limit(harness):
    doc = server_mode(
        example(**{"spec.stages.sft.enabled": False, "spec.stages.distill.enabled": False, "spec.backoffLimit": 1})
    )
    await harness.start_operator()
    await harness.create_run(doc)
    await harness.generators_ready("tiny")
    await harness.trainer_running("tiny", "rl")
    await harness.generator_pod("tiny", 0)

    # A vLLM server crashes (its container restarted): the whole gang restarts from the checkpoint.
    await harness.generator_pod("tiny", 0, restarts=1)
    st = await harness.wait_status("tiny", lambda s: s.get("restarts") == 1, "restart 1")
    assert st["phase"] == "Running" and "generator pod tiny-generator-0 restarted" in st["lastFailure"]

    async def relabelled(plural, name):
        obj = await harness.get(plural, name)
        return obj if obj and obj["metadata"]["labels"]["rlt.dev/restart"] == "1" else None

    await harness.wait(lambda: relabelled("statefulsets", "tiny-generator"), "new generators")
    await harness.generators_ready("tiny")
    await harness.wait(lambda: relabelled("jobs", "tiny-rl"), "new trainer")
    await harness.trainer_failed("tiny", "rl", failed_ago=60)  # no pod here: past the operator's wait for one

    st = await harness.wait_status("tiny", lambda s: s.get("phase") == "Failed", "Failed")
    assert st["reason"] == "BackoffLimitExceeded" and st["restarts"] == 1
    assert "trainer Job tiny-rl" in st["message"]
    await harness.wait_gone("statefulsets", "tiny-generator")
    assert await harness.get("jobs", "tiny-rl") is not None  # kept for logs
    await wait_for_events(harness, "tiny", {"GangRestart", "BackoffLimitExceeded"})


DRIVER_LINE = driver_problem("535.104.05", "13.0")  # the generator's own line, from the real check


async def test_a_generator_that_exits_with_a_config_error_fails_the_run_at_once(harness):
    """The generator's driver check (rlt.checks.driver, a vLLM plugin) exits 78: retrying cannot help, so the run
    fails at the first gang with the pod's own line, as for the trainer's preflight; no gang restart is burnt."""
    doc = server_mode(
        example(**{"spec.stages.sft.enabled": False, "spec.stages.distill.enabled": False, "spec.backoffLimit": 3})
    )
    await harness.start_operator()
    await harness.create_run(doc)
    await harness.generator_pod("tiny", 0)
    # the log's tail (FallbackToLogsOnError) with vLLM's lines around the driver check's own
    log = f"INFO 11-27 plugins.py:41 Loading plugin rlt_driver\n{DRIVER_LINE}\nERROR 11-27 API server exited\n"
    await harness.generator_pod("tiny", 0, restarts=1, last_exit=(78, log))
    st = await harness.wait_status("tiny", lambda s: s.get("phase") == "Failed", "Failed")
    assert st["reason"] == "ConfigError" and st["restarts"] == 0, st
    assert st["message"].startswith(f"generator pod tiny-generator-0 exited with CONFIG_ERROR (78): {DRIVER_LINE}")
    await harness.wait_gone("statefulsets", "tiny-generator")
    await wait_for_events(harness, "tiny", {"ConfigError"})


async def test_the_failed_gangs_pod_is_kept_for_its_logs_one_per_run_and_goes_with_the_run(harness, monkeypatch):
    from rlt_operator.status import gang_steps as status_gang

    monkeypatch.setattr(status_gang, "BACKOFF_BASE", 0.5)  # the next gang after half a second, not 10 s
    doc = example(**{"spec.stages.sft.enabled": False, "spec.stages.distill.enabled": False, "spec.backoffLimit": 1})
    await harness.start_operator()
    run = await harness.create_run(doc)
    await harness.trainer_running("tiny", "rl")
    first = await harness.failed_trainer_pod("tiny", "rl", "aaaaa", "RuntimeError: CUDA error: out of memory")
    await harness.trainer_failed("tiny", "rl")

    def owned_by_run(pod):
        refs = (pod or {}).get("metadata", {}).get("ownerReferences") or []
        return [(r["kind"], r["uid"], r.get("controller")) for r in refs] == [("RLTRun", run["metadata"]["uid"], True)]

    # Handed to the run before its Job is deleted: a cluster's garbage collector deletes it with the run, not the Job.
    # The restart waits until the failed pod is seen (the Job's end can arrive first: the test below), so both land.
    st = await harness.wait_status("tiny", lambda s: s.get("restarts") == 1 and "lastFailedPod" in s, "restart 1")
    assert st["lastFailedPod"] == first["metadata"]["name"]
    assert owned_by_run(await harness.get("pods", first["metadata"]["name"]))
    # Its end is copied, before the gang is deleted, into a ConfigMap that no one owns (it outlives the run).
    kept = await harness.wait_object("configmaps", "tiny-last-failure")
    assert (
        kept["metadata"].get("ownerReferences") is None and kept["metadata"]["labels"]["rlt.dev/evidence-of"] == "tiny"
    )
    assert kept["data"]["pod"] == first["metadata"]["name"] and kept["data"]["outcome"] == "gang restarted"
    assert kept["data"]["log-tail"] == "...\nRuntimeError: CUDA error: out of memory"
    assert (kept["data"]["exitCode"], kept["data"]["reason"], kept["data"]["stage"]) == ("1", "Error", "rl")
    assert "CUDA error: out of memory" in kept["data"]["failure"]
    writes = [
        (r.action.name, r.resource.plural, r.name or ((r.data or {}).get("metadata") or {}).get("name"))
        for r in list(harness.cluster._requests)
        if r.resource is not None and r.method.value in ("POST", "DELETE")
    ]
    copied = writes.index(("CREATE", "configmaps", "tiny-last-failure"))
    deleted = writes.index(("DELETE", "jobs", "tiny-rl"))
    assert copied < deleted, writes
    events = await wait_for_events(harness, "tiny", {"GangRestart"})
    restart = next(e for e in await harness.events("tiny") if e["reason"] == "GangRestart")
    # the hint names the container that failed (the main one here; an init container's in test_sandbox_run_pods)
    container = kept["data"]["container"]
    assert container == first["status"]["containerStatuses"][0]["name"] == "trainer", kept["data"]
    assert f"kubectl -n {NS} logs {first['metadata']['name']} -c {container}" in restart["message"], events

    # The next gang fails for good: its pod is kept, the one kept before is deleted (one per run).
    async def next_gang():
        job = await harness.get("jobs", "tiny-rl")
        return job if job and job["metadata"]["labels"]["rlt.dev/restart"] == "1" else None

    await harness.wait(next_gang, "the next gang's Job")
    await harness.trainer_running("tiny", "rl")
    second = await harness.failed_trainer_pod("tiny", "rl", "bbbbb", "ValueError: loss is nan")
    await harness.trainer_failed("tiny", "rl")
    st = await harness.wait_status("tiny", lambda s: s.get("phase") == "Failed", "Failed")
    assert st["lastFailedPod"] == second["metadata"]["name"]
    await harness.wait_gone("pods", first["metadata"]["name"])
    assert owned_by_run(await harness.get("pods", second["metadata"]["name"]))
    await wait_for_events(harness, "tiny", {"BackoffLimitExceeded"})
    failed = next(e for e in await harness.events("tiny") if e["reason"] == "BackoffLimitExceeded")
    assert f"kubectl -n {NS} logs {second['metadata']['name']} -c {container}" in failed["message"]

    # Deleting the run deletes the kept pod (the operator's cleanup; a cluster's garbage collector too).
    await harness.delete_run("tiny")
    await harness.wait_gone("rltruns", "tiny")
    assert await harness.get("pods", second["metadata"]["name"]) is None
    # ... but not the copy of its end, now of the second (final) failure
    kept = (await harness.get("configmaps", "tiny-last-failure"))["data"]
    assert kept["pod"] == second["metadata"]["name"] and kept["log-tail"].endswith("ValueError: loss is nan")
    assert kept["outcome"] == "run Failed (BackoffLimitExceeded)" and kept["gangRestart"] == "1"


async def test_a_job_seen_failed_before_its_pod_restarts_only_once_the_pod_is_seen(harness, monkeypatch):
    """The operator watches Jobs and pods on separate streams: the Job's Failed condition may arrive first (seen so in
    CI on loaded cores). The restart waits for the failed pod, so its log is kept and the failure names it."""
    import threading

    from rlt_operator.status import gang as status_gang
    from rlt_operator.status import gang_steps

    monkeypatch.setattr(gang_steps, "BACKOFF_BASE", 0.5)
    monkeypatch.setattr(status_gang, "POD_END_LAG_SECONDS", 120.0)  # margin for a loaded machine
    waiting = threading.Event()  # set once a pass of the operator (its own thread) found its pod behind the Job
    real = gang_steps.pods_behind_job

    def spied(*args):  # the real function, watched
        left = real(*args)
        if left is not None:
            waiting.set()
        return left

    monkeypatch.setattr(gang_steps, "pods_behind_job", spied)
    doc = example(**{"spec.stages.sft.enabled": False, "spec.stages.distill.enabled": False, "spec.backoffLimit": 1})
    await harness.start_operator()
    await harness.create_run(doc)
    await harness.trainer_running("tiny", "rl")
    await harness.trainer_failed("tiny", "rl")
    await harness.wait(waiting.is_set, "a pass that sees the failed Job before its pod")
    assert (await harness.run_status("tiny")).get("restarts", 0) == 0
    assert (await harness.get("jobs", "tiny-rl"))["metadata"]["labels"]["rlt.dev/restart"] == "0"
    first = await harness.failed_trainer_pod("tiny", "rl", "late1", "RuntimeError: NCCL timeout")
    st = await harness.wait_status("tiny", lambda s: s.get("restarts") == 1, "restart 1")
    assert st["lastFailedPod"] == first["metadata"]["name"]
    assert "NCCL timeout" in st["lastFailure"], st


async def test_an_api_server_clock_ahead_does_not_hold_the_restart_past_the_operators_wait(harness, monkeypatch):
    """The Job's Failed condition is stamped an hour "in the future" (the API server's clock ahead of the operator's)
    and its failed pod never shows: the operator times its wait from its own first sighting and restarts the gang
    after POD_END_LAG_SECONDS, not after the skew."""
    from rlt_operator.status import gang as status_gang
    from rlt_operator.status import gang_steps

    monkeypatch.setattr(gang_steps, "BACKOFF_BASE", 0.5)
    monkeypatch.setattr(status_gang, "POD_END_LAG_SECONDS", 2.0)
    doc = example(**{"spec.stages.sft.enabled": False, "spec.stages.distill.enabled": False, "spec.backoffLimit": 1})
    await harness.start_operator()
    await harness.create_run(doc)
    await harness.trainer_running("tiny", "rl")
    await harness.trainer_failed("tiny", "rl", failed_ago=-3600)
    st = await harness.wait_status("tiny", lambda s: s.get("restarts") == 1, "restart 1")
    assert not st.get("lastFailedPod"), "no pod was seen, none is named"


async def test_a_users_configmap_of_the_evidence_name_is_not_overwritten(harness, monkeypatch):
    from rlt_operator.status import gang_steps as status_gang

    monkeypatch.setattr(status_gang, "BACKOFF_BASE", 0.5)
    doc = example(**{"spec.stages.sft.enabled": False, "spec.stages.distill.enabled": False, "spec.backoffLimit": 1})
    mine = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "tiny-last-failure"}, "data": {"a": "1"}}
    await harness.call("POST", "/api/v1/namespaces/default/configmaps", mine)
    await harness.start_operator()
    await harness.create_run(doc)
    await harness.trainer_running("tiny", "rl")
    await harness.failed_trainer_pod("tiny", "rl", "aaaaa", "RuntimeError: CUDA error: out of memory")
    await harness.trainer_failed("tiny", "rl")
    await harness.wait_status("tiny", lambda s: s.get("restarts") == 1, "restart 1")  # the restart goes on
    assert (await harness.get("configmaps", "tiny-last-failure"))["data"] == {"a": "1"}


async def test_suspend_and_resume(harness):
    doc = server_mode(example(**{"spec.stages.sft.enabled": False}))
    await harness.start_operator()
    await harness.create_run(doc)
    await harness.generators_ready("tiny")
    await harness.trainer_running("tiny", "rl")

    await harness.patch_run("tiny", {"spec": {"suspend": True}})
    st = await harness.wait_status("tiny", lambda s: s.get("phase") == "Suspended", "Suspended")
    assert "startTime" not in st
    await harness.wait_gone("jobs", "tiny-rl")
    await harness.wait_gone("statefulsets", "tiny-generator")
    assert await harness.get("persistentvolumeclaims", "tiny-data") is not None
    assert await harness.get("configmaps", "tiny-config") is not None

    await harness.patch_run("tiny", {"spec": {"suspend": False}})
    await harness.wait_object("statefulsets", "tiny-generator")
    st = await harness.wait_status("tiny", lambda s: s.get("phase") in ("Pending", "Running"), "resumed")
    assert st["restarts"] == 0, "a suspend is not a failure"
    await harness.generators_ready("tiny")
    await harness.wait_object("jobs", "tiny-rl")
    conds = {c["type"]: c for c in (await harness.run_status("tiny"))["conditions"]}
    assert conds["Suspended"]["status"] == "False" and conds["Suspended"]["reason"] == "Resumed"


@pytest.mark.parametrize("policy", ["Retain", "Delete"])
async def test_deletion_removes_children_and_finalizer_and_the_volume_only_when_asked(harness, policy):
    await harness.start_operator()
    await harness.create_run(example(**{"spec.storage": {"retentionPolicy": policy}}))
    await harness.wait_object("jobs", "tiny-sft")
    pvc = await harness.wait_object("persistentvolumeclaims", "tiny-data")
    # no owner reference on a retained claim: a real cluster's garbage collector would delete it with the run
    assert ("ownerReferences" in pvc["metadata"]) == (policy == "Delete")
    run = await harness.get("rltruns", "tiny")
    assert "rlt.dev/finalizer" in run["metadata"]["finalizers"]
    await harness.delete_run("tiny")
    await harness.wait_gone("rltruns", "tiny")
    for plural, name in (("jobs", "tiny-sft"), ("configmaps", "tiny-config"), ("services", "tiny-sft")):
        assert await harness.get(plural, name) is None, f"{plural}/{name} left behind"
    kept = await harness.get("persistentvolumeclaims", "tiny-data")
    assert (kept is not None) == (policy == "Retain")


@pytest.mark.parametrize(("created", "deleted"), [("Delete", "Retain"), ("Retain", "Delete")])
async def test_the_retention_policy_is_the_one_the_run_has_when_it_is_deleted(harness, created, deleted):
    """docs/operator.md: retentionPolicy is read when the run is deleted. A claim created under Delete carries the
    run's owner reference; kept under Retain it must lose it, or a real cluster's garbage collector (kmock has none)
    deletes the checkpoints with the run."""
    await harness.start_operator()
    await harness.create_run(example(**{"spec.storage": {"retentionPolicy": created}}))
    await harness.wait_object("jobs", "tiny-sft")
    uid = (await harness.get("rltruns", "tiny"))["metadata"]["uid"]
    await harness.patch_run("tiny", {"spec": {"storage": {"retentionPolicy": deleted}}})
    await harness.delete_run("tiny")
    await harness.wait_gone("rltruns", "tiny")
    kept = await harness.get("persistentvolumeclaims", "tiny-data")
    assert (kept is not None) == (deleted == "Retain")
    if kept is not None:
        owners = [r.get("uid") for r in kept["metadata"].get("ownerReferences") or []]
        assert uid not in owners, "the garbage collector would delete the retained claim with the run"


async def test_a_run_created_again_under_the_same_name_mounts_its_retained_volume(harness):
    """docs/alerts.md (RLTRunFailed): a retained claim (retentionPolicy Retain, the default) is the new run's, not a
    NameConflict, so its trainer mounts the old checkpoints and resumes from them."""
    await harness.start_operator()
    await harness.create_run(example())
    await harness.wait_object("jobs", "tiny-sft")
    old = await harness.wait_object("persistentvolumeclaims", "tiny-data")
    await harness.delete_run("tiny")
    await harness.wait_gone("rltruns", "tiny")
    await harness.wait_gone("jobs", "tiny-sft")
    await harness.create_run(example())
    job = await harness.wait_object("jobs", "tiny-sft")
    vols = {v["name"]: v for v in job["spec"]["template"]["spec"]["volumes"]}
    assert vols["data"]["persistentVolumeClaim"]["claimName"] == "tiny-data"
    kept = await harness.get("persistentvolumeclaims", "tiny-data")
    assert kept is not None and kept["metadata"]["uid"] == old["metadata"]["uid"], "the same claim, not a new one"
    st = await harness.run_status("tiny")
    assert "NameConflict" not in str(st.get("conditions")), st


async def test_existing_claim_is_used_and_kept(harness):
    await harness.start_operator()
    await harness.create_run(example(**{"spec.storage": {"existingClaim": "shared-data"}}))
    job = await harness.wait_object("jobs", "tiny-sft")
    vols = {v["name"]: v for v in job["spec"]["template"]["spec"]["volumes"]}
    assert vols["data"]["persistentVolumeClaim"]["claimName"] == "shared-data"
    assert await harness.get("persistentvolumeclaims", "tiny-data") is None


async def test_operator_restart_mid_run_creates_no_duplicates(harness, monkeypatch):
    import threading

    from rlt_operator import handlers

    await harness.start_operator()
    await harness.create_run(server_mode(example(**{"spec.stages.sft.enabled": False})))
    await harness.generators_ready("tiny")
    await harness.trainer_running("tiny", "rl")
    await harness.wait_status("tiny", lambda s: s.get("phase") == "Running", "Running")
    await harness.stop_operator()

    # A pass of the new operator, ended (its creates sent): the real reconcile, watched. The new operator need not
    # write anything (the status it computes may be the one stored), so no request of its own can be waited for.
    passed = threading.Event()
    real = handlers.reconcile_once

    async def watched(*args, **kwargs):
        try:
            return await real(*args, **kwargs)
        finally:
            passed.set()

    monkeypatch.setattr(handlers, "reconcile_once", watched)
    seen = len(harness.cluster._requests)
    await harness.start_operator()
    await harness.wait(passed.is_set, "a reconcile after restart")
    posts = [r for r in harness.cluster._requests[seen:] if r.method == "POST"]
    kinds = {str(r.url.path).rsplit("/", 1)[-1] for r in posts}
    assert kinds <= {"events"}, f"children re-posted after restart: {kinds}"
    st = await harness.run_status("tiny")
    assert st["phase"] == "Running" and st["restarts"] == 0
    assert len(await harness.list("jobs", "rlt.dev/run=tiny")) == 1


async def test_invalid_spec_holds_alone_and_recovers_when_fixed(harness):
    bad = example(**{"metadata.name": "bad", "spec.stages.rl.numGenerations": 3})  # 8 % 3 != 0
    await harness.start_operator()
    await harness.create_run(bad)
    await harness.create_run(example())
    st = await harness.wait_status("bad", lambda s: s.get("reason") == "InvalidSpec", "bad InvalidSpec")
    assert st["phase"] == "Pending"
    assert "spec.stages.rl" in st["message"] and "numGenerations" in st["message"]
    await harness.wait_object("jobs", "tiny-sft")
    assert await harness.get("jobs", "bad-sft") is None
    assert await harness.get("configmaps", "bad-config") is None, "nothing is created for an invalid spec"
    await harness.trainer_running("tiny", "sft")
    await harness.wait_status("tiny", lambda s: s.get("phase") == "Running", "good run Running")
    await harness.patch_run("bad", {"spec": {"stages": {"rl": {"numGenerations": 2}}}})
    await harness.wait_object("jobs", "bad-sft")
    st = await harness.wait_status("bad", lambda s: "reason" not in s, "bad recovered")

    async def fixed_event():
        return "SpecValid" in [e["reason"] for e in await harness.events("bad")]

    await harness.wait(fixed_event, "SpecValid Event")


async def test_deadline_and_ttl(harness):
    doc = example(**{"spec.activeDeadlineSeconds": 1, "spec.ttlSecondsAfterFinished": 1})
    await harness.start_operator()
    await harness.create_run(doc)
    await harness.trainer_running("tiny", "sft")
    st = await harness.wait_status("tiny", lambda s: s.get("phase") == "Failed", "deadline", timeout=10)
    assert st["reason"] == "DeadlineExceeded"
    await harness.wait_gone("jobs", "tiny-sft", timeout=10)  # active trainer stopped, then TTL
    assert await harness.get("persistentvolumeclaims", "tiny-data") is not None


async def test_an_unschedulable_trainer_pod_shows_on_the_run_as_condition_and_event(harness):
    await harness.start_operator()
    await harness.create_run(example())
    job = await harness.trainer_running("tiny", "sft")
    labels = job["spec"]["template"]["metadata"]["labels"]
    await harness.call(
        "POST",
        "/api/v1/namespaces/default/pods",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "tiny-sft-0-abcde", "labels": labels},
            "spec": job["spec"]["template"]["spec"],
        },
    )
    await harness.set_status(
        "pods",
        "tiny-sft-0-abcde",
        {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
                }
            ],
        },
    )

    def stuck(s):
        c = {c["type"]: c for c in s.get("conditions", [])}
        return c.get("PodsSchedulable", {}).get("status") == "False"

    st = await harness.wait_status("tiny", stuck, "PodsSchedulable=False")
    c = {c["type"]: c for c in st["conditions"]}
    assert c["TrainerRunning"]["status"] == "False", "Job.active counts the Pending pod; the trainer is not running"
    assert st["reason"] == "Unschedulable" and "Insufficient nvidia.com/gpu" in st["message"]
    await wait_for_events(harness, "tiny", {"Unschedulable"})


async def test_children_are_watched_with_a_server_side_label_selector(harness):
    from rlt_operator.builders import L_RUN
    from rlt_operator.config.kinds import CHILDREN, RUN

    await harness.start_operator()

    def requested() -> dict[str, list]:
        out: dict[str, list] = {}
        for r in harness.cluster._requests:
            if r.params.get("watch") == "true" or r.method.value == "GET":
                out.setdefault(r.url.path.rsplit("/", 1)[-1], []).append(r.params.get("labelSelector"))
        return out

    # Kopf starts its watchers one by one after the operator is up: on a busy machine the last may come seconds later
    deadline = asyncio.get_running_loop().time() + 60
    while not all(c.plural in requested() for c in CHILDREN) and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.2)
    watches = requested()
    for child in CHILDREN:
        assert watches.get(child.plural), f"{child.plural} not listed/watched"
        assert all(sel == L_RUN for sel in watches[child.plural]), f"{child.plural}: {watches[child.plural]}"
    assert all(sel is None for sel in watches[RUN.plural]), "the runs themselves are not filtered"


async def test_an_edit_of_a_finished_stage_is_recorded_reported_and_not_applied(harness):
    """sft finishes and records its spec; editing sft's learning rate while rl runs is a condition and an Event
    naming the field, the rl trainer keeps running, and no sft Job is created again."""
    await harness.start_operator()
    await harness.create_run(example(**{"spec.stages.distill.enabled": False}))
    await harness.trainer_running("tiny", "sft")
    await harness.trainer_succeeded("tiny", "sft")
    st = await harness.wait_status("tiny", lambda s: "sft" in (s.get("stageSpecs") or {}), "sft recorded")
    sft_lr = json.loads(st["stageSpecs"]["sft"]["fields"])["stages.sft.learningRate"]
    await harness.trainer_running("tiny", "rl")

    await harness.patch_run("tiny", {"spec": {"stages": {"sft": {"learningRate": 0.5}}}})
    edited = await harness.wait_status(
        "tiny",
        lambda s: any(c["type"] == "StagesCurrent" and c["status"] == "False" for c in s.get("conditions") or []),
        "edit reported",
    )
    cond = next(c for c in edited["conditions"] if c["type"] == "StagesCurrent")
    assert cond["reason"] == "FinishedStageEdited"
    assert f"stage sft finished under a different spec (stages.sft.learningRate {sft_lr} -> 0.5)" in cond["message"]
    assert json.loads(edited["stageSpecs"]["sft"]["fields"])["stages.sft.learningRate"] == sft_lr, "the record is kept"
    assert edited["phase"] == "Running" and edited["stage"] == "rl"
    messages = await wait_for_events(harness, "tiny", {"FinishedStageEdited"})
    assert messages.count("FinishedStageEdited") == 1
    job = await harness.get("jobs", "tiny-sft")
    assert job["status"].get("succeeded"), "the finished sft Job is neither replaced nor re-run"


async def test_the_generators_policy_follows_the_operators_scrapers_for_a_run_already_going(harness, monkeypatch):
    """An operator upgraded with another metrics.podMonitor.prometheusNamespaces updates the NetworkPolicy of a run
    whose generators already serve: Prometheus of the new namespace may then scrape them (the trainer's rule kept)."""
    monkeypatch.delenv("RLT_PROMETHEUS_NAMESPACES", raising=False)
    await harness.start_operator()
    doc = server_mode(example())
    doc["spec"]["stages"]["sft"]["enabled"] = False
    await harness.create_run(doc)
    before = await harness.wait_object("networkpolicies", "tiny-generator")
    assert len(before["spec"]["ingress"]) == 1  # the run's trainers only
    await harness.generators_ready("tiny")
    await harness.trainer_running("tiny", "rl")
    await harness.stop_operator()

    monkeypatch.setenv("RLT_PROMETHEUS_NAMESPACES", "monitoring")
    await harness.start_operator()

    async def updated():
        policy = await harness.get("networkpolicies", "tiny-generator")
        return policy if len(policy["spec"]["ingress"]) == 2 else None

    after = await harness.wait(updated, "the policy's rules to take the new scrapers")
    trainers, scrapers = after["spec"]["ingress"]
    assert trainers == before["spec"]["ingress"][0]
    assert scrapers["from"][0]["namespaceSelector"]["matchExpressions"][0]["values"] == ["monitoring"]
    assert after["metadata"]["uid"] == before["metadata"]["uid"], "patched in place: never a moment without it"
    assert (await harness.run_status("tiny"))["phase"] == "Running"
