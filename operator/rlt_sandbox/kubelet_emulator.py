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
  Service) on the same numbers, as on a cluster; per-address loopback (127.0.0.N) was not possible, since the
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
- The node: one, labelled NODE_LABELS plus `node_labels`; a pod whose nodeSelector asks for anything else stays
  Pending, Unschedulable, as the scheduler reports it.
- Pods refused by the API server (a ResourceQuota; rlt_sandbox.kmock_glue checks it) are not made: the Job or
  StatefulSet gets a `FailedCreate` Warning Event with the server's message, as its controller posts it, and the
  creation is tried again on later passes.
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import json
import logging
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from rlt.contract.layout import format_time
from rlt_operator.builders import L_RUN
from rlt_operator.kinds import CHILDREN, Kind

_KIND_API_VERSION = {k.kind: k.api_version for k in CHILDREN}


def _now() -> str:
    return format_time()


def job_terminal_conditions(interim: str, final: str, why: dict[str, str]) -> list[dict[str, Any]]:
    """A finished Job's conditions as the Job controller writes them (Kubernetes 1.31+): the interim condition
    (SuccessCriteriaMet / FailureTarget) with the final one (Complete / Failed); a real API server refuses
    Complete without SuccessCriteriaMet, and Complete without completionTime."""
    now = _now()
    return [
        {"type": t, "status": "True", "lastProbeTime": now, "lastTransitionTime": now, **why} for t in (interim, final)
    ]


log = logging.getLogger("rlt.kubelet_emulator")

LOOPBACK = "127.0.0.1"
JOB_INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
DEFAULT_GRACE_SECONDS = 30  # a pod's terminationGracePeriodSeconds when its spec has none (Kubernetes' default)
# The operator's children from its kind table, and the Secrets a pod's env and volumes may name (the kubelet's).
PATHS = {
    **{child.plural: child.collection_path("{ns}") for child in CHILDREN},
    "secrets": Kind("", "v1", "secrets", "Secret", ("get",)).collection_path("{ns}"),
}
_VAR_REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)|\$\$")
_FIELD_KEY = re.compile(r"^metadata\.(annotations|labels)\['(.+)'\]$")


@dataclass(frozen=True)
class ImageEnv:
    """What stands in for one container image here: its bin folder (put first on PATH) and its image-level env."""

    bin_dir: str
    env: dict[str, str] = field(default_factory=dict)


def log_tail(path: Path, lines: int = 80, limit: int = 2048) -> str:
    """What the kubelet keeps of a failed container's log as its termination message (FallbackToLogsOnError):
    the last 80 lines, at most 2048 bytes."""
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    tail = b"\n".join(data.splitlines()[-lines:])[-limit:]
    return tail.decode(errors="replace")


class PodWaiting(Exception):
    """What a scheduler or kubelet reports while the pod stays Pending (a node selector no node matches, a missing
    Secret): the pod is not failed, and each pass tries again, so fixing the cause lets it start."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason, self.message = reason, message


# The one emulated node: a pod whose nodeSelector asks for anything else is Unschedulable, as on a cluster.
NODE_LABELS = {"kubernetes.io/hostname": "localhost", "kubernetes.io/os": "linux"}


class PodConfigError(Exception):
    """The pod cannot start as rendered (the kubelet's CreateContainerConfigError)."""


class ApiRefused(RuntimeError):
    """The API server refused a write (status >= 300, not 404): its code and the message of its Status."""

    def __init__(self, what: str, code: int, message: str):
        super().__init__(f"{what}: {code} {message}")
        self.code, self.message = code, message


# A container image reference as the runtime parses it: [host[:port]/]path[:tag][@digest], lowercase path
# components (the reference grammar of the OCI distribution spec, written out here).
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_HOST = r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*|\[[0-9a-fA-F:]+\])"
IMAGE_REFERENCE = re.compile(
    rf"(?:{_HOST}(?::[0-9]+)?/)?{_COMPONENT}(?:/{_COMPONENT})*(?::[\w][\w.-]{{0,127}})?(?:@[a-z0-9]+(?:[.+_-][a-z0-9]+)*:[0-9a-fA-F]{{32,}})?"
)
IMAGE_BACKOFF_CAP = 300.0  # the kubelet's image pull back-off: 10 s doubling, at most 5 min


