"""Two `rlt operator --peering` processes against the emulated API (Kopf peering): one works, the other waits;
SIGKILL the working one and the standby takes over, within the keep-alive lifetime.

Each process talks to the API with its own bearer token (its kubeconfig), so that every request in the emulated
API's log names its sender. Child status is simulated by the test (kmock runs no controllers).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import random
import re
import signal
import subprocess
import sys
import time
import urllib.request
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from lease_fence import kopf_bookkeeping
from op_harness import example, poll_until
from suite_helpers import free_port

from rlt.contract.exitcodes import ExitCode
from rlt_operator.cluster.peering import auto_priority
from rlt_operator.config.kinds import CLUSTER_PEERING
from rlt_operator.config.kinds import PEERING as PEERING_KIND
from rlt_sandbox.sandbox import kubeconfig

pytestmark = pytest.mark.timeout(150)
RLT = [sys.executable, "-c", "from rlt.cli import main; raise SystemExit(main())"]
PEERING = "rlt-operator"
PEERINGS = CLUSTER_PEERING.collection_path("")
LIFETIME = 20  # the chart's default (operator.peering.lifetime)


async def start_operator(
    harness: Any,
    tmp_path: Path,
    name: str,
    scope: tuple[str, ...] = ("--all-namespaces",),
    health: int = -1,
    peering: str = PEERING,
    extra: tuple[str, ...] = (),
    metrics: int = -1,
) -> tuple[asyncio.subprocess.Process, Any]:
    config = kubeconfig(harness.url)
    config["users"][0]["user"] = {"token": name}  # the Authorization header tells the two apart
    path = tmp_path / f"{name}.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    env = {
        **os.environ,
        "KUBECONFIG": str(path),
        "POD_ID": name,  # Kopf's peering identity, as the chart sets it from the pod name
        "RLT_OPERATOR_METRICS_PORT": str(metrics),
        "RLT_OPERATOR_HEALTH_PORT": str(health),
    }
    log = (tmp_path / f"{name}.log").open("wb")
    proc = await asyncio.create_subprocess_exec(
        *RLT,
        "operator",
        *scope,
        "--peering",
        peering,
        "--peering-lifetime",
        str(LIFETIME),
        *extra,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    return proc, log


def logs_tail(tmp_path: Path) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(tmp_path.glob("*.log")))


@asynccontextmanager
async def replicas(harness: Any, tmp_path: Path):
    """`start(name, ...)` runs one more operator (start_operator's arguments) and returns it; `procs` holds them by
    name. On an error every log's tail is printed; on leaving, each replica still running gets SIGTERM (SIGKILL
    30 s later) and the logs are closed."""
    procs: dict[str, asyncio.subprocess.Process] = {}
    logs = []

    async def start(name: str, *args: Any) -> asyncio.subprocess.Process:
        procs[name], log = await start_operator(harness, tmp_path, name, *args)
        logs.append(log)
        return procs[name]

    try:
        yield start, procs
    except BaseException:
        print(logs_tail(tmp_path))
        raise
    finally:
        for p in procs.values():
            if p.returncode is None:
                p.send_signal(signal.SIGTERM)
                try:
                    await asyncio.wait_for(p.wait(), 30)
                except asyncio.TimeoutError:
                    p.kill()
        for log in logs:
            log.close()


def sender(request: Any) -> str | None:
    auth = request.headers.get("Authorization", "")
    return auth.removeprefix("Bearer ") if auth.startswith("Bearer ") else None


def writes(requests: list[Any]) -> list[tuple[int, str, str, str]]:
    """(index in the request log, sender, method, path) of every write an operator sent, peering keep-alives and the
    election's own Lease aside (a standby may try to create or take it: that is how it stands by)."""
    out = []
    for i, r in enumerate(requests):
        by, method = sender(r), str(r.method.value)
        path = r.url.path
        if by is not None and method != "GET" and "kopfpeerings" not in path and "/leases" not in path:
            out.append((i, by, method, path))
    return out


async def peers(harness: Any) -> dict[str, Any]:
    obj = await harness.call("GET", f"{PEERINGS}/{PEERING}")
    return obj.get("status") or {}


