"""A small generic Kubernetes client over `kubernetes.client.ApiClient`: create / merge-patch / delete by path.

The operator only ever writes whole child manifests with fixed names, so it needs no typed models:
dicts in, dicts out. Reads come from Kopf's watch-fed indices, not from here. Calls are blocking;
the handlers run them in a worker thread.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from rlt_operator.kinds import collection_path


class KubeError(RuntimeError):
    def __init__(self, method: str, path: str, status: int, body: str):
        self.status = status
        super().__init__(f"{method} {path}: HTTP {status}: {body[:500]}")


@dataclass
class Kube:
    api: Any  # kubernetes.client.ApiClient
    timeout: float = 15.0

    @classmethod
    def from_environment(cls) -> Kube:
        """In-cluster service account if present, else $KUBECONFIG / ~/.kube/config (as kubectl does)."""
        import kubernetes

        try:
            kubernetes.config.load_incluster_config()
            return cls(kubernetes.client.ApiClient())
        except kubernetes.config.ConfigException:
            return cls(kubernetes.config.new_client_from_config())

    def _call(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: list[tuple[str, str]] | None = None,
        content_type: str = "application/json",
    ) -> tuple[int, Any]:
        m, url, headers, body, _ = self.api.param_serialize(
            method,
            path,
            query_params=query or [],
            body=body,
            header_params={"Content-Type": content_type, "Accept": "application/json"},
            auth_settings=["BearerToken"],
        )
        resp = self.api.call_api(m, url, header_params=headers, body=body, _request_timeout=self.timeout)
        raw = resp.read()
        data = json.loads(raw) if raw else None
        return resp.status, data

    def create(self, plural: str, namespace: str, manifest: dict[str, Any]) -> bool:
        """True if created, False if it already existed (adopt: fixed names make the object ours)."""
        path = collection_path(plural, namespace)
        status, data = self._call("POST", path, manifest)
        if status == 409:
            return False
        if status >= 300:
            raise KubeError("POST", path, status, json.dumps(data))
        return True

    def patch(self, plural: str, namespace: str, name: str, body: dict[str, Any], subresource: str = "") -> dict:
        path = f"{collection_path(plural, namespace)}/{name}" + (f"/{subresource}" if subresource else "")
        status, data = self._call("PATCH", path, body, content_type="application/merge-patch+json")
        if status >= 300:
            raise KubeError("PATCH", path, status, json.dumps(data))
        return data

    def delete(self, plural: str, namespace: str, name: str, propagation: str = "Background") -> bool:
        """True if deleted now, False if it was already gone (404 is success for a delete)."""
        path = f"{collection_path(plural, namespace)}/{name}"
        status, data = self._call("DELETE", path, {"propagationPolicy": propagation})
        if status == 404:
            return False
        if status >= 300:
            raise KubeError("DELETE", path, status, json.dumps(data))
        return True

    def names(self, plural: str, namespace: str, name: str) -> list[str]:
        """The names of the objects called `name` (zero or one): a list with a field selector, which needs only
        the list verb (used once at start-up, for the peering objects)."""
        return [item["metadata"]["name"] for item in self.named(plural, namespace, name)]

    def named(self, plural: str, namespace: str, name: str) -> list[dict[str, Any]]:
        """The objects called `name` (zero or one), by a list with a field selector (the list verb only)."""
        return self.listed(plural, namespace, ("fieldSelector", f"metadata.name={name}"))

    def listed(self, plural: str, namespace: str, selector: tuple[str, str]) -> list[dict[str, Any]]:
        """The objects a (fieldSelector|labelSelector, value) selects."""
        path = collection_path(plural, namespace)
        status, data = self._call("GET", path, query=[selector])
        if status >= 300:
            raise KubeError("GET", path, status, json.dumps(data))
        return list((data or {}).get("items", []))