def image_problem(image: str, missing: list[str]) -> tuple[str, str] | None:
    """(reason, pattern or message) when the image cannot be pulled here: a reference that does not parse
    (InvalidImageName), or one matching a pattern of `missing` (ErrImagePull); None when it can."""
    if not image or not IMAGE_REFERENCE.fullmatch(image) or len(image) > 4096:
        return (
            "InvalidImageName",
            f'Failed to apply default image tag "{image}": couldn\'t parse image name "{image}": invalid reference '
            "format",
        )
    hit = next((p for p in missing if fnmatch.fnmatchcase(image, p)), None)
    return ("ErrImagePull", hit) if hit is not None else None


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion: defined variables are replaced, `$$` is a literal `$`, the rest stays."""

    def sub(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))

    return _VAR_REF.sub(sub, text)


def cluster_dns_pattern(namespaces: list[str]) -> re.Pattern:
    ns = "|".join(re.escape(n) for n in namespaces)
    return re.compile(rf"\b(?:[a-z0-9](?:[-a-z0-9]*[a-z0-9])?\.)+(?:{ns})\.svc(?:\.cluster\.local)?\b")


@dataclass
class PodRun:
    """One emulated pod: its API object's identity and its container's process."""

    name: str
    owner_kind: str  # Job | StatefulSet
    owner: str
    index: int
    restart_policy: str
    body: dict[str, Any]
    dir: Path
    log_path: Path
    container: dict[str, Any]
    proc: subprocess.Popen | None = None
    phase: str = "Pending"
    exit_code: int | None = None
    restarts: int = 0
    ready: bool = False
    message: str = ""
    reported: tuple | None = None
    started_at: float = 0.0
    terminating: bool = False
    kill_at: float = 0.0
    tag: str = ""  # marks every process of the container (its stand-in for a cgroup)
    finished_at: float = 0.0
    failure_action: str | None = None  # a failed Job pod's podFailurePolicy verdict: FailJob | Ignore | Count
    failure_rule: int | None = None  # the index of the rule that gave it (None: no rule matched)
    run: str = ""  # its run (label rlt.dev/run, else its owner): the unit that gets its own ports here
    ports: dict[int, int] = field(default_factory=dict)  # its run's {rendered port: port here}
    waiting: PodWaiting | None = None  # why it stays Pending (retried every pass)
    init_containers: list[dict[str, Any]] = field(default_factory=list)
    step: int = 0  # the init container now due (len(init_containers): the main container's turn)
    init_states: dict[int, dict[str, Any]] = field(default_factory=dict)  # init index -> its last state
    init_restarts: dict[int, int] = field(default_factory=dict)
    failed_container: str = ""  # the container whose exit failed the pod
    pull_failures: int = 0  # failed pulls of the image now due, and when the back-off ends
    pull_retry_at: float = 0.0
    pull_failed_at: float = 0.0

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def initializing(self) -> bool:
        return self.step < len(self.init_containers)

    @property
    def current(self) -> dict[str, Any]:
        """The container whose turn it is: the next init container, else the main one."""
        return self.init_containers[self.step] if self.initializing else self.container

    def log_of(self, name: str) -> Path:
        """A container's log file (the main one's is `log_path`)."""
        return self.log_path if name == self.container["name"] else self.dir / f"init-{name}.log"

    def message_file(self, name: str) -> Path:
        """A container's terminationMessagePath, here."""
        return self.dir / f"{name}.termination-log"