async def create_peering(harness: Any) -> None:
    """What the chart creates (templates/peering.yaml): the ClusterKopfPeering both replicas share."""
    body = {"apiVersion": CLUSTER_PEERING.api_version, "kind": CLUSTER_PEERING.kind, "metadata": {"name": PEERING}}
    await harness.call("POST", PEERINGS, body)


def peering_verbs(requests: list[Any]) -> set[str]:
    """The RBAC verbs of the operators' requests on the peering kind."""
    verbs = set()
    for r in requests:
        if sender(r) and CLUSTER_PEERING.plural in r.url.path:
            method = str(r.method.value)
            named = r.url.path.rstrip("/").endswith(f"/{PEERING}")
            if method == "GET":
                verbs.add("watch" if r.params.get("watch") == "true" else "get" if named else "list")
            else:
                verbs.add({"PATCH": "patch", "PUT": "update", "POST": "create", "DELETE": "delete"}[method])
    return verbs


async def test_standby_takes_over_after_sigkill(harness, tmp_path):
    await create_peering(harness)
    marks: list[tuple[str, int]] = []  # (event, index into the request log)

    def mark(what: str) -> None:
        marks.append((what, len(harness.cluster._requests)))

    async with replicas(harness, tmp_path) as (start, procs):
        await start("op-a")
        await harness.create_run(example())
        await harness.wait_object("jobs", "tiny-sft", timeout=40)
        # The second replica joins once the first works: it is the younger, so the standby.
        await start("op-b")

        def b_watching() -> bool:  # its peering watch (paused), or the runs' watch (were it active)
            return any(
                sender(r) == "op-b"
                and r.params.get("watch") == "true"
                and ("kopfpeerings" in r.url.path or "rltruns" in r.url.path)
                for r in list(harness.cluster._requests)
            )

        await poll_until(b_watching, "op-b watching", 40, detail=lambda: logs_tail(tmp_path))

        # Both alive: the run moves one stage; only the working replica acts.
        await harness.trainer_running("tiny", "sft")
        await harness.trainer_succeeded("tiny", "sft")
        await harness.wait_object("jobs", "tiny-rl", timeout=20)
        await harness.trainer_running("tiny", "rl")
        await harness.wait_status("tiny", lambda s: s.get("stage") == "rl", "stage rl")
        await asyncio.sleep(3)  # let a second active operator (the mutation) show itself
        mark("kill")
        b_before = [w for w in writes(list(harness.cluster._requests)) if w[1] == "op-b"]
        assert not b_before, f"the standby wrote while the working replica lived: {b_before}"
        st = await peers(harness)
        assert st["op-a"]["priority"] > st["op-b"]["priority"], st  # the first started works
        assert st["op-a"]["lifetime"] == st["op-b"]["lifetime"] == LIFETIME

        procs["op-a"].send_signal(signal.SIGKILL)  # no goodbye: its keep-alive must expire
        await procs["op-a"].wait()
        killed = time.monotonic()
        await harness.trainer_succeeded("tiny", "rl")
        await harness.wait_object("jobs", "tiny-distill", timeout=45)
        takeover = time.monotonic() - killed
        print(f"takeover: {takeover:.1f} s after SIGKILL (keep-alive lifetime {LIFETIME} s)")
        assert takeover < 30, takeover

        await harness.trainer_running("tiny", "distill")
        await harness.trainer_succeeded("tiny", "distill")
        st = await harness.wait_status("tiny", lambda s: s.get("phase") == "Succeeded", "Succeeded", timeout=20)
        assert st["completedStages"] == ["sft", "rl", "distill"]
        children = [c for p in ("configmaps", "jobs") for c in await harness.list(p, "rlt.dev/run=tiny")]
        assert len(children) == 4  # config + sft, rl, distill Jobs
        for child in children:  # one owner each: the run (no second controller reference)
            assert len(child["metadata"].get("ownerReferences", [])) == 1, child["metadata"]
        # Deleting the run no longer hangs on the finalizer of a dead operator: the new one removes it.
        await harness.delete_run("tiny")
        await harness.wait_gone("rltruns", "tiny", timeout=20)

    requests = list(harness.cluster._requests)
    kill_at = dict(marks)["kill"]
    ops = writes(requests)
    # Every write before the kill came from op-a, every write after it from op-b: never two writers at once.
    assert {who for i, who, _, _ in ops if i < kill_at} == {"op-a"}
    assert {who for i, who, _, _ in ops if i >= kill_at} == {"op-b"}
    # Each child was created once (no duplicate POST, no AlreadyExists race), and has one owner.
    created = [
        r
        for r in requests
        if sender(r) and str(r.method.value) == "POST" and "/events" not in r.url.path and not r.params.get("dryRun")
    ]  # a dry-run create (rlt_operator.apply.dry_run) stores nothing
    names = [(r.url.path, (r.data or {}).get("metadata", {}).get("name")) for r in created]
    assert len(names) == len(set(names)), f"a child was created twice: {sorted(names)}"
    # Status writes: each stage transition written by one replica, the two replicas' writes never interleave.
    status = [(i, who) for i, who, method, path in ops if path.endswith("/rltruns/tiny/status")]
    assert status and all(who == "op-a" for i, who in status if i < kill_at)
    assert all(who == "op-b" for i, who in status if i >= kill_at)
    # Peering needs no more than the rule of the kind table (rlt_operator.cluster.rbac.CLUSTER_PEERING_RULES); its create
    # is used only to put back a deleted peering object (test_a_deleted_peering_object_is_recreated_...).
    assert peering_verbs(requests) <= set(CLUSTER_PEERING.verbs)


