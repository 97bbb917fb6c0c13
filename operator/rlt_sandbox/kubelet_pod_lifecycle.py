"""The kubelet emulator's pod lifecycle: a pod's processes folded into its phase, restarts, init containers, the
status it reports and its readiness probe."""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
import urllib.request
from pathlib import Path
from typing import Any

from rlt.contract.layout import format_time
from rlt_sandbox.kubelet_containers import ContainerRuntime
from rlt_sandbox.kubelet_model import LOOPBACK, PodConfigError, PodRun, PodWaiting, log_tail
from rlt_sandbox.kubelet_processes import kill_all

log = logging.getLogger("rlt.kubelet_emulator")  # one logger for the whole emulator, as before its split


class PodLifecycle(ContainerRuntime):
    """Advances each pod a pass at a time and reports its status."""

    def log_of(self, namespace: str, name: str, container: str | None = None) -> Path | None:
        """The log file of a pod's container (the main one by default) that ran here (what `kubectl logs` shows);
        None for a pod that never ran or a container it does not have."""
        pod = self.pods.get((namespace, name))
        if pod is None:
            return None
        names = {c["name"] for c in [pod.container, *pod.init_containers]}
        if container is not None and container not in names:
            return None
        return pod.log_of(container or pod.container["name"])

    async def _advance(self, ns: str, pod: PodRun) -> None:
        """Fold the process's state into the pod's phase, restart it when its policy says so, report changes."""
        self._reap(pod)
        if pod.waiting is not None and pod.proc is None and not pod.terminating:
            try:  # as a kubelet (or the scheduler) retries: the Secret may exist now, the image may pull
                await self._start(ns, pod)
                pod.waiting = None
            except PodWaiting as err:
                pod.waiting = err
            except PodConfigError as err:
                pod.waiting = None
                self._fail(pod, f"CreateContainerConfigError: {err}")
        if pod.proc is not None and pod.phase in ("Pending", "Running"):
            code = pod.proc.poll()
            if code is None:
                if not pod.initializing:
                    pod.phase = "Running"
                    if not pod.ready:
                        pod.ready = await asyncio.to_thread(self._probe, pod)
            elif pod.initializing:
                await self._init_ended(ns, pod, code)
            else:
                pod.exit_code, pod.ready = code, False
                if pod.restart_policy == "Always" and not pod.terminating:
                    pod.restarts += 1
                    log.warning("pod %s/%s exited with %s: restarting (%d)", ns, pod.name, code, pod.restarts)
                    try:
                        await self._start(ns, pod)
                    except PodWaiting as err:  # e.g. its Secret was deleted meanwhile: retried every pass
                        pod.waiting, pod.proc = err, None
                    except PodConfigError as err:
                        pod.phase, pod.message = "Failed", str(err)
                else:
                    pod.phase = "Succeeded" if code == 0 else "Failed"
                    pod.failed_container = pod.container["name"] if code else ""
                    pod.finished_at = time.monotonic()
        report = (
            pod.phase,
            pod.ready,
            pod.restarts,
            pod.exit_code,
            str(pod.waiting),
            pod.step,
            tuple(sorted(pod.init_restarts.items())),
        )
        if report != pod.reported:
            pod.reported = report
            await self._status("pods", ns, pod.name, self._pod_status(pod))
            if pod.waiting is not None and pod.waiting.reason == "Unschedulable":
                await self._failed_scheduling(ns, pod, pod.waiting.message)

    async def _failed_scheduling(self, ns: str, pod: PodRun, message: str) -> None:
        """The scheduler's Warning Event for a pod it cannot place (once per message here; `kubectl describe pod`
        and the operator read it)."""
        meta, stamp = pod.body["metadata"], format_time()
        involved = {"apiVersion": "v1", "kind": "Pod", "name": pod.name, "namespace": ns}
        if meta.get("uid"):
            involved["uid"] = meta["uid"]
        event: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{pod.name}.{secrets.token_hex(8)}", "namespace": ns},
            "involvedObject": involved,
            "reason": "FailedScheduling",
            "message": message,
            "type": "Warning",
            "source": {"component": "default-scheduler"},
            "reportingComponent": "default-scheduler",
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        await self._send("POST", f"/api/v1/namespaces/{ns}/events", event)
        log.warning("pod %s/%s cannot be scheduled: %s", ns, pod.name, message)

    def _fail(self, pod: PodRun, message: str) -> None:
        pod.phase, pod.message, pod.finished_at = "Failed", message, time.monotonic()

    async def _init_ended(self, ns: str, pod: PodRun, code: int) -> None:
        """An init container ended: on success the next container's turn (init or main); on failure the pod fails
        (restartPolicy Never: the main container never starts) or the init container runs again (Always)."""
        c = pod.current
        kill_all(pod.tag)  # nothing it started outlives it
        pod.init_states[pod.step] = {"terminated": {**self._terminated(pod, c, code), "finishedAt": format_time()}}
        pod.proc = None
        if code == 0:
            pod.step += 1
            log.info("pod %s/%s: init container %s done", ns, pod.name, c["name"])
            try:
                await self._start(ns, pod)
            except PodWaiting as err:
                pod.waiting = err
            except PodConfigError as err:
                self._fail(pod, f"CreateContainerConfigError: {err}")
        elif pod.restart_policy == "Always" and not pod.terminating:
            pod.init_restarts[pod.step] = pod.init_restarts.get(pod.step, 0) + 1
            log.warning("pod %s/%s: init container %s exited with %s: restarting", ns, pod.name, c["name"], code)
            try:
                await self._start(ns, pod)
            except PodWaiting as err:
                pod.waiting = err
            except PodConfigError as err:
                self._fail(pod, str(err))
        else:
            log.warning("pod %s/%s: init container %s exited with %s: the pod fails", ns, pod.name, c["name"], code)
            pod.exit_code, pod.failed_container = code, c["name"]
            self._fail(pod, "")

    def _terminated(self, pod: PodRun, c: dict[str, Any], code: int) -> dict[str, Any]:
        """A container's terminated state as a kubelet reports it: the termination message is its
        terminationMessagePath file (at most 4096 bytes), else, with FallbackToLogsOnError after a failure, the
        tail of its log."""
        out: dict[str, Any] = {"exitCode": code, "reason": "Completed" if code == 0 else "Error"}
        try:
            message = pod.message_file(c["name"]).read_bytes()[:4096].decode(errors="replace")
        except OSError:
            message = ""
        if not message.strip() and code != 0 and c.get("terminationMessagePolicy") == "FallbackToLogsOnError":
            message = log_tail(pod.log_of(c["name"]))
        if message.strip():
            out["message"] = message
        return out

    def _pod_status(self, pod: PodRun) -> dict[str, Any]:
        why = pod.waiting
        if why is not None and why.reason == "Unschedulable":  # the scheduler's answer: no node, no containers
            cond = {"type": "PodScheduled", "status": "False", "reason": why.reason, "message": why.message}
            return {"phase": "Pending", "conditions": [cond]}
        state: dict[str, Any]
        if pod.initializing:  # the main container waits for the init containers
            state = {"waiting": {"reason": "PodInitializing"}}
        elif why is not None:
            state = {"waiting": {"reason": why.reason, "message": why.message}}
        elif pod.phase in ("Succeeded", "Failed") and pod.exit_code is not None:
            state = {"terminated": self._terminated(pod, pod.container, pod.exit_code)}
        elif pod.phase == "Running":
            state = {"running": {"startedAt": pod.started_wall} if pod.started_wall else {}}
        else:
            state = {"waiting": {"reason": pod.message.split(":")[0] or "ContainerCreating"}}
        main_ran = not pod.initializing and why is None
        last = {"terminated": {"exitCode": pod.exit_code}} if pod.restarts and pod.exit_code is not None else {}
        out: dict[str, Any] = {
            "phase": pod.phase,
            "podIP": LOOPBACK,
            "hostIP": LOOPBACK,
            "message": pod.message or None,
            "conditions": [
                {"type": "PodScheduled", "status": "True"},
                {"type": "Initialized", "status": "False" if pod.initializing else "True"},
                {"type": "Ready", "status": "True" if pod.ready else "False"},
            ],
            "containerStatuses": [
                {
                    "name": pod.container["name"],
                    "ready": pod.ready,
                    "restartCount": pod.restarts if main_ran else 0,
                    "state": state,
                    "lastState": last if main_ran else {},
                }
            ],
        }
        if pod.initializing:
            pending = [c["name"] for c in pod.init_containers[pod.step :]]
            out["conditions"][1] |= {
                "reason": "ContainersNotInitialized",
                "message": f"containers with incomplete status: [{' '.join(pending)}]",
            }
        if pod.init_containers:
            out["initContainerStatuses"] = [self._init_status(pod, i) for i in range(len(pod.init_containers))]
        return out

    def _init_status(self, pod: PodRun, i: int) -> dict[str, Any]:
        state: dict[str, Any]
        restarts = pod.init_restarts.get(i, 0)
        if i == pod.step and pod.waiting is not None:
            state = {"waiting": {"reason": pod.waiting.reason, "message": pod.waiting.message}}
        elif i == pod.step and pod.proc is not None and pod.proc.poll() is None:
            state = {"running": {}}
        elif i < pod.step or i in pod.init_states:
            state = pod.init_states.get(i) or {"waiting": {"reason": "PodInitializing"}}
        else:
            state = {"waiting": {"reason": "PodInitializing"}}
        done = "terminated" in state and state["terminated"]["exitCode"] == 0
        last = pod.init_states.get(i, {}) if restarts and "terminated" not in state else {}
        return {
            "name": pod.init_containers[i]["name"],
            "ready": done,
            "restartCount": restarts,
            "state": state,
            "lastState": last,
        }

    def _probe(self, pod: PodRun) -> bool:
        probe = pod.container.get("readinessProbe")
        if not probe:
            return True
        get = probe.get("httpGet")
        if not get:
            return True  # only httpGet probes are emulated; others count as passing
        url = f"http://{LOOPBACK}:{pod.ports.get(int(get['port']), get['port'])}{get.get('path', '/')}"
        try:
            with urllib.request.urlopen(url, timeout=1.0) as resp:  # noqa: S310 - loopback
                status: int = resp.status
                return 200 <= status < 400
        except OSError:
            return False