class LocalKubelet:
    """Watches Jobs and StatefulSets in the emulated API (by polling) and runs their pods as local processes."""

    def __init__(
        self,
        api_url: str,
        workdir: str | Path,
        images: dict[str, ImageEnv] | None = None,
        default_image: ImageEnv | None = None,
        namespaces: list[str] | None = None,
        poll_seconds: float = 0.3,
        grace_seconds: float | None = None,
        job_backoff_seconds: float = 10.0,
        follow_namespaces: bool = False,
        node_labels: dict[str, str] | None = None,
        missing_images: list[str] | None = None,
        image_backoff_seconds: float = 10.0,
    ):
        self.api = api_url.rstrip("/")
        self.node_labels = {**NODE_LABELS, **(node_labels or {})}  # the one node's labels (nodeSelector)
        self.missing_images = list(missing_images or [])  # fnmatch patterns of images that cannot be pulled
        self.image_backoff = image_backoff_seconds  # the kubelet's first pull back-off (Kubernetes: 10 s)
        # (namespace, owner uid) -> (message, Event name, count, last posted): one FailedCreate Event per cause
        self.failed_creates: dict[tuple[str, str], tuple[str, str, int, float]] = {}
        self.workdir = Path(workdir).absolute()
        self.images = dict(images or {})
        self.default_image = default_image
        # every namespace of the API, read each pass (one created later gets its pods too), else `namespaces`
        self.follow_namespaces = follow_namespaces
        self.namespaces = namespaces or ["default"]
        self.poll = poll_seconds
        self.grace_cap = grace_seconds  # None: each pod's own grace period, uncapped (as a kubelet)
        self.job_backoff = job_backoff_seconds  # the Job controller's first retry delay (Kubernetes: 10 s)
        self.pods: dict[tuple[str, str], PodRun] = {}  # (namespace, pod name)
        self.owners_seen: dict[tuple[str, str, str], str] = {}  # (ns, kind, name) -> uid
        self.dns = cluster_dns_pattern(self.namespaces)
        self.dns_port = re.compile(rf"{self.dns.pattern}(?::(\d+)\b)?")
        self._session: aiohttp.ClientSession | None = None
        self._task: asyncio.Task | None = None
        self.errors: list[str] = []
        self._links_dir: Path | None = None
        self._links: dict[Path, Path] = {}
        self.run_ports: dict[tuple[str, str], dict[int, int]] = {}  # (ns, run) -> {rendered port: port here}
        self._proxy: web.AppRunner | None = None
        self.proxy_port = 0

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
        self.proxy_port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
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

    # ------------------------------------------------------------------ per-run ports

    def ports_of(self, namespace: str, run: str) -> dict[int, int]:
        """{rendered port: the port it is on here} of one run (empty before its first pod)."""
        return dict(self.run_ports.get((namespace, run), {}))

    def proxy_url(self) -> str:
        """A URL template (`{namespace}`, `{run}`, `{port}`: the rendered port) that reaches a run's pod here."""
        return f"http://{LOOPBACK}:{self.proxy_port}/{{namespace}}/{{run}}/{{port}}"

    def _port_map(self, ns: str, run: str, wanted: set[int]) -> dict[int, int]:
        """The run's ports, extended by `wanted`. A run holds its ports while one of its pods lives; a run without
        a live pod starts afresh (back on the rendered ports when free: sft then rl of a run alone keep 9400)."""
        live = {(n, p.run) for (n, _), p in self.pods.items() if p.phase == "Pending" or not self._exited(p)}
        self.run_ports = {key: m for key, m in self.run_ports.items() if key in live}
        ports = self.run_ports.setdefault((ns, run), {})
        held = {p for key, m in self.run_ports.items() if key != (ns, run) for p in m.values()}
        for port in sorted(wanted - ports.keys()):
            ports[port] = port if port not in held and port_free(port) else free_port()
        return ports

    def _rendered_ports(self, c: dict[str, Any]) -> set[int]:
        """The ports a container binds or reaches: containerPorts, its probe's, `*_PORT` env values, `<dns>:<port>`."""
        out = {int(p["containerPort"]) for p in c.get("ports") or []}
        get = (c.get("readinessProbe") or {}).get("httpGet") or {}
        if str(get.get("port", "")).isdigit():
            out.add(int(get["port"]))
        texts = [str(e.get("value", "")) for e in c.get("env") or []] + [str(a) for a in c.get("args") or []]
        out |= {
            int(e["value"])
            for e in c.get("env") or []
            if e["name"].endswith("PORT") and str(e.get("value", "")).isdigit()
        }
        out |= {int(m.group(1)) for t in texts for m in self.dns_port.finditer(t) if m.group(1)}
        return out

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        info = request.match_info
        port = self.run_ports.get((info["ns"], info["run"]), {}).get(int(info["port"]))
        if port is None:
            return web.Response(status=404, text=f"no pod of run {info['ns']}/{info['run']} has port {info['port']}\n")
        assert self._session is not None
        try:
            async with self._session.get(f"http://{LOOPBACK}:{port}/{info['path']}") as resp:
                body = await resp.read()
                return web.Response(body=body, status=resp.status, content_type=resp.content_type)
        except aiohttp.ClientError as err:
            return web.Response(status=502, text=f"{info['run']}: port {info['port']} (here {port}): {err}\n")

    # ------------------------------------------------------------------ API access

    async def _get(self, path: str) -> Any:
        assert self._session is not None
        async with self._session.get(self.api + path) as resp:
            if resp.status == 404:
                return None
            resp.raise_for_status()
            return await resp.json(content_type=None)

    async def _send(self, method: str, path: str, body: Any, content_type: str = "application/json") -> Any:
        assert self._session is not None
        async with self._session.request(
            method, self.api + path, json=body, headers={"Content-Type": content_type}
        ) as resp:
            if resp.status >= 300 and resp.status != 404:
                text = await resp.text()
                try:
                    message = json.loads(text).get("message") or text
                except (ValueError, AttributeError):
                    message = text
                raise ApiRefused(f"{method} {path}", resp.status, message)
            return await resp.json(content_type=None) if resp.status != 404 else None

    async def _status(self, plural: str, ns: str, name: str, status: dict[str, Any]) -> None:
        await self._send(
            "PATCH", f"{PATHS[plural].format(ns=ns)}/{name}/status", {"status": status}, "application/merge-patch+json"
        )

    # ------------------------------------------------------------------ one pass

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
            new["startTime"] = _now()  # set once: a real API server refuses to change it
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
                new["completionTime"] = _now()
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
                patch = {"count": seen[2] + 1, "lastTimestamp": _now()}
                await self._send("PATCH", f"{events}/{seen[1]}", patch, "application/merge-patch+json")
                self.failed_creates[key] = (cause, seen[1], seen[2] + 1, now)
            return
        name = f"{meta['name']}.{secrets.token_hex(8)}"
        component = "job-controller" if kind == "Job" else "statefulset-controller"
        stamp = _now()
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

    def _fail(self, pod: PodRun, message: str) -> None:
        pod.phase, pod.message, pod.finished_at = "Failed", message, time.monotonic()

    async def _init_ended(self, ns: str, pod: PodRun, code: int) -> None:
        """An init container ended: on success the next container's turn (init or main); on failure the pod fails
        (restartPolicy Never: the main container never starts) or the init container runs again (Always)."""
        c = pod.current
        kill_all(pod.tag)  # nothing it started outlives it
        pod.init_states[pod.step] = {"terminated": self._terminated(pod, c, code)}
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
            state = {"running": {}}
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
                return 200 <= resp.status < 400
        except OSError:
            return False

    # ------------------------------------------------------------------ containers as processes

    def _pull(self, pod: PodRun, image: str) -> None:
        """The image of the container now due, "pulled" (image_problem says which cannot be); a failed pull is
        ErrImagePull for the first half of its back-off and ImagePullBackOff for the second, then tried again."""
        problem = image_problem(image, self.missing_images)
        if problem is None:
            pod.pull_failures = 0
            return
        reason, said = problem
        if reason != "ErrImagePull":
            raise PodWaiting(reason, said)
        now = time.monotonic()
        if now >= pod.pull_retry_at:
            pod.pull_failures += 1
            pod.pull_failed_at = now
            pod.pull_retry_at = now + min(self.image_backoff * 2 ** (pod.pull_failures - 1), IMAGE_BACKOFF_CAP)
        if now < (pod.pull_failed_at + pod.pull_retry_at) / 2:
            raise PodWaiting(
                "ErrImagePull",
                f'rpc error: code = NotFound desc = failed to pull and unpack image "{image}": failed to resolve '
                f'reference "{image}": {image}: not found (rlt sandbox: the image matches --missing-image {said!r})',
            )
        raise PodWaiting("ImagePullBackOff", f'Back-off pulling image "{image}"')

    async def _start(self, ns: str, pod: PodRun) -> None:
        """Start the container whose turn it is (the next init container, else the main one)."""
        c = pod.current
        wanted = pod.body["spec"].get("nodeSelector") or {}
        if any(self.node_labels.get(k) != v for k, v in wanted.items()):
            raise PodWaiting(
                "Unschedulable",
                "0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector "
                f"(the sandbox's one node has {self.node_labels})",
            )
        self._pull(pod, c.get("image", ""))
        image = self.images.get(c.get("image", ""), self.default_image)
        if image is None:
            raise PodConfigError(f"no local stand-in for image {c.get('image')!r}")
        # The termination message file, fresh for each start, where the container's terminationMessagePath says.
        message_file = pod.message_file(c["name"])
        message_file.write_bytes(b"")
        termination = (c.get("terminationMessagePath") or "/dev/termination-log").rstrip("/")
        mounts = sorted([*await self._mounts(ns, pod, c), (termination, message_file)], key=lambda t: -len(t[0]))
        env = {
            "PATH": f"{image.bin_dir}{os.pathsep}/usr/local/bin:/usr/bin:/bin",
            # This machine's home stands for the image's: its caches hold what an image bakes in (the tiny
            # model, DeepSpeed's compiled CPU ops).
            "HOME": os.environ.get("HOME", str(self.workdir / "home")),
            "LANG": "C.UTF-8",
            "CUDA_VISIBLE_DEVICES": "",
            "HOSTNAME": pod.body["spec"].get("hostname", pod.name),
            **image.env,
        }
        pod.tag = f"{ns}/{pod.name}/{secrets.token_hex(4)}"
        env_tag = {TAG_VAR: pod.tag}
        rendered: dict[str, str] = {}
        for entry in c.get("env") or []:
            rendered[entry["name"]] = await self._env_value(ns, pod, entry, {**env, **rendered})
        ports = pod.ports
        declared = {str(p["containerPort"]) for p in c.get("ports") or []}
        # Only what the pod spec says is mapped onto this machine; the stand-in image's own env is already local.
        env |= {
            k: str(ports[int(v)])
            if k.endswith("PORT") and v.isdigit() and int(v) in ports
            else self._localize(v, mounts, ports)
            for k, v in rendered.items()
        }
        argv = [
            str(ports[int(a)]) if a in declared else self._localize(expand(a, env), mounts, ports)
            for a in [*(c.get("command") or []), *(c.get("args") or [])]
        ]
        if not argv:
            raise PodConfigError("the container has no command (image entrypoints are not emulated)")
        exe = shutil.which(argv[0], path=env["PATH"])
        if exe is None:
            raise PodConfigError(f"executable {argv[0]!r} not found in the image stand-in ({image.bin_dir})")
        Path(env["HOME"]).mkdir(parents=True, exist_ok=True)
        cwd = self._localize(c["workingDir"], mounts) if c.get("workingDir") else str(pod.dir)
        logf = pod.log_of(c["name"]).open("ab")
        logf.write(f"--- {time.strftime('%H:%M:%S')} start {' '.join(argv)}\n".encode())
        logf.flush()
        try:
            pod.proc = subprocess.Popen(
                [exe, *argv[1:]],
                env={**env, **env_tag},
                cwd=cwd,
                stdout=logf,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError as err:  # the runtime's StartError
            raise PodConfigError(f"cannot start {argv[0]!r}: {err}") from None
        finally:
            logf.close()
        if pod.initializing:  # an init container runs: the pod is still Pending
            pod.started_at = time.monotonic()
            return
        pod.phase, pod.exit_code, pod.ready, pod.started_at = "Running", None, False, time.monotonic()

    async def _env_value(self, ns: str, pod: PodRun, entry: dict[str, Any], env: dict[str, str]) -> str:
        if "value" in entry:
            return expand(str(entry["value"]), env)
        src = entry.get("valueFrom") or {}
        meta = pod.body["metadata"]
        if "fieldRef" in src:
            path = src["fieldRef"]["fieldPath"]
            m = _FIELD_KEY.match(path)
            if m:
                return str((meta.get(m.group(1)) or {}).get(m.group(2), ""))
            simple = {
                "metadata.name": meta["name"],
                "metadata.namespace": ns,
                "status.podIP": LOOPBACK,
                "status.hostIP": LOOPBACK,
                "spec.nodeName": "localhost",
                "spec.serviceAccountName": pod.body["spec"].get("serviceAccountName", "default"),
            }
            if path not in simple:
                raise PodConfigError(f"env {entry['name']}: fieldRef {path!r} is not emulated")
            return simple[path]
        for kind, plural in (("secretKeyRef", "secrets"), ("configMapKeyRef", "configmaps")):
            if kind in src:
                ref = src[kind]
                obj = await self._get(f"{PATHS[plural].format(ns=ns)}/{ref['name']}")
                data = (obj or {}).get("data") or {}
                if ref["key"] not in data:
                    if ref.get("optional"):
                        return ""
                    # A kubelet keeps the pod Pending (CreateContainerConfigError) until the object or key exists.
                    what = "Secret" if plural == "secrets" else "ConfigMap"
                    raise PodWaiting(
                        "CreateContainerConfigError",
                        f'{plural[:-1]} "{ref["name"]}" not found'
                        if obj is None
                        else f"couldn't find key {ref['key']} in {what} {ns}/{ref['name']}",
                    )
                value = data[ref["key"]]
                if plural == "secrets":
                    import base64

                    value = base64.b64decode(value).decode()
                return value
        raise PodConfigError(f"env {entry['name']}: unsupported valueFrom {sorted(src)}")

    async def _mounts(self, ns: str, pod: PodRun, container: dict[str, Any]) -> list[tuple[str, Path]]:
        """(mountPath, host folder) per volumeMount of `container`, longest mount path first."""
        volumes = {v["name"]: v for v in pod.body["spec"].get("volumes") or []}
        out = []
        files: list[tuple[Path, dict[str, str]]] = []
        for m in container.get("volumeMounts") or []:
            vol = volumes.get(m["name"])
            if vol is None:
                raise PodConfigError(f"volumeMount {m['name']!r} names no volume of the pod")
            if "persistentVolumeClaim" in vol:
                host = self.workdir / "volumes" / ns / vol["persistentVolumeClaim"]["claimName"]
            elif "configMap" in vol:
                host = pod.dir / "volumes" / m["name"]
                cm = await self._get(f"{PATHS['configmaps'].format(ns=ns)}/{vol['configMap']['name']}")
                if cm is None:
                    raise PodConfigError(f"configmap {vol['configMap']['name']!r} not found")
                host.mkdir(parents=True, exist_ok=True)
                files.append((host, cm.get("data") or {}))
            elif "emptyDir" in vol:
                host = pod.dir / "volumes" / m["name"]
                host.mkdir(parents=True, exist_ok=True)
                host = self._short_link(host)
            else:
                raise PodConfigError(
                    f"volume {m['name']!r}: only persistentVolumeClaim, configMap and emptyDir are emulated"
                )
            host.mkdir(parents=True, exist_ok=True)
            out.append((m["mountPath"].rstrip("/"), host))
        mounts = sorted(out, key=lambda t: -len(t[0]))
        # ConfigMap files are read by the programs: DNS names and paths under the pod's mounts in them (a run
        # file's `/data/datasets/x.jsonl` on the run's claim) are mapped as in args and env.
        for host, data in files:
            for key, text in data.items():
                (host / key).write_text(self._localize(text, mounts, pod.ports))
        return mounts

    def _short_link(self, folder: Path) -> Path:
        """A short path (a symlink) to a pod's folder. Programs put their Unix sockets in emptyDirs (/tmp, /dev/shm;
        vLLM's ZMQ sockets go to $TMPDIR), and a socket path must fit in sun_path (107 bytes): in a pod /tmp is four,
        a folder under `workdir` can leave no room."""
        if self._links_dir is None:
            self._links_dir = Path(tempfile.mkdtemp(prefix="kubelet-"))
        link = self._links.get(folder)
        if link is None:
            link = self._links_dir / str(len(self._links))
            link.symlink_to(folder, target_is_directory=True)
            self._links[folder] = link
        return link

    def _localize(self, text: str, mounts: list[tuple[str, Path]], ports: dict[int, int] | None = None) -> str:
        """Cluster DNS names → loopback (`name:port` → loopback and the run's port); paths under a mount → its host
        folder (no mount namespace here)."""
        ports = ports or {}

        def host(m: re.Match) -> str:
            port = m.group(1)
            return LOOPBACK if port is None else f"{LOOPBACK}:{ports.get(int(port), int(port))}"

        text = self.dns_port.sub(host, text)
        if not mounts:
            return text
        # One pass: a host folder put in for one mount (say under /tmp) is never rewritten again by another.
        hosts = dict(mounts)
        pattern = "|".join(re.escape(m) for m, _ in mounts)  # longest first
        return re.sub(rf"(?<![\w/.-])({pattern})(?=/|$|[\s:,;\"'])", lambda m: str(hosts[m.group(1)]), text)

    def _grace(self, pod: PodRun) -> float:
        """The pod's terminationGracePeriodSeconds (Kubernetes' default when unset), at most `grace_seconds`."""
        own = float(pod.body.get("spec", {}).get("terminationGracePeriodSeconds", DEFAULT_GRACE_SECONDS))
        return own if self.grace_cap is None else min(own, self.grace_cap)

    def _terminate(self, pod: PodRun, grace: float) -> None:
        """SIGTERM to the container's main process now, SIGKILL to all of its processes after `grace` (kubelet's
        order); `_reap` finishes the job on later passes, so the event loop (and the API it serves) never waits."""
        if not pod.terminating:
            pod.terminating = True
            pod.kill_at = time.monotonic() + grace
            if pod.proc is not None and pod.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pod.proc.pid, signal.SIGTERM)
        self._reap(pod)

    def _reap(self, pod: PodRun) -> None:
        if pod.terminating and time.monotonic() >= pod.kill_at:
            kill_all(pod.tag)
        if pod.proc is not None and pod.proc.poll() is not None and not pod.terminating:
            # The main process ended: like a container's end, nothing it started outlives it.
            kill_all(pod.tag)

    @staticmethod
    def _exited(pod: PodRun) -> bool:
        return pod.proc is None or pod.proc.poll() is not None

    def _gone(self, pod: PodRun) -> bool:
        return (pod.proc is None or pod.proc.poll() is not None) and not tagged_processes(pod.tag)

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