async def test_clean_exit_hands_over_at_once(harness, tmp_path):
    """A rolling update or a drain: the working replica gets SIGTERM, drops its record on the way out, and the
    standby resumes without waiting for the lifetime."""
    await create_peering(harness)
    async with replicas(harness, tmp_path) as (start, procs):
        for name in ("op-a", "op-b"):
            await start(name)
            if name == "op-a":
                await harness.create_run(example())
                await harness.wait_object("jobs", "tiny-sft", timeout=40)

        async def both_peered():
            return {"op-a", "op-b"} <= set(await peers(harness))

        await harness.wait(both_peered, "both replicas in the peering object", timeout=40)
        await harness.trainer_running("tiny", "sft")
        procs["op-a"].send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        assert await asyncio.wait_for(procs["op-a"].wait(), 30) == 0
        exited = time.monotonic() - signalled
        gone_at = len(harness.cluster._requests)
        assert "op-a" not in await peers(harness), "a clean exit removes the replica's record"
        await harness.trainer_succeeded("tiny", "sft")
        await harness.wait_object("jobs", "tiny-rl", timeout=LIFETIME)
        handover = time.monotonic() - signalled
        print(f"handover: {handover:.1f} s after SIGTERM (the old replica exited in {exited:.1f} s)")
        assert handover < LIFETIME / 2, handover
    later = writes(list(harness.cluster._requests))
    assert {who for i, who, _, _ in later if i >= gone_at} == {"op-b"}


async def test_sigterm_exits_in_bounded_time_when_the_api_does_not_answer(harness, tmp_path):
    """The API server stops answering as the working replica gets SIGTERM: Kopf's goodbye (a merge-patch dropping
    its peering record) never returns, and Kopf's shutdown would wait for it (the request timeout, 60 s, times its
    retries). The replica exits anyway within --shutdown-timeout, with ExitCode.STOPPED and one line saying why."""
    shutdown = 3
    await create_peering(harness)
    proc, log = await start_operator(harness, tmp_path, "op-a", extra=("--shutdown-timeout", str(shutdown)))
    path = tmp_path / "op-a.log"
    held = asyncio.get_running_loop().create_future()  # never resolved: the API holds the request unanswered
    try:

        async def peered():
            return "op-a" in await peers(harness)

        await harness.wait(peered, "op-a in the peering object", timeout=40)
        harness.cluster["patch", re.compile(rf".*/{CLUSTER_PEERING.plural}/{PEERING}")] << held
        sent = len(harness.cluster._requests)
        proc.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        try:
            rc = await asyncio.wait_for(proc.wait(), shutdown + 10)
        except asyncio.TimeoutError:
            rc = None
        exited = time.monotonic() - signalled
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        log.close()
        held.cancel()
    print(f"exit: rc {rc} {exited:.1f} s after SIGTERM, the goodbye unanswered")
    goodbye = [
        r
        for r in list(harness.cluster._requests)[sent:]
        if sender(r) == "op-a" and str(r.method.value) == "PATCH" and r.url.path.endswith(f"/{PEERING}")
    ]
    assert goodbye, "the replica sent no goodbye to hold"
    assert rc == ExitCode.STOPPED and exited < shutdown + 3, (rc, exited, path.read_text()[-3000:])
    assert f"SIGTERM: the shutdown did not finish in {shutdown}s" in path.read_text()


