"""A small generic Kubernetes client over `kubernetes.client.ApiClient`: create / merge-patch / delete by path.

The operator only ever writes whole child manifests with fixed names, so it needs no typed models:
dicts in, dicts out. Reads come from Kopf's watch-fed indices, not from here. Calls are blocking;
the handlers run them in a worker thread.
"""

from __future__ import annotations

import builtins
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rlt import __version__
from rlt_operator.config.kinds import collection_path
from rlt_operator.config.settings import kubeconfig_path

# Who the API server's audit log, `managedFields` and `kubectl get --show-managed-fields` say wrote an object.
USER_AGENT = f"rlt-operator/{__version__}"
FIELD_MANAGER = "rlt-operator"
# client-go's `code` for a request that got no HTTP answer (refused connection, timeout): rest_client_requests_total
NO_ANSWER = "<error>"


class KubeError(RuntimeError):
    def __init__(self, method: str, path: str, status: int, body: str):
        self.status = status
        try:  # a Status object: its message is what the server says (kubectl prints the same)
            answer = json.loads(body)
            self.server_message = str(answer.get("message") or body)[:1000]
            self.server_reason = str(answer.get("reason") or status)  # Forbidden, Invalid, ... (metav1.StatusReason)
        except (ValueError, AttributeError):
            self.server_message = body[:1000]
            self.server_reason = str(status)
        super().__init__(f"{method} {path}: HTTP {status}: {body[:500]}")

    @property
    def refused(self) -> bool:
        """The server refused the request itself (invalid, forbidden, too large): retrying the same write fails the
        same way. Not 404/409, which the callers read as gone / already there."""
        return 400 <= self.status < 500 and self.status not in (404, 409)


class NotLeader(KubeError):
    """A write refused before it was sent: this replica does not hold the leader Lease (rlt_operator.cluster.leader)."""

    def __init__(self, method: str, path: str):
        body = json.dumps({"reason": "NotLeader", "message": "this replica does not hold the leader lease"})
        super().__init__(method, path, 0, body)