def failure_action(policy: dict[str, Any] | None, status: dict[str, Any]) -> tuple[str, int | None]:
    """The Job controller's podFailurePolicy for one failed pod: the first rule that matches its containers' exit
    codes (onExitCodes; init containers' too, as Kubernetes checks them) or its conditions (onPodConditions) decides
    (FailJob, Ignore, Count); no match counts."""
    for i, rule in enumerate((policy or {}).get("rules") or []):
        on_codes = rule.get("onExitCodes")
        if on_codes:
            values = {int(v) for v in on_codes.get("values") or []}
            codes = [
                cs["state"]["terminated"]["exitCode"]
                for cs in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or [])
                if "terminated" in (cs.get("state") or {})
                and on_codes.get("containerName") in (None, cs["name"])
                and cs["state"]["terminated"]["exitCode"] != 0  # NotIn never matches a success
            ]
            if on_codes["operator"] == "In":
                hit = any(c in values for c in codes)
            elif on_codes["operator"] == "NotIn":
                hit = any(c not in values for c in codes)
            else:
                raise ValueError(f"podFailurePolicy rule {i}: onExitCodes.operator {on_codes['operator']!r}")
        else:
            conds = {(c.get("type"), c.get("status")) for c in status.get("conditions") or []}
            hit = any((c["type"], c.get("status", "True")) in conds for c in rule.get("onPodConditions") or [])
        if hit:
            return rule["action"], i
    return "Count", None