async def test_namespaced_replicas_peer_in_the_namespace(harness, tmp_path):
    """`--namespace`: the replicas peer in a KopfPeering of each watched namespace (the chart's namespaced mode);
    the paused standby stays live for its liveness probe and sends nothing but its keep-alives."""
    ns = "default"
    body = {"apiVersion": PEERING_KIND.api_version, "kind": PEERING_KIND.kind, "metadata": {"name": PEERING}}
    await harness.call("POST", PEERING_KIND.collection_path(ns), body)
    health = free_port()
    async with replicas(harness, tmp_path) as (start, procs):
        await start("op-a", ("--namespace", ns))
        await harness.create_run(example())
        await harness.wait_object("jobs", "tiny-sft", timeout=40)
        await start("op-b", ("--namespace", ns), health)

        async def both_peered():
            obj = await harness.call("GET", f"{PEERING_KIND.collection_path(ns)}/{PEERING}")
            return {"op-a", "op-b"} <= set(obj.get("status") or {})

        await harness.wait(both_peered, "both replicas in the KopfPeering", timeout=40)
        await harness.trainer_running("tiny", "sft")
        await harness.wait_status("tiny", lambda s: s.get("phase") == "Running", "Running", timeout=20)

        def healthz() -> str:
            with urllib.request.urlopen(f"http://127.0.0.1:{health}/healthz", timeout=3) as r:
                return r.read().decode()

        assert '"runs": 0' in await asyncio.to_thread(healthz)  # live, and no reconcile loop while paused
    requests = list(harness.cluster._requests)
    assert {who for _, who, _, _ in writes(requests)} == {"op-a"}
    paths = {r.url.path for r in requests if sender(r) and "kopfpeerings" in r.url.path}
    assert paths and all(p.startswith(PEERING_KIND.collection_path(ns)) for p in paths), (
        paths
    )  # never the cluster-scoped kind in namespaced mode


async def test_a_deleted_peering_object_is_recreated_and_the_standby_says_so(harness, tmp_path):
    """Deleting the ClusterKopfPeering (an accident, an uninstall racing an install) must not turn the next crash
    into a silent outage: the replicas say so, put it back, and the standby still takes over. Each replica says
    whether it works, in its log and in rlt_operator_active."""
    await create_peering(harness)
    ports = {"op-a": free_port(), "op-b": free_port()}

    def log(name: str) -> str:
        return (tmp_path / f"{name}.log").read_text()

    def active(name: str) -> str | None:
        with urllib.request.urlopen(f"http://127.0.0.1:{ports[name]}/metrics", timeout=3) as r:
            found = re.search(r"^rlt_operator_active (\S+)$", r.read().decode(), re.M)
        return found.group(1) if found else None

    async with replicas(harness, tmp_path) as (start, procs):
        await start("op-a", ("--all-namespaces",), -1, PEERING, (), ports["op-a"])
        await poll_until(lambda: "this replica works (active)" in log("op-a"), "op-a works", 40)
        await harness.create_run(example())
        await harness.wait_object("jobs", "tiny-sft", timeout=40)
        await start("op-b", ("--all-namespaces",), -1, PEERING, (), ports["op-b"])
        await poll_until(lambda: "this replica is the standby" in log("op-b"), "op-b announces itself", 40)
        assert (await asyncio.to_thread(active, "op-a"), await asyncio.to_thread(active, "op-b")) == ("1.0", "0.0")

        await harness.call("DELETE", f"{PEERINGS}/{PEERING}")
        await poll_until(lambda: f"ClusterKopfPeering/{PEERING} recreated" in log("op-a") + log("op-b"), "put back", 30)
        # said by whichever replica looked first: a replica within its first interval checks every 0.25 s
        assert f"peering object ClusterKopfPeering/{PEERING} is missing" in log("op-a") + log("op-b")
        assert "op-a" in await peers(harness), "put back with the records it had"
        await harness.trainer_running("tiny", "sft")
        await asyncio.sleep(3)  # a standby resumed beside the working replica (an empty object) would write now
        b_before = [w for w in writes(list(harness.cluster._requests)) if w[1] == "op-b"]
        assert not b_before, f"the standby wrote while the working replica lived: {b_before}"

        procs["op-a"].send_signal(signal.SIGKILL)
        await procs["op-a"].wait()
        await poll_until(lambda: "this replica works (active)" in log("op-b"), "op-b takes over", LIFETIME + 20)
        assert await asyncio.to_thread(active, "op-b") == "1.0"
        await harness.trainer_succeeded("tiny", "sft")
        await harness.wait_object("jobs", "tiny-rl", timeout=20)
    # Text logs: every line about the run names it; Kopf's handler-success lines are debug, not shown.
    assert "[default/tiny] created jobs/tiny-rl" in log("op-b")
    assert "succeeded." not in log("op-a") + log("op-b")
    # Peering needs exactly the rule of the kind table (rlt_operator.cluster.rbac.CLUSTER_PEERING_RULES), nothing more.
    assert peering_verbs(list(harness.cluster._requests)) == set(CLUSTER_PEERING.verbs)