@dataclass
class Kube:
    api: Any  # kubernetes.client.ApiClient
    timeout: float = 15.0
    # Told of every request: (server URL, method, HTTP status or NO_ANSWER); the operator's rest_client_requests_total.
    on_request: Callable[[str, str, str], None] | None = None
    # Asked right before every write is sent: False refuses it with NotLeader (the leader Lease's fence; None: no
    # election, every write goes).
    may_write: Callable[[], bool] | None = None
    # The writes that passed the fence and are not answered yet (writes_settled); the lock makes the fence's check
    # and the count one step, so a write is either counted or refused.
    _writing: int = field(default=0, init=False, repr=False)
    _settled: threading.Condition = field(default_factory=threading.Condition, init=False, repr=False)

    @classmethod
    def from_environment(cls) -> Kube:
        """In-cluster service account if present, else $KUBECONFIG / ~/.kube/config (as kubectl does)."""
        import kubernetes

        try:
            kubernetes.config.load_incluster_config()  # type: ignore[no-untyped-call]
            api = kubernetes.client.ApiClient()
        except kubernetes.config.ConfigException:
            # $KUBECONFIG read now (the client library reads it once, at import)
            api = kubernetes.config.new_client_from_config(  # type: ignore[no-untyped-call]
                config_file=kubeconfig_path()
            )
        api.user_agent = USER_AGENT  # not the client library's OpenAPI-Generator/<version>/python
        return cls(api)

    def _call(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: list[tuple[str, str]] | None = None,
        content_type: str = "application/json",
    ) -> tuple[int, Any]:
        fence = self.may_write if method != "GET" else None
        if fence is not None:
            with self._settled:
                if not fence():
                    raise NotLeader(method, path)
                self._writing += 1
        try:
            return self._send(method, path, body, query, content_type)
        finally:
            if fence is not None:
                with self._settled:
                    self._writing -= 1
                    self._settled.notify_all()

    def writes_settled(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds until no write that passed the fence is still unanswered; True when none is.
        A leader that leaves calls it after it stopped acting and before it clears the Lease: a write already on the
        wire then lands while the Lease still names it, never beside a new holder's."""
        with self._settled:
            return self._settled.wait_for(lambda: self._writing == 0, timeout)

    def _send(
        self, method: str, path: str, body: Any, query: list[tuple[str, str]] | None, content_type: str
    ) -> tuple[int, Any]:
        if method in ("POST", "PATCH", "PUT"):
            query = [*(query or []), ("fieldManager", FIELD_MANAGER)]
        m, url, headers, body, _ = self.api.param_serialize(
            method,
            path,
            query_params=query or [],
            body=body,
            header_params={"Content-Type": content_type, "Accept": "application/json"},
            auth_settings=["BearerToken"],
        )
        try:
            resp = self.api.call_api(m, url, header_params=headers, body=body, _request_timeout=self.timeout)
        except Exception:
            self._told(method, NO_ANSWER)
            raise
        self._told(method, str(resp.status))
        raw = resp.read()
        data = json.loads(raw) if raw else None
        return resp.status, data

    def _told(self, method: str, code: str) -> None:
        if self.on_request is not None:
            self.on_request(self.api.configuration.host, method, code)

    def create(self, plural: str, namespace: str, manifest: dict[str, Any], find: bool = True) -> dict[str, Any] | None:
        """None if created; the object that already has the name if not (the caller decides whether it is ours:
        rlt_operator.apply.writes), or {} if that one was deleted meanwhile. `find=False`: {} for any 409, without the
        list that reads the existing object (the leader Lease's Role grants no list)."""
        path = collection_path(plural, namespace)
        status, data = self._call("POST", path, manifest)
        if status == 409 and not find:
            return {}
        if status == 409:
            found = self.list(plural, namespace, field_selector=f"metadata.name={manifest['metadata']['name']}")
            return found[0] if found else {}
        if status >= 300:
            raise KubeError("POST", path, status, json.dumps(data))
        return None

    def get(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        """One object by name, or None (the leader Lease: rlt_operator.cluster.leader; children are read from Kopf's indices)."""
        path = f"{collection_path(plural, namespace)}/{name}"
        status, data = self._call("GET", path)
        if status == 404:
            return None
        if status >= 300:
            raise KubeError("GET", path, status, json.dumps(data))
        return dict(data or {})

    def replace(self, plural: str, namespace: str, name: str, manifest: dict[str, Any]) -> dict[str, Any] | None:
        """PUT the whole object; its metadata.resourceVersion makes it conditional: None when another writer changed
        it since it was read (409 Conflict), else the object written."""
        path = f"{collection_path(plural, namespace)}/{name}"
        status, data = self._call("PUT", path, manifest)
        if status == 409:
            return None
        if status >= 300:
            raise KubeError("PUT", path, status, json.dumps(data))
        return dict(data or {})

    def dry_run_create(self, plural: str, namespace: str, manifest: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """POST with dryRun=All: the server validates and admits the object as a create and stores nothing
        (rlt_operator.apply.dry_run). (HTTP status, the server's answer); a 5xx raises as a create's does."""
        path = collection_path(plural, namespace)
        status, data = self._call("POST", path, manifest, query=[("dryRun", "All")])
        if status >= 500:
            raise KubeError("POST", path, status, json.dumps(data))
        return status, data if isinstance(data, dict) else {}

    def access_review(self, namespace: str, verb: str, group: str, resource: str) -> tuple[bool, str]:
        """Whether this client's user may `verb` `resource` of `group` in `namespace` (a SelfSubjectAccessReview,
        which every authenticated user may create): (allowed, the authorizer's reason). A refusal raises."""
        path = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
        attrs = {"namespace": namespace, "verb": verb, "group": group, "resource": resource}
        body = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": attrs},
        }
        status, data = self._call("POST", path, body)
        if status >= 300 or not isinstance(data, dict):
            raise KubeError("POST", path, status, json.dumps(data))
        answer = data.get("status") or {}
        return bool(answer.get("allowed")), str(answer.get("reason") or "")

    def list(
        self, plural: str, namespace: str, label_selector: str | None = None, field_selector: str | None = None
    ) -> list[dict[str, Any]]:
        """Objects of a kind in a namespace (only the list verb: the operator has no get)."""
        path = collection_path(plural, namespace)
        query = [(k, v) for k, v in (("labelSelector", label_selector), ("fieldSelector", field_selector)) if v]
        status, data = self._call("GET", path, query=query)
        if status >= 300:
            raise KubeError("GET", path, status, json.dumps(data))
        return list((data or {}).get("items") or [])

    def patch(
        self, plural: str, namespace: str, name: str, body: dict[str, Any], subresource: str = ""
    ) -> dict[str, Any]:
        path = f"{collection_path(plural, namespace)}/{name}" + (f"/{subresource}" if subresource else "")
        status, data = self._call("PATCH", path, body, content_type="application/merge-patch+json")
        if status >= 300:
            raise KubeError("PATCH", path, status, json.dumps(data))
        return dict(data or {})

    def delete(
        self,
        plural: str,
        namespace: str,
        name: str,
        propagation: str = "Background",
        uid: str | None = None,
        grace_seconds: int | None = None,
    ) -> bool:
        """True if deleted now, False if it was already gone (404 is success for a delete). With `uid`, only that
        object: one re-created under the same name meanwhile is left alone (the server answers 409).
        `grace_seconds`: the deletion's gracePeriodSeconds (a pod's own terminationGracePeriodSeconds when None)."""
        path = f"{collection_path(plural, namespace)}/{name}"
        options: dict[str, Any] = {"propagationPolicy": propagation}
        if grace_seconds is not None:
            options["gracePeriodSeconds"] = grace_seconds
        if uid:
            options["preconditions"] = {"uid": uid}
        status, data = self._call("DELETE", path, options)
        if status in (404, 409):
            return False
        if status >= 300:
            raise KubeError("DELETE", path, status, json.dumps(data))
        return True

    def names(self, plural: str, namespace: str, name: str) -> builtins.list[str]:  # `list` here: the method
        """The names of the objects called `name` (zero or one): a list with a field selector, which needs only
        the list verb (used once at start-up, for the peering objects)."""
        return [
            item["metadata"]["name"] for item in self.list(plural, namespace, field_selector=f"metadata.name={name}")
        ]
