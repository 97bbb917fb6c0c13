"""Test harness: the emulated API + the real operator in-process, and the simulated controllers.

kmock runs no controllers, so `Harness` plays them through the HTTP API: it creates the pods a Job or
StatefulSet would create and patches their status (ready, succeeded, failed, restarted).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import datetime as dt
import time
from collections.abc import Callable
from typing import Any, cast

import aiohttp
import yaml
from suite_helpers import EXAMPLES

from rlt.contract.layout import format_time
from rlt_operator.config.kinds import BY_PLURAL, CHILDREN, RUN
from rlt_sandbox.sandbox import InProcessOperator, serve, write_kubeconfig  # noqa: F401

NS = "default"
# How long a wait gives the operator by default: ample on a busy 2-core machine (a passing wait returns at once)
WAIT_S = 30.0
# every kind the operator touches, from its kind table: plural -> collection path with an {ns} placeholder
PATHS = {plural: kind.collection_path("{ns}") for plural, kind in BY_PLURAL.items()}
RUNS = PATHS[RUN.plural]


def example(name: str = "rltrun-tiny.yaml", **overrides: Any) -> dict[str, Any]:
    doc = yaml.safe_load((EXAMPLES / name).read_text())
    doc["metadata"].pop("namespace", None)
    for dotted, value in overrides.items():
        node = doc
        *parents, last = dotted.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    return doc


def server_mode(doc: dict[str, Any], replicas: int = 1) -> dict[str, Any]:
    """The tiny run with vLLM generators (generation.mode=server), so rl has generators + trainer.
    rl keeps one server in sync (TRL), so its GPUs are data parallel inside it."""
    doc = copy.deepcopy(doc)
    doc["spec"]["stages"]["rl"].setdefault("generation", {})["mode"] = "server"
    doc["spec"]["resources"] = {
        "generator": {"replicas": replicas, "gpus": 2, "dataParallelSize": 2},
        "trainer": {"nodes": 2, "gpus": 4},
    }
    doc["spec"]["storage"] = {"accessMode": "ReadWriteMany"}  # two trainer nodes need a shared volume
    # batches a multiple of perDeviceBatchSize × the 8 trainer processes (rlt.spec.run refuses others)
    doc["spec"]["stages"]["rl"]["perDeviceBatchSize"] = 1
    doc["spec"]["stages"]["sft"].update(batchSize=8, perDeviceBatchSize=1)
    return doc


async def poll_until(
    predicate: Callable[[], Any], what: str, timeout: float, every: float = 0.05, detail: Callable[[], str] = str
) -> Any:
    """predicate()'s first true answer (it may be a coroutine function); on timeout fails naming `what` and detail()."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{detail()}".rstrip())
        await asyncio.sleep(every)