async def test_json_logs_name_the_namespace_and_run_of_every_run_line(harness, tmp_path):
    """`--log-format json` (the chart's operator.logFormat): one JSON object per line, a run's lines carry it."""
    await create_peering(harness)
    async with replicas(harness, tmp_path) as (start, _procs):
        await start("op-a", ("--all-namespaces",), -1, PEERING, ("--log-format", "json"))
        await harness.create_run(example())
        await harness.wait_object("jobs", "tiny-sft", timeout=40)
        await harness.trainer_running("tiny", "sft")
        await harness.wait_status("tiny", lambda s: s.get("phase") == "Running", "Running", timeout=20)
        # said once its keep-alive is in the peering object (checked every 0.25 s at start-up)
        await poll_until(lambda: "this replica works (active)" in (tmp_path / "op-a.log").read_text(), "active", 20)
    lines = [json.loads(line) for line in (tmp_path / "op-a.log").read_text().splitlines() if line.strip()]
    about_run = [li for li in lines if "tiny" in li["message"]]
    assert any(li["message"] == "created jobs/tiny-sft" for li in about_run), about_run
    for li in about_run:
        assert (li["object"]["namespace"], li["object"]["name"]) == ("default", "tiny"), li
    assert not [li for li in lines if li["message"].endswith(" succeeded.")], "handler-success lines are debug"
    assert any(li["message"].startswith("this replica works (active): it holds Lease default/") for li in lines)


async def test_two_installs_in_one_scope_each_say_so(harness, tmp_path):
    """Two cluster-wide installs (each its own peering object, as the chart labels it) both work on every run: each
    says so once, naming the other's peering object."""
    labels = {"app.kubernetes.io/part-of": "rlt"}
    for name in ("one", "two"):
        meta = {"name": name, "labels": labels}
        await harness.call(
            "POST",
            PEERINGS,
            {"apiVersion": CLUSTER_PEERING.api_version, "kind": CLUSTER_PEERING.kind, "metadata": meta},
        )

    def log(name: str) -> str:
        return (tmp_path / f"{name}.log").read_text()

    async with replicas(harness, tmp_path) as (start, _procs):
        await start("op-a", ("--all-namespaces",), -1, "one")
        await start("op-b", ("--all-namespaces",), -1, "two")
        for me, other in (("op-a", "two"), ("op-b", "one")):
            await poll_until(
                lambda me=me, other=other: (
                    f"its peering object ClusterKopfPeering/{other} has a live replica" in log(me)
                ),
                f"{me} names install {other}",
                40,
            )
        await asyncio.sleep(2 * LIFETIME / 4)  # said once, not every pass
        assert log("op-a").count("another rlt install works") == 1


RUNS_PATH = "/apis/rlt.dev/v1alpha1/namespaces/default/rltruns/"


