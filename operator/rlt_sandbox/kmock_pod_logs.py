"""`kubectl logs` against the sandbox: a pod's log file as text (pods run under `rlt sandbox --run-pods`), and the API
server's answers for a pod that has none yet. A mixin of kmock_glue.Cluster."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kmock._internal import k8s_views

if TYPE_CHECKING:
    from aiohttp import web

POD_LOG = re.compile(r"^/api/v1/namespaces/([^/]+)/pods/([^/]+)/log$")

# (namespace, pod, container or None for the main one) -> its log file, or None: LocalKubelet.log_of
PodLogFile = Callable[[str, str, str | None], Path | None]


class PodLogs:
    """The pod log answers of kmock_glue.Cluster."""

    objects: k8s_views.ObjectsArray  # kmock's object store (the emulator's)
    pod_log: PodLogFile | None  # the Cluster's field

    def _serve_pod_log(
        self, namespace: str, name: str, tail: str | None = None, container: str | None = None
    ) -> web.Response:
        from aiohttp import web

        path = self.pod_log(namespace, name, container) if self.pod_log is not None else None
        if path is not None and not Path(path).exists():  # the pod is there, its container has not started
            return self._not_started(namespace, name, container)
        if path is None or not Path(path).exists():
            why = (
                f'pod "{name}" has no log here: pods run only under `rlt sandbox --run-pods`'
                if self.pod_log is None
                else f'pods "{name}" not found (no pod of that name has run in namespace {namespace})'
            )
            status = {"apiVersion": "v1", "kind": "Status", "status": "Failure", "message": why}
            code = 400 if self.pod_log is None else 404
            return web.json_response(
                {**status, "reason": "BadRequest" if code == 400 else "NotFound", "code": code}, status=code
            )
        text = Path(path).read_text(errors="replace")
        if tail is not None and tail.lstrip("-").isdigit() and int(tail) >= 0:  # `kubectl logs --tail=N`
            lines = text.splitlines(keepends=True)
            text = "".join(lines[len(lines) - int(tail) :]) if int(tail) else ""
        return web.Response(text=text, content_type="text/plain")

    def _not_started(self, namespace: str, name: str, container: str | None) -> web.Response:
        """The API server's 400 for the log of a container that has not started (`kubectl logs` of a pod whose
        init container failed: `... is waiting to start: PodInitializing`)."""
        from aiohttp import web

        pod: dict[str, Any] = next(
            (o.raw for (r, ns, n), o in self.objects.items() if r.plural == "pods" and (ns, n) == (namespace, name)),
            {},
        )
        names = [c["name"] for c in (pod.get("spec") or {}).get("containers") or []]
        container = container or (names[0] if names else "")
        statuses = (pod.get("status") or {}).get("containerStatuses") or []
        state = next((c.get("state") or {} for c in statuses if c.get("name") == container), {})
        reason = (state.get("waiting") or {}).get("reason") or "ContainerCreating"
        why = f'container "{container}" in pod "{name}" is waiting to start: {reason}'
        status = {"apiVersion": "v1", "kind": "Status", "status": "Failure", "message": why}
        return web.json_response({**status, "reason": "BadRequest", "code": 400}, status=400)
