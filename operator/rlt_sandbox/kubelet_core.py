"""The base of the kubelet emulator (rlt_sandbox.kubelet_emulator): its state, API access, per-run ports, termination."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import time
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from rlt_sandbox.kubelet_model import (
    DEFAULT_GRACE_SECONDS,
    LOOPBACK,
    NODE_LABELS,
    PATHS,
    ApiRefused,
    ImageEnv,
    PodRun,
    cluster_dns_pattern,
)
from rlt_sandbox.kubelet_processes import free_port, kill_all, port_free, tagged_processes


class KubeletCore:
    """The emulator's state, its API client, the per-run ports (and the proxy that reaches them) and the end of a
    pod's processes; the layers above (containers, pod lifecycle, controllers) build on it."""

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
        self._task: asyncio.Task[None] | None = None
        self.errors: list[str] = []
        self._links_dir: Path | None = None
        self._links: dict[Path, Path] = {}
        self.run_ports: dict[tuple[str, str], dict[int, int]] = {}  # (ns, run) -> {rendered port: port here}
        self._proxy: web.AppRunner | None = None
        self.proxy_port = 0

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

    def _grace(self, pod: PodRun, deletion: float | None = None) -> float:
        """The pod's terminationGracePeriodSeconds (Kubernetes' default when unset), or the period its deletion
        named (`deletion`: deletionGracePeriodSeconds), at most `grace_seconds`."""
        spec = pod.body.get("spec", {}).get("terminationGracePeriodSeconds", DEFAULT_GRACE_SECONDS)
        own = float(spec if deletion is None else deletion)
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
        else:  # a later deletion with a shorter period shortens it (a kubelet's rule); SIGTERM is not sent again
            pod.kill_at = min(pod.kill_at, time.monotonic() + grace)
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