async def test_of_two_installs_in_one_scope_the_older_works_and_the_newer_gives_way(harness, tmp_path):
    """Two cluster-wide installs (each its own peering object): the one installed first reconciles every run; the
    other writes nothing (not even at a run's deletion), says so at ERROR and reads rlt_operator_active 0 — and
    takes over once the older install has no live replica."""
    labels = {"app.kubernetes.io/part-of": "rlt"}
    for name, created in (("one", "2026-01-01T00:00:00Z"), ("two", "2026-01-02T00:00:00Z")):
        meta = {"name": name, "labels": labels, "creationTimestamp": created}  # "one" installed a day earlier
        body = {"apiVersion": CLUSTER_PEERING.api_version, "kind": CLUSTER_PEERING.kind, "metadata": meta}
        await harness.call("POST", PEERINGS, body)
    ports = {"op-a": free_port(), "op-b": free_port()}

    def log(name: str) -> str:
        return (tmp_path / f"{name}.log").read_text()

    def active(name: str) -> str | None:
        with urllib.request.urlopen(f"http://127.0.0.1:{ports[name]}/metrics", timeout=3) as r:
            found = re.search(r"^rlt_operator_active (\S+)$", r.read().decode(), re.M)
        return found.group(1) if found else None

    async with replicas(harness, tmp_path) as (start, procs):
        # The newer install starts first: it must not reconcile in the moment before it has looked.
        await start("op-b", ("--all-namespaces",), -1, "two", (), ports["op-b"])
        await start("op-a", ("--all-namespaces",), -1, "one", (), ports["op-a"])
        await poll_until(lambda: "this install gives way in the cluster" in log("op-b"), "op-b gives way", 40)
        assert "ClusterKopfPeering/one" in log("op-b")
        await harness.create_run(example())
        other = example()
        other["metadata"]["name"] = "other"
        await harness.create_run(other)
        await harness.wait_object("jobs", "tiny-sft", timeout=40)
        await harness.wait_object("jobs", "other-sft", timeout=40)
        await harness.trainer_running("tiny", "sft")
        await harness.wait_status("tiny", lambda s: s.get("phase") == "Running", "Running", timeout=20)
        await harness.delete_run("other")
        await harness.wait_gone("rltruns", "other", timeout=20)
        await asyncio.sleep(2)
        by_b = [w for w in writes(list(harness.cluster._requests)) if w[1] == "op-b"]
        # Only Kopf's own bookkeeping on the run object, identical from either install: its shared finalizer (added
        # and removed under a resourceVersion precondition) and its diff-base annotation. No child, status or Event.
        requests = list(harness.cluster._requests)
        for i, _by, method, path in by_b:
            assert method == "PATCH" and path.startswith(RUNS_PATH) and not path.endswith("/status"), (method, path)
            assert kopf_bookkeeping(requests[i].data), requests[i].data
        assert (await asyncio.to_thread(active, "op-a"), await asyncio.to_thread(active, "op-b")) == ("1.0", "0.0")
        await poll_until(lambda: "this install was installed first and keeps working" in log("op-a"), "op-a says", 20)

        # The older install goes (its replica dies): once its record expires, the newer one works.
        procs["op-a"].send_signal(signal.SIGKILL)
        await procs["op-a"].wait()
        await poll_until(lambda: "this install works again in the cluster" in log("op-b"), "op-b works", LIFETIME + 20)
        await harness.trainer_succeeded("tiny", "sft")
        await harness.wait_object("jobs", "tiny-rl", timeout=20)
        assert await asyncio.to_thread(active, "op-b") == "1.0"


async def test_a_missing_peering_object_is_one_clear_line(harness, tmp_path):
    """Kopf waits silently (a debug line) for an absent peering object: the operator says it, naming the object."""
    await create_peering(harness)  # another name than the one asked for
    proc, log = await start_operator(harness, tmp_path, "op-a", peering="nope")
    path = tmp_path / "op-a.log"
    try:
        await poll_until(lambda: "not found" in path.read_text(), "the warning", 30, detail=path.read_text)
        await harness.create_run(example())
        await asyncio.sleep(3)
        assert await harness.get("jobs", "tiny-sft") is None, "paused: no peering object, no work"
    finally:
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), 30)
        log.close()
    line = next(li for li in path.read_text().splitlines() if "not found" in li)
    assert "--peering nope: ClusterKopfPeering/nope not found; this replica stays paused until it exists" in line


