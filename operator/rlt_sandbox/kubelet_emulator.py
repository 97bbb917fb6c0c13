"""An emulator of kubelet (and of the pod-making half of the Job and StatefulSet controllers) for local previews
and tests: it runs the pods the operator rendered as real local processes and reports them back to the emulated
API (kmock), so the operator sees real exit codes.

NOT a kubelet and NOT a container runtime. What it does, and what it stands in for:
- Indexed Jobs: one pod per completion index (annotation and env `JOB_COMPLETION_INDEX`), restartPolicy Never;
  Job status `active/succeeded/failed` and the Complete / Failed conditions; a failed pod's index is retried after
  the Job controller's back-off (doubling per failure) until `backoffLimit` failures are exceeded
  (BackoffLimitExceeded); the `podFailurePolicy` decides first (FailJob: reason PodFailurePolicy at once; Ignore:
  not counted); the pods of a failed Job are terminated, as the Job controller does.
- StatefulSets: pods `<name>-<ordinal>`, restartPolicy Always (a dead container restarts, counted in
  restartCount), readiness from the container's httpGet readinessProbe, `readyReplicas` on the StatefulSet.
- A deleted Job or StatefulSet: its processes get SIGTERM, then SIGKILL after the pod's
  terminationGracePeriodSeconds (Kubernetes' default 30 s when unset; `grace_seconds` caps it); its pods go.
- Containers: `command` + `args` exactly as rendered (ports aside: see Networking), `$(VAR)` expanded as Kubernetes does; `env` exactly as
  rendered (values, fieldRefs of the pod's annotations/labels/name/namespace/IP, Secret and ConfigMap keys read
  from the API). The image is stood in for by an `ImageEnv` (a bin folder on PATH: a venv with the same entry
  points the image has). There is no isolation: every pod shares this machine's network and file system.
- Volumes: a PersistentVolumeClaim is a folder per claim, a ConfigMap is written as files, an emptyDir is a
  folder per pod (reached through a short link: Unix socket paths are short). Paths under a mount in args, env and
  mounted ConfigMap files are mapped onto those folders (there is no mount namespace).
- Networking: every pod is on this machine's loopback. Cluster DNS names (`*.<namespace>.svc[.cluster.local]`) in
  args, env and mounted ConfigMap files are mapped to 127.0.0.1. On a cluster each pod has its own IP, so two runs
  both bind the rendered ports (metrics 9400, rendezvous 29500, vLLM 8000); here they would collide. So every run
  (label rlt.dev/run, else the owner) gets its own ports: the rendered port itself while no other run of this
  emulator holds it and it is free, else a free one. A pod's declared containerPorts (as args), `*_PORT` env values,
  `<dns name>:<port>` and its readinessProbe port are rewritten to its run's ports; `ports_of` and `proxy_url`
  (a small HTTP proxy, `/<namespace>/<run>/<port>/<path>`) let callers (the operator's progress reads) reach them.
  Ports are per run, not per pod: the pods of one run reach each other (rendezvous on pod 0, the generator
  Service) on the same numbers, as on a cluster; so a pod of a run starts only once no other pod of that run is
  terminating with processes left (a restarted gang would find its rendezvous port held by the old one); per-address loopback (127.0.0.N) was not possible, since the
  programs bind 0.0.0.0 (prometheus_client, torch's TCPStore, vLLM) and rendered commands carry no bind address.
- GPU requests: ignored; the processes run on CPU (`CUDA_VISIBLE_DEVICES` empty).
- Init containers run first, one at a time in order, each to its end, as a kubelet runs them; the main container
  starts only after the last one succeeded. An init container that fails ends a restartPolicy Never pod (phase
  Failed, its exit code in `initContainerStatuses`, the main container still waiting `PodInitializing`: what
  kubectl shows as `Init:Error`); under restartPolicy Always it is restarted (restartCount). A container's
  terminationMessagePath is a file of its own here (the path in args and env is mapped onto it); its content is the
  terminated state's message, else, with FallbackToLogsOnError and a failure, its log's tail.
- Image pulls: an image reference that does not parse stays Pending `InvalidImageName`; one matching a pattern of
  `missing_images` (fnmatch) cannot be pulled: `ErrImagePull`, then `ImagePullBackOff` while the back-off lasts
  (`image_backoff_seconds`, doubling up to 5 min), then it is tried again. Every other image is "pulled" at once.
- The node: one, labelled NODE_LABELS plus `node_labels`; a pod whose nodeSelector asks for anything else, or that
  names a PersistentVolumeClaim the API does not hold (a run's `existingClaim` never created), stays Pending,
  Unschedulable, with the scheduler's FailedScheduling Warning Event; the checks are made until they pass, once.
- Pods refused by the API server (a ResourceQuota; rlt_sandbox.kmock_admission checks it) are not made: the Job or
  StatefulSet gets a `FailedCreate` Warning Event with the server's message, as its controller posts it, and the
  creation is tried again on later passes.

By concern, bottom up: rlt_sandbox.kubelet_model (PodRun, ImageEnv, the pure rules), kubelet_processes (a
container's processes, ports), kubelet_core (state, API access, per-run ports, termination), kubelet_containers
(image pulls, env, volumes, names mapped onto this machine), kubelet_pod_lifecycle (phase, restarts, init
containers, status, readiness), kubelet_controllers (the Job and StatefulSet controllers' pod-making half); here
`LocalKubelet`, which runs them (start, stop, the polling loop).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import shutil
import time
from pathlib import Path

import aiohttp
from aiohttp import web

from rlt_sandbox.kubelet_controllers import WorkloadControllers
from rlt_sandbox.kubelet_model import LOOPBACK, PodRun, cluster_dns_pattern
from rlt_sandbox.kubelet_processes import kill_all

log = logging.getLogger("rlt.kubelet_emulator")  # one logger for the whole emulator, as before its split


class LocalKubelet(WorkloadControllers):
    """Watches Jobs and StatefulSets in the emulated API (by polling) and runs their pods as local processes."""

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._session = aiohttp.ClientSession()
        app = web.Application()
        app.router.add_get("/{ns}/{run}/{port:\\d+}/{path:.*}", self._forward)
        self._proxy = web.AppRunner(app, access_log=None)
        await self._proxy.setup()
        site = web.TCPSite(self._proxy, LOOPBACK, 0)
        await site.start()
        self.proxy_port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]  # started: it has a server
        self._task = asyncio.create_task(self._loop(), name="kubelet-emulator")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for pod in list(self.pods.values()):
            self._terminate(pod, grace=1.0)
        deadline = time.monotonic() + 1.5
        while any(not self._gone(p) for p in self.pods.values()) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        for pod in self.pods.values():
            pod.kill_at = 0.0
            self._reap(pod)
        if self._proxy is not None:
            await self._proxy.cleanup()
            self._proxy = None
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self._links_dir is not None:
            shutil.rmtree(self._links_dir, ignore_errors=True)  # the links only; their folders stay
            self._links_dir, self._links = None, {}

    async def _refresh_namespaces(self) -> None:
        listed = (await self._get("/api/v1/namespaces") or {}).get("items", [])
        names = sorted(n["metadata"]["name"] for n in listed if not n["metadata"].get("deletionTimestamp"))
        if names and names != self.namespaces:
            self.namespaces = names
            self.dns = cluster_dns_pattern(self.namespaces)
            self.dns_port = re.compile(rf"{self.dns.pattern}(?::(\d+)\b)?")

    async def _loop(self) -> None:
        while True:
            try:
                if self.follow_namespaces:
                    await self._refresh_namespaces()
                for ns in self.namespaces:
                    await self._sync(ns)
            except asyncio.CancelledError:
                raise
            except Exception as err:  # the emulator must outlive an API hiccup; said loudly
                log.exception("kubelet emulator pass failed")
                self.errors.append(repr(err))
            await asyncio.sleep(self.poll)

    # ------------------------------------------------------------------ for people and tests

    def pod(self, name_prefix: str, namespace: str = "default") -> PodRun:
        found = [p for (ns, n), p in self.pods.items() if ns == namespace and n.startswith(name_prefix)]
        if len(found) != 1:
            raise KeyError(f"{len(found)} pods match {name_prefix!r}: {[p.name for p in found]}")
        return found[0]

    def kill(self, pod_name: str, namespace: str = "default") -> None:
        """A pod dies (node lost, OOM kill): every process of its container gets SIGKILL; the pod then fails."""
        kill_all(self.pods[(namespace, pod_name)].tag)

    def claim_dir(self, claim: str, namespace: str = "default") -> Path:
        return self.workdir / "volumes" / namespace / claim