class Harness:
    def __init__(self) -> None:
        self.cluster: Any = None
        self.url = ""
        self.operator: InProcessOperator | None = None
        self.session: aiohttp.ClientSession | None = None

    @contextlib.asynccontextmanager
    async def serve(self):
        async with serve() as (cluster, url), aiohttp.ClientSession() as session:
            self.cluster, self.url, self.session = cluster, url, session
            yield self

    # ------------------------------------------------------------------ operator

    async def start_operator(self, liveness: str | None = None) -> None:
        watches_before = self.count_watches()
        self.operator = InProcessOperator(liveness=liveness)
        await self.operator.start()
        # Create objects only once the operator watches them (the emulator replays state on watch).
        await self.wait(
            lambda: self.count_watches() - watches_before >= len(CHILDREN) + 1, "operator watches", timeout=20
        )

    async def stop_operator(self) -> None:
        if self.operator is not None:
            await self.operator.stop()
            self.operator = None

    def count_watches(self) -> int:
        return sum(1 for r in self.cluster._requests if r.params.get("watch") == "true")

    def operator_requests(self, since: int = 0) -> list[Any]:
        """The requests the operator sent from the `since`-th on (Kopf's and rlt's own clients), not the test's:
        it plays the controllers and the kubelet, so its writes must not satisfy a wait for the operator's."""
        from rlt_operator.cluster.kube import USER_AGENT

        return [
            r
            for r in self.cluster._requests[since:]
            if (agent := r.headers.get("User-Agent", "")).startswith("kopf") or agent == USER_AGENT
        ]

    # ------------------------------------------------------------------ HTTP helpers

    async def call(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> Any:
        assert self.session is not None
        async with self.session.request(
            method, self.url + path, json=body, headers={"Content-Type": content_type}
        ) as resp:
            data = await resp.json(content_type=None) if resp.content_length != 0 else None
            if resp.status >= 300:
                raise AssertionError(f"{method} {path}: {resp.status} {data}")
            return data

    async def create_workload(self, plural: str, body: dict[str, Any], ns: str = NS) -> dict[str, Any]:
        """POST a Job or StatefulSet made by hand, with the claims its pods name (the kubelet emulator, as a
        scheduler, keeps a pod whose claim does not exist Pending)."""
        for vol in body["spec"]["template"]["spec"].get("volumes") or []:
            claim = (vol.get("persistentVolumeClaim") or {}).get("claimName")
            path = PATHS["persistentvolumeclaims"].format(ns=ns)
            if claim is not None and await self.get_path(f"{path}/{claim}") is None:
                pvc = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": claim}}
                await self.call("POST", path, pvc | {"spec": {"resources": {"requests": {"storage": "1Gi"}}}})
        return cast("dict[str, Any]", await self.call("POST", PATHS[plural].format(ns=ns), body))

    async def get_path(self, path: str) -> Any:
        assert self.session is not None
        async with self.session.get(self.url + path) as resp:
            return None if resp.status == 404 else await resp.json(content_type=None)

    async def create_run(self, doc: dict[str, Any]) -> dict[str, Any]:
        return await self.call("POST", RUNS.format(ns=NS), doc)

    async def patch_run(self, name: str, patch: dict[str, Any]) -> None:
        await self.call("PATCH", f"{RUNS.format(ns=NS)}/{name}", patch, "application/merge-patch+json")

    async def delete_run(self, name: str) -> None:
        await self.call("DELETE", f"{RUNS.format(ns=NS)}/{name}")

    async def get(self, plural: str, name: str) -> dict[str, Any] | None:
        assert self.session is not None
        async with self.session.get(f"{self.url}{PATHS[plural].format(ns=NS)}/{name}") as resp:
            if resp.status == 404:
                return None
            return await resp.json(content_type=None)

    async def list(self, plural: str, selector: str | None = None) -> list[dict[str, Any]]:
        params = {"labelSelector": selector} if selector else {}
        assert self.session is not None
        async with self.session.get(f"{self.url}{PATHS[plural].format(ns=NS)}", params=params) as resp:
            return (await resp.json(content_type=None))["items"]

    async def run_status(self, name: str) -> dict[str, Any]:
        run = await self.get("rltruns", name)
        return (run or {}).get("status") or {}

    async def set_status(self, plural: str, name: str, status: dict[str, Any]) -> None:
        await self.call(
            "PATCH", f"{PATHS[plural].format(ns=NS)}/{name}/status", {"status": status}, "application/merge-patch+json"
        )

    async def events(self, name: str) -> list[dict[str, Any]]:
        return [e for e in await self.list("events") if e.get("involvedObject", {}).get("name") == name]

    # ------------------------------------------------------------------ waiting

    async def wait(self, predicate: Callable[[], Any], what: str, timeout: float = WAIT_S) -> Any:
        return await poll_until(predicate, what, timeout)

    async def wait_status(
        self, name: str, check: Callable[[dict[str, Any]], bool], what: str, timeout: float = WAIT_S
    ) -> dict[str, Any]:
        async def probe():
            st = await self.run_status(name)
            return st if check(st) else None

        return await self.wait(probe, what, timeout)

    async def wait_object(self, plural: str, name: str, timeout: float = WAIT_S) -> dict[str, Any]:
        return await self.wait(lambda: self.get(plural, name), f"{plural}/{name}", timeout)

    async def wait_gone(self, plural: str, name: str, timeout: float = WAIT_S) -> None:
        async def gone():
            return await self.get(plural, name) is None

        await self.wait(gone, f"{plural}/{name} deleted", timeout)

    # ------------------------------------------------------------------ simulated controllers

    async def generators_ready(self, run: str) -> None:
        """What the StatefulSet controller + kubelet would report once every vLLM server is healthy."""
        sts = await self.wait_object("statefulsets", f"{run}-generator")
        n = sts["spec"]["replicas"]
        await self.set_status("statefulsets", f"{run}-generator", {"replicas": n, "readyReplicas": n})

    async def trainer_running(self, run: str, stage: str) -> dict[str, Any]:
        """The Job controller started every indexed pod, and the kubelet runs them (status.ready)."""
        job = await self.wait_object("jobs", f"{run}-{stage}")
        n = job["spec"]["parallelism"]
        await self.set_status("jobs", job["metadata"]["name"], {"active": n, "ready": n})
        return job

    async def trainer_succeeded(self, run: str, stage: str) -> None:
        job = await self.wait_object("jobs", f"{run}-{stage}")
        n = job["spec"]["completions"]
        await self.set_status(
            "jobs",
            f"{run}-{stage}",
            {"active": 0, "succeeded": n, "conditions": [{"type": "Complete", "status": "True"}]},
        )

    async def trainer_failed(self, run: str, stage: str, failed_ago: float = 0.0) -> None:
        """The Job controller failed the Job `failed_ago` seconds ago (its condition's lastTransitionTime): the
        operator waits up to POD_END_LAG_SECONDS after it to see a failed pod (a test with none passes 60)."""
        await self.set_status(
            "jobs",
            f"{run}-{stage}",
            {
                "active": 0,
                "failed": 1,
                "conditions": [
                    {
                        "type": "Failed",
                        "status": "True",
                        "reason": "BackoffLimitExceeded",
                        "message": "Job has reached the specified backoff limit",
                        "lastTransitionTime": format_time(
                            dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=failed_ago)
                        ),
                    }
                ],
            },
        )

    async def failed_trainer_pod(self, run: str, stage: str, suffix: str, line: str) -> dict[str, Any]:
        """A pod the Job controller created (owned by the Job, with its template's labels) whose trainer exited 1,
        its log's last line in the termination message (as the kubelet reports it)."""
        job = await self.wait_object("jobs", f"{run}-{stage}")
        meta = job["metadata"]
        owner = {"apiVersion": "batch/v1", "kind": "Job", "name": meta["name"], "uid": meta["uid"], "controller": True}
        name = f"{meta['name']}-0-{suffix}"
        labels = job["spec"]["template"]["metadata"]["labels"]
        body = {"metadata": {"name": name, "labels": labels, "ownerReferences": [owner]}, "spec": {"containers": []}}
        await self.call("POST", PATHS["pods"].format(ns=NS), {"apiVersion": "v1", "kind": "Pod", **body})
        end = {"terminated": {"reason": "Error", "exitCode": 1, "message": f"...\n{line}"}}
        await self.set_status(
            "pods", name, {"phase": "Failed", "containerStatuses": [{"name": "trainer", "state": end}]}
        )
        return await self.get("pods", name)

    async def generator_pod(
        self, run: str, index: int, restarts: int = 0, last_exit: tuple[int, str] | None = None
    ) -> None:
        """A pod the StatefulSet controller would create, with the template's labels; `last_exit` (code, log tail):
        its vllm container ended so and the kubelet restarts it after a back-off (CrashLoopBackOff)."""
        sts = await self.wait_object("statefulsets", f"{run}-generator")
        labels = sts["spec"]["template"]["metadata"]["labels"]
        name = f"{run}-generator-{index}"
        if await self.get("pods", name) is None:
            await self.call(
                "POST",
                PATHS["pods"].format(ns=NS),
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": name, "labels": labels},
                    "spec": sts["spec"]["template"]["spec"],
                },
            )
        crashed: dict[str, Any] = {}
        if last_exit is not None:
            end = {"reason": "Error", "exitCode": last_exit[0], "message": last_exit[1]}
            crashed = {"state": {"waiting": {"reason": "CrashLoopBackOff"}}, "lastState": {"terminated": end}}
        await self.set_status(
            "pods",
            name,
            {
                "phase": "Running",
                "containerStatuses": [{"name": "vllm", "ready": restarts == 0, "restartCount": restarts, **crashed}],
            },
        )