def test_an_install_gives_way_only_to_an_older_live_one():
    from rlt_operator.cluster.peering import yields_to

    now = time.time()
    live = {"r": {"priority": 1, "lifetime": 20, "lastseen": datetime_iso(now - 5)}}
    dead = {"r": {"priority": 1, "lifetime": 20, "lastseen": datetime_iso(now - 60)}}

    def obj(name, created, status):
        return {"metadata": {"name": name, "creationTimestamp": created}, "status": status}

    own = obj("b", "2026-01-02T00:00:00Z", live)
    older, newer = obj("a", "2026-01-01T00:00:00Z", live), obj("c", "2026-01-03T00:00:00Z", live)
    assert yields_to([own, older, newer], own, now) == ["a"]
    assert yields_to([own, obj("a", "2026-01-01T00:00:00Z", dead), newer], own, now) == []  # its replicas are gone
    same_second = obj("a", "2026-01-02T00:00:00Z", live)
    assert yields_to([own, same_second], own, now) == ["a"] and yields_to([own, same_second], same_second, now) == []


def datetime_iso(t: float) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).isoformat()


def test_auto_priority_prefers_the_replica_started_first():
    rng = random.Random(7)
    older, newer = auto_priority(1_800_000_000, rng), auto_priority(1_800_000_001, rng)
    assert older > newer  # a newcomer joins as the standby
    # started half a second apart, in the same second (seen in CI: the newcomer won a per-second random tie-break)
    assert all(auto_priority(1_800_000_000.1, rng) > auto_priority(1_800_000_000.6, rng) for _ in range(1000))
    same_moment = {auto_priority(1_800_000_000, rng) for _ in range(1000)}
    assert len(same_moment) > 990  # the random tie-break separates replicas started together (16 bits)
    assert max(same_moment) < 2**53 and auto_priority(2_300_000_000, rng) < newer  # exact in JSON; ordered to 2042


def test_bad_durations_are_one_line():
    for flag, value, message in (
        ("--peering-lifetime", "1", "--peering-lifetime '1': expected whole seconds, at least 2"),
        ("--shutdown-timeout", "0", "--shutdown-timeout '0': expected seconds, above 0 and below 3600"),
        ("--shutdown-timeout", "soon", "--shutdown-timeout 'soon': expected seconds, above 0 and below 3600"),
    ):
        proc = subprocess.run([*RLT, "operator", "-A", "--peering", "x", flag, value], capture_output=True, text=True)
        assert proc.returncode == 2 and message in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr


