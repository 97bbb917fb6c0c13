"""Two `rlt operator --peering` processes against the emulated API (Kopf peering): one works, the other waits;
SIGKILL the working one and the standby takes over, within the keep-alive lifetime.

Each process talks to the API with its own bearer token (its kubeconfig), so that every request in the emulated
API's log names its sender. Child status is simulated by the test (kmock runs no controllers).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from op_harness import example, poll_until

from rlt_operator.kinds import CLUSTER_PEERING
from rlt_sandbox.sandbox import kubeconfig

pytestmark = pytest.mark.timeout(150)
RLT = [sys.executable, "-c", "from rlt.cli import main; raise SystemExit(main())"]
PEERING = "rlt-operator"
PEERINGS = CLUSTER_PEERING.collection_path("")
LIFETIME = 20  # the chart's default (operator.peering.lifetime)


async def start_operator(harness: Any, tmp_path: Path, name: str) -> tuple[asyncio.subprocess.Process, Any]:
    config = kubeconfig(harness.url)
    config["users"][0]["user"] = {"token": name}  # the Authorization header tells the two apart
    path = tmp_path / f"{name}.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    env = {
        **os.environ,
        "KUBECONFIG": str(path),
        "POD_ID": name,  # Kopf's peering identity, as the chart sets it from the pod name
        "RLT_OPERATOR_METRICS_PORT": "-1",
        "RLT_OPERATOR_HEALTH_PORT": "-1",
    }
    peering = ["--peering", PEERING, "--peering-lifetime", str(LIFETIME)]
    log = (tmp_path / f"{name}.log").open("wb")
    proc = await asyncio.create_subprocess_exec(
        *RLT, "operator", "--all-namespaces", *peering, env=env, stdout=log, stderr=subprocess.STDOUT
    )
    return proc, log


def sender(request: Any) -> str | None:
    auth = request.headers.get("Authorization", "")
    return auth.removeprefix("Bearer ") if auth.startswith("Bearer ") else None


def writes(requests: list[Any]) -> list[tuple[int, str, str, str]]:
    """(index in the request log, sender, method, path) of every write an operator sent, peering keep-alives aside."""
    out = []
    for i, r in enumerate(requests):
        by, method = sender(r), str(r.method.value)
        if by is not None and method != "GET" and "kopfpeerings" not in r.url.path:
            out.append((i, by, method, r.url.path))
    return out


async def peers(harness: Any) -> dict[str, Any]:
    obj = await harness.call("GET", f"{PEERINGS}/{PEERING}")
    return obj.get("status") or {}


async def test_standby_takes_over_after_sigkill(harness, tmp_path):
    await harness.call(
        "POST",
        PEERINGS,
        {"apiVersion": CLUSTER_PEERING.api_version, "kind": CLUSTER_PEERING.kind, "metadata": {"name": PEERING}},
    )
    procs: dict[str, asyncio.subprocess.Process] = {}
    logs = []
    marks: list[tuple[str, int]] = []  # (event, index into the request log)

    def mark(what: str) -> None:
        marks.append((what, len(harness.cluster._requests)))

    def logs_tail() -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(tmp_path.glob("*.log")))

    try:
        procs["op-a"], log = await start_operator(harness, tmp_path, "op-a")
        logs.append(log)
        await harness.create_run(example())
        await harness.wait_object("jobs", "tiny-sft", timeout=40)
        # The second replica joins once the first works: it is the younger, so the standby.
        procs["op-b"], log = await start_operator(harness, tmp_path, "op-b")
        logs.append(log)

        def b_watching() -> bool:  # its peering watch (paused), or the runs' watch (were it active)
            return any(
                sender(r) == "op-b"
                and r.params.get("watch") == "true"
                and ("kopfpeerings" in r.url.path or "rltruns" in r.url.path)
                for r in list(harness.cluster._requests)
            )

        await poll_until(b_watching, "op-b watching", 40, detail=logs_tail)

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
    except BaseException:
        print(logs_tail())
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

    requests = list(harness.cluster._requests)
    kill_at = dict(marks)["kill"]
    ops = writes(requests)
    # Every write before the kill came from op-a, every write after it from op-b: never two writers at once.
    assert {who for i, who, _, _ in ops if i < kill_at} == {"op-a"}
    assert {who for i, who, _, _ in ops if i >= kill_at} == {"op-b"}
    # Each child was created once (no duplicate POST, no AlreadyExists race), and has one owner.
    created = [r for r in requests if sender(r) and str(r.method.value) == "POST" and "/events" not in r.url.path]
    names = [(r.url.path, (r.data or {}).get("metadata", {}).get("name")) for r in created]
    assert len(names) == len(set(names)), f"a child was created twice: {sorted(names)}"
    for plural in ("configmaps", "jobs"):
        for child in await harness.list(plural, "rlt.dev/run=tiny"):
            assert len(child["metadata"].get("ownerReferences", [])) == 1, child["metadata"]
    # Status writes: each stage transition written by one replica, the two replicas' writes never interleave.
    status = [(i, who) for i, who, method, path in ops if path.endswith("/rltruns/tiny/status")]
    assert status and all(who == "op-a" for i, who in status if i < kill_at)
    assert all(who == "op-b" for i, who in status if i >= kill_at)
