"""OpenAPI (v3 discovery and documents, v2 as JSON) and /version of the sandbox's API server, generated from the
served resources and the CRDs' schemas (rlt_sandbox.openapi), so `kubectl explain`, `kubectl apply` without
`--validate=false` and helm's validation work. A mixin of kmock_glue.Cluster."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kmock._internal import k8s, references, rendering

if TYPE_CHECKING:
    from rlt_sandbox.openapi import Served


class OpenApi:
    """The OpenAPI and server-version answers of kmock_glue.Cluster."""

    resources: Any  # kmock's resource registry (the emulator's)
    _schemas: dict[references.resource, dict[str, Any]]  # the Cluster's field: each CRD version's schema

    if TYPE_CHECKING:

        def _get_resources(self) -> list[references.resource]: ...  # the emulator's

    def _served(self) -> list[Served]:
        from rlt_sandbox.openapi import Served

        out = []
        for res in self._get_resources():
            info = self.resources[res] if res in self.resources else None
            assert res.group is not None and res.version is not None and res.plural is not None  # served: all named
            if info is None or not info.kind or "/" in res.plural:
                continue
            out.append(
                Served(res.group, res.version, res.plural, info.kind, bool(info.namespaced), self._schemas.get(res))
            )
        return sorted(out, key=lambda r: (r.group, r.version, r.plural))

    async def _serve_openapi_v3_discovery(self, request: rendering.Request) -> Any:
        from rlt_sandbox.openapi import v3_discovery

        return v3_discovery(self._served())

    async def _serve_openapi_v3(self, request: rendering.Request) -> Any:
        from rlt_sandbox.openapi import v3_group_version

        prefix = request.url.path.removeprefix("/openapi/v3/").strip("/")
        members = [r for r in self._served() if r.prefix == prefix]
        if not members:
            raise k8s.KubernetesError(status=404, reason="NotFound", message=f"no OpenAPI v3 document for {prefix}")
        return v3_group_version(members)

    async def _serve_openapi_v2(self, request: rendering.Request) -> Any:
        from rlt_sandbox.openapi import v2_document

        accept = request.headers.get("Accept", "") or request.headers.get("accept", "")
        if "protobuf" in accept and "json" not in accept:
            # client-go decodes v2 only as protobuf (gnostic), which the emulator does not produce
            return rendering.Response(
                status=406,
                payload={
                    "kind": "Status",
                    "apiVersion": "v1",
                    "status": "Failure",
                    "code": 406,
                    "reason": "NotAcceptable",
                    "message": "the rlt sandbox serves OpenAPI v2 as JSON only; use OpenAPI v3 (/openapi/v3)",
                },
            )
        return v2_document(self._served())

    async def _serve_server_version(self, request: rendering.Request) -> Any:
        return {
            "major": "1",
            "minor": "31",
            "gitVersion": "v1.31.0-kmock",
            "platform": "linux/amd64",
            "gitCommit": "",
            "gitTreeState": "clean",
            "buildDate": "",
            "goVersion": "",
            "compiler": "gc",
        }