def _active(port: int) -> int | None:
    """rlt_operator_active of the replica whose metrics listen on `port` (None while it does not answer)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1) as r:
            text = r.read().decode()
    except OSError:
        return None
    found = re.search(r"^rlt_operator_active\S* (\S+)$", text, re.M)
    return int(float(found.group(1))) if found else None


async def test_replicas_starting_together_say_active_one_at_a_time_and_sigterm_exits_in_a_second(harness, tmp_path):
    """helm install starts both replicas at once, and the one whose keep-alive lands first may see no other: it
    says rlt_operator_active 1 until it sees the other's. Here op-b (the higher priority, as the replica started
    first) joins just after op-a said active: op-a must say standby within a second (it said active for 5 s more,
    until its next peering check, while op-b said active too). Then the working replica, with a run's loop
    running, gets SIGTERM and exits 0 in about a second as docs/operator.md says, and so does the other."""
    await create_peering(harness)
    ports = {name: free_port() for name in ("op-a", "op-b")}
    async with replicas(harness, tmp_path) as (start, procs):
        health = {n: free_port() for n in ports}  # as the chart runs them: liveness and metrics endpoints on

        def launch(name: str, priority: int) -> Any:
            return start(name, ("--all-namespaces",), health[name], PEERING, ("--priority", str(priority)), ports[name])

        await launch("op-a", 1)
        await poll_until(lambda: _active(ports["op-a"]) == 1, "op-a active", 40, detail=lambda: logs_tail(tmp_path))
        await launch("op-b", 2)
        both: list[float] = []  # when both said active
        began = time.monotonic()
        while time.monotonic() - began < 12:
            states = await asyncio.gather(*(asyncio.to_thread(_active, p) for p in ports.values()))
            if states == [1, 1]:
                both.append(time.monotonic() - began)
            if states == [0, 1] and time.monotonic() - began > 8:
                break
            await asyncio.sleep(0.1)
        overlap = both[-1] - both[0] if both else 0.0
        print(f"both active for {overlap:.2f} s ({len(both)} samples 0.1 s apart)")
        # 0.2-0.3 s measured; the bound leaves room for a loaded machine and still fails the old 5 s.
        assert states == [0, 1] and overlap < 2.5, (states, both)

        await harness.create_run(example())
        await harness.wait_object("jobs", "tiny-sft", timeout=40)
        await harness.trainer_running("tiny", "sft")
        await harness.wait_status("tiny", lambda s: s.get("phase") == "Running", "Running", timeout=20)
        for name, what in (("op-a", "the standby"), ("op-b", "working, with a run's loop running")):
            procs[name].send_signal(signal.SIGTERM)
            signalled = time.monotonic()
            rc = await asyncio.wait_for(procs[name].wait(), 30)
            exited = time.monotonic() - signalled
            print(f"{name}: exit {rc} {exited:.2f} s after SIGTERM, {what}")
            # About a second on an idle machine; a loaded CI machine stretched such an exit to 5.5 s, so the bound is
            # the one that matters to the pod: well inside --shutdown-timeout (10 s), whose timer would exit 75.
            # The sleeps that made it 3 s are pinned by test_a_stopping_operator_waits_half_a_second_for_its_workers.
            assert rc == 0 and exited < 8.0, (name, rc, exited)


async def test_sigterm_exits_at_once_while_a_reconcile_write_hangs(harness, tmp_path):
    """A reconcile's API call in flight (the API slow or unanswering for that one request) when SIGTERM comes: Kopf
    stops its loops at once and says goodbye, and the process exits 0 about a second later, abandoning the call.
    It used to wait for the call's thread (up to the client timeout, 15 s), so --shutdown-timeout fired: exit 75
    after 10 s."""
    await create_peering(harness)
    held = asyncio.get_running_loop().create_future()  # never resolved: the API holds the request unanswered
    async with replicas(harness, tmp_path) as (start, procs):
        await start("op-a")
        await harness.create_run(example())
        await harness.wait_object("jobs", "tiny-sft", timeout=40)
        await harness.wait_status("tiny", lambda s: s.get("phase") == "Pending", "Pending", timeout=20)
        harness.cluster["post", re.compile(r".*/persistentvolumeclaims$")] << held
        await harness.call("DELETE", "/api/v1/namespaces/default/persistentvolumeclaims/tiny-data")
        sent = len(harness.cluster._requests)

        def hanging() -> bool:
            return any(
                sender(r) == "op-a" and str(r.method.value) == "POST" and "persistentvolumeclaims" in r.url.path
                for r in list(harness.cluster._requests)[sent:]
            )

        await poll_until(hanging, "the operator's re-create of the claim", 30, detail=lambda: logs_tail(tmp_path))
        procs["op-a"].send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        rc = await asyncio.wait_for(procs["op-a"].wait(), 30)
        exited = time.monotonic() - signalled
        held.cancel()
        print(f"exit: rc {rc} {exited:.2f} s after SIGTERM, a reconcile's POST unanswered")
        assert "op-a" not in await peers(harness), "the goodbye was sent"
        # Waiting for the call's thread let the 10 s --shutdown-timeout timer fire: exit 75. No wall-clock bound
        # beyond that: a loaded CI machine took 5.5 s for this exit (1 s idle).
        assert rc == 0, (rc, exited, logs_tail(tmp_path))
        assert "abandoning API calls still in flight" in logs_tail(tmp_path), logs_tail(tmp_path)


async def test_a_stopping_operator_waits_half_a_second_for_its_workers(harness):
    """At shutdown Kopf waits `queueing.exit_timeout` for each watch's workers; a standby's peering worker sleeps
    through all of it, so Kopf's 2 s default made every standby's exit take 3 s. The operator's start-up handler
    sets 0.5 s (a setting, not a timing: the end-to-end exits above are measured on machines of any load)."""
    import kopf

    from rlt_operator import handlers
    from rlt_operator.config.settings import OperatorSettings

    settings = kopf.OperatorSettings()
    assert settings.queueing.exit_timeout == 2.0  # Kopf's default, which the handler must lower
    memo = kopf.Memo(settings=dataclasses.replace(OperatorSettings.from_env(), metrics_port=-1))
    await handlers.configure(settings=settings, memo=memo, logger=logging.getLogger("test"))
    assert settings.queueing.exit_timeout <= 0.5