TAG_VAR = "KUBELET_EMULATOR_CONTAINER"  # inherited by every process a container starts (launchers start sessions)


def tagged_processes(tag: str) -> list[int]:
    """Live processes of one emulated container, found by the tag in their environment."""
    if not tag:
        return []
    needle = f"{TAG_VAR}={tag}".encode()
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
                if state != "Z":
                    out.append(int(entry.name))
        except OSError:
            continue
    return out


def port_free(port: int) -> bool:
    """Whether `port` can be bound on all addresses now (the programs bind 0.0.0.0)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers bind: a TIME_WAIT is no owner
        try:
            sock.bind(("0.0.0.0", port))  # noqa: S104 - a probe, closed at once
        except OSError:
            return False
    return True


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("0.0.0.0", 0))  # noqa: S104
        return int(sock.getsockname()[1])


def kill_all(tag: str) -> None:
    for pid in tagged_processes(tag):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def process_env(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


def rank_processes(pod: PodRun) -> dict[int, int]:
    """{RANK: pid} of the training workers inside a pod (the launcher's children that carry a RANK)."""
    if pod.proc is None:
        return {}
    out = {}
    for pid in tagged_processes(pod.tag):
        env = process_env(pid)
        if "RANK" in env and "LOCAL_RANK" in env and pid != pod.proc.pid:
            out[int(env["RANK"])] = pid
    return out
