"""The pod-making half of the Job and StatefulSet controllers, as the kubelet emulator plays them: pods per
completion index or ordinal, retries after back-off, Job and StatefulSet status, FailedCreate Events."""

from __future__ import annotations

import logging
import secrets
import time
from typing import Any

from rlt.contract.layout import format_time
from rlt_operator.builders import L_RUN
from rlt_operator.config.kinds import CHILDREN
from rlt_sandbox.kmock_graceful import KUBELET_FINALIZER
from rlt_sandbox.kubelet_model import (
    JOB_INDEX_ANNOTATION,
    PATHS,
    ApiRefused,
    PodConfigError,
    PodRun,
    PodWaiting,
    failure_action,
    job_terminal_conditions,
)
from rlt_sandbox.kubelet_pod_lifecycle import PodLifecycle

log = logging.getLogger("rlt.kubelet_emulator")  # one logger for the whole emulator, as before its split

_KIND_API_VERSION = {k.kind: k.api_version for k in CHILDREN}


class WorkloadControllers(PodLifecycle):
    """One pass over a namespace: its Jobs and StatefulSets, their pods made, advanced and cleaned up."""

    async def _sync(self, ns: str) -> None:
        jobs = {j["metadata"]["name"]: j for j in (await self._get(PATHS["jobs"].format(ns=ns)) or {}).get("items", [])}
        stss = {
            s["metadata"]["name"]: s
            for s in (await self._get(PATHS["statefulsets"].format(ns=ns)) or {}).get("items", [])
        }
        owners = {("Job", n): o for n, o in jobs.items() if not o["metadata"].get("deletionTimestamp")}
        owners |= {("StatefulSet", n): o for n, o in stss.items() if not o["metadata"].get("deletionTimestamp")}

        in_api = {
            p["metadata"]["name"]: p for p in (await self._get(PATHS["pods"].format(ns=ns)) or {}).get("items", [])
        }
        # Pods whose owner is gone (or was replaced by a new object of the same name) are terminated and deleted.
        for key, pod in list(self.pods.items()):
            if key[0] != ns:
                continue
            current = in_api.get(pod.name)
            if current is None or current["metadata"].get("uid") != pod.body["metadata"].get("uid"):
                # deleted through the API (a kept failed pod cleaned up with its run): only the process is left
                self._terminate(pod, self._grace(pod))
                if self._gone(pod):
                    del self.pods[key]
                continue
            marked = current["metadata"].get("deletionGracePeriodSeconds")
            if current["metadata"].get("deletionTimestamp") and marked is not None:
                # deleted with a grace period (kmock_graceful): SIGTERM, SIGKILL after that period, and once its
                # processes are gone the pod goes for good (a kubelet's final deletion)
                self._terminate(pod, self._grace(pod, float(marked)))
                if self._gone(pod):
                    left = [f for f in current["metadata"].get("finalizers") or [] if f != KUBELET_FINALIZER]
                    await self._send(
                        "PATCH",
                        f"{PATHS['pods'].format(ns=ns)}/{pod.name}",
                        {"metadata": {"finalizers": left}},
                        "application/merge-patch+json",
                    )
                    del self.pods[key]
                continue
            refs = current["metadata"].get("ownerReferences") or []
            if not any(r.get("kind") in ("Job", "StatefulSet") for r in refs):
                # handed to another owner (the operator keeps a failed gang's pod for its logs): not this Job's to
                # garbage-collect any more, as the real garbage collector reads the pod's current owners
                pod.body["metadata"]["ownerReferences"] = refs
                continue
            owner = owners.get((pod.owner_kind, pod.owner))
            if owner is None or owner["metadata"]["uid"] != pod.body["metadata"]["ownerReferences"][0]["uid"]:
                self._terminate(pod, self._grace(pod))
                if self._gone(pod):
                    await self._send("DELETE", f"{PATHS['pods'].format(ns=ns)}/{pod.name}", None)
                    del self.pods[key]

        for (kind, _name), obj in owners.items():
            if kind == "Job":
                await self._sync_job(ns, obj)
            else:
                await self._sync_statefulset(ns, obj)

    def _owned(self, ns: str, kind: str, name: str, uid: str) -> list[PodRun]:
        return [
            p
            for (n, _), p in self.pods.items()
            if n == ns
            and p.owner_kind == kind
            and p.owner == name
            and any(r.get("uid") == uid for r in p.body["metadata"].get("ownerReferences") or [])
        ]

    async def _sync_job(self, ns: str, job: dict[str, Any]) -> None:
        meta, spec = job["metadata"], job["spec"]
        status = job.get("status") or {}
        finished = any(
            c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
            for c in status.get("conditions") or []
        )
        completions = int(spec.get("completions", 1))
        pods = self._owned(ns, "Job", meta["name"], meta["uid"])
        for pod in pods:
            await self._advance(ns, pod)
        for pod in pods:
            if pod.phase == "Failed" and pod.failure_action is None:
                pod.failure_action, pod.failure_rule = failure_action(
                    spec.get("podFailurePolicy"), self._pod_status(pod)
                )
        active = sum(p.phase in ("Pending", "Running") for p in pods)
        succeeded = sum(p.phase == "Succeeded" for p in pods)
        # A pod an Ignore rule matched counts neither as failed nor against backoffLimit; it is replaced.
        failed = sum(p.phase == "Failed" and p.failure_action != "Ignore" for p in pods)
        new: dict[str, Any] = {"active": active, "succeeded": succeeded, "failed": failed}
        conds = list(status.get("conditions") or [])
        fail_job = next((p for p in pods if p.failure_action == "FailJob"), None)
        failure: dict[str, Any] | None = None
        if not spec.get("suspend") and not status.get("startTime"):
            new["startTime"] = format_time()  # set once: a real API server refuses to change it
        if not finished:
            if fail_job is not None:
                failure = {
                    "reason": "PodFailurePolicy",
                    "message": f"Container {fail_job.failed_container or fail_job.container['name']} for pod {ns}/{fail_job.name} failed with "
                    f"exit code {fail_job.exit_code} matching FailJob rule at index {fail_job.failure_rule}",
                }
            elif failed > int(spec.get("backoffLimit", 6)):
                failure = {"reason": "BackoffLimitExceeded", "message": "Job has reached the specified backoff limit"}
            if failure is not None:
                # The Job controller ends the other pods of a failed Job.
                for pod in pods:
                    if pod.phase in ("Pending", "Running"):
                        self._terminate(pod, self._grace(pod))
                conds += job_terminal_conditions("FailureTarget", "Failed", failure)
            elif succeeded >= completions:
                done = {"reason": "CompletionsReached", "message": "Reached expected number of succeeded pods"}
                conds += job_terminal_conditions("SuccessCriteriaMet", "Complete", done)
                new["completionTime"] = format_time()
            elif not spec.get("suspend"):
                await self._start_missing_indexes(ns, job, pods, completions, failed)
        new["conditions"] = conds
        if any(status.get(k, 0 if k != "conditions" else []) != v for k, v in new.items()):
            await self._status("jobs", ns, meta["name"], new)

    async def _start_missing_indexes(
        self, ns: str, job: dict[str, Any], pods: list[PodRun], completions: int, failed: int
    ) -> None:
        """A pod for every index that has neither succeeded nor a live pod: at first all of them; after a failure,
        the Job controller's retry, once its back-off (doubling per counted failure, as Kubernetes does) is over."""
        meta = job["metadata"]
        last_failure = max((p.finished_at for p in pods if p.phase == "Failed"), default=0.0)
        if failed and time.monotonic() < last_failure + self.job_backoff * 2 ** (failed - 1):
            return
        for index in range(completions):
            mine = [p for p in pods if p.index == index]
            if any(p.phase in ("Pending", "Running", "Succeeded") for p in mine):
                continue
            name = f"{meta['name']}-{index}-{secrets.token_hex(3)[:5]}"
            await self._create_pod(ns, name, "Job", job, index, hostname=f"{meta['name']}-{index}")

    async def _sync_statefulset(self, ns: str, sts: dict[str, Any]) -> None:
        meta, spec = sts["metadata"], sts["spec"]
        pods = {p.index: p for p in self._owned(ns, "StatefulSet", meta["name"], meta["uid"])}
        for ordinal in range(int(spec.get("replicas", 1))):
            # A pod of the same name from an earlier StatefulSet must be gone first (as the controller waits).
            if ordinal not in pods and (ns, f"{meta['name']}-{ordinal}") not in self.pods:
                await self._create_pod(
                    ns, f"{meta['name']}-{ordinal}", "StatefulSet", sts, ordinal, hostname=f"{meta['name']}-{ordinal}"
                )
        pods = {p.index: p for p in self._owned(ns, "StatefulSet", meta["name"], meta["uid"])}
        for pod in pods.values():
            await self._advance(ns, pod)
        ready = sum(p.ready for p in pods.values())
        status = sts.get("status") or {}
        new = {"replicas": len(pods), "readyReplicas": ready, "availableReplicas": ready}
        if any(status.get(k, 0) != v for k, v in new.items()):
            await self._status("statefulsets", ns, meta["name"], new)

    # ------------------------------------------------------------------ pods

    async def _create_pod(
        self, ns: str, name: str, kind: str, owner: dict[str, Any], index: int, hostname: str
    ) -> None:
        template = owner["spec"]["template"]
        labels = dict((template.get("metadata") or {}).get("labels") or {})
        annotations = dict((template.get("metadata") or {}).get("annotations") or {})
        if kind == "Job":
            labels |= {"job-name": owner["metadata"]["name"], JOB_INDEX_ANNOTATION: str(index)}
            annotations[JOB_INDEX_ANNOTATION] = str(index)
        else:
            labels["statefulset.kubernetes.io/pod-name"] = name
        pod_spec = dict(template["spec"])
        pod_spec["hostname"] = hostname
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": ns,
                "labels": labels,
                "annotations": annotations,
                "ownerReferences": [
                    {
                        # a LIST's items carry no apiVersion/kind on a real API server
                        "apiVersion": owner.get("apiVersion") or _KIND_API_VERSION[kind],
                        "kind": kind,
                        "name": owner["metadata"]["name"],
                        "uid": owner["metadata"]["uid"],
                        "controller": True,
                    }
                ],
            },
            "spec": pod_spec,
            "status": {"phase": "Pending"},
        }
        try:
            created = await self._send("POST", PATHS["pods"].format(ns=ns), body)
        except ApiRefused as err:
            if err.code not in (403, 422):
                raise
            # The controller's answer to a refused pod (a ResourceQuota): a FailedCreate Event, tried again later.
            what = (
                f"Error creating: {err.message}"
                if kind == "Job"
                else f"create Pod {name} in StatefulSet {owner['metadata']['name']} failed error: {err.message}"
            )
            await self._failed_create(ns, kind, owner, what, cause=err.message.replace(name, ""))
            return
        self.failed_creates.pop((ns, owner["metadata"]["uid"]), None)
        pod_dir = self.workdir / "pods" / ns / name
        pod_dir.mkdir(parents=True, exist_ok=True)
        pod = PodRun(
            name=name,
            owner_kind=kind,
            owner=owner["metadata"]["name"],
            index=index,
            restart_policy=pod_spec.get("restartPolicy", "Always"),
            body=created or body,
            dir=pod_dir,
            log_path=pod_dir / "container.log",
            container=pod_spec["containers"][0],
            init_containers=list(pod_spec.get("initContainers") or []),
        )
        run = labels.get(L_RUN) or owner["metadata"]["name"]
        pod.run, pod.ports = run, self._port_map(ns, run, self._rendered_ports(pod.container))
        self.pods[(ns, name)] = pod
        log.info("pod %s/%s: log %s", ns, name, pod.log_path)
        try:
            await self._start(ns, pod)
        except PodWaiting as err:
            pod.waiting = err
            log.warning("pod %s/%s stays Pending: %s: %s", ns, name, err.reason, err.message)
        except PodConfigError as err:
            pod.phase, pod.message = "Failed", f"CreateContainerConfigError: {err}"
            pod.finished_at = time.monotonic()
            log.error("pod %s/%s cannot start: %s", ns, name, err)

    async def _failed_create(self, ns: str, kind: str, owner: dict[str, Any], message: str, cause: str) -> None:
        """The Job or StatefulSet controller's Warning Event for a pod it could not create: one per cause (the
        message without the pod's name), its count and lastTimestamp raised at most every 10 s while it lasts."""
        meta = owner["metadata"]
        key = (ns, meta["uid"])
        now, seen = time.monotonic(), self.failed_creates.get(key)
        events = f"/api/v1/namespaces/{ns}/events"
        if seen is not None and seen[0] == cause:
            if now - seen[3] >= 10.0:
                patch = {"count": seen[2] + 1, "lastTimestamp": format_time()}
                await self._send("PATCH", f"{events}/{seen[1]}", patch, "application/merge-patch+json")
                self.failed_creates[key] = (cause, seen[1], seen[2] + 1, now)
            return
        name = f"{meta['name']}.{secrets.token_hex(8)}"
        component = "job-controller" if kind == "Job" else "statefulset-controller"
        stamp = format_time()
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": ns},
            "involvedObject": {
                "apiVersion": owner.get("apiVersion") or _KIND_API_VERSION[kind],
                "kind": kind,
                "name": meta["name"],
                "namespace": ns,
                "uid": meta["uid"],
            },
            "reason": "FailedCreate",
            "message": message,
            "type": "Warning",
            "source": {"component": component},
            "reportingComponent": component,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        await self._send("POST", events, event)
        self.failed_creates[key] = (cause, name, 1, now)
        log.warning("%s %s/%s cannot create a pod: %s", kind, ns, meta["name"], message)
