"""OpenAPI documents for the emulated API (`rlt sandbox`), generated from the served resources and the CRDs' schemas.

kubectl and helm read them: `kubectl explain` walks the v3 schema of a kind for its field descriptions, and
`kubectl apply`/`helm install` look in the v3 document for the `fieldValidation` parameter of each kind's PATCH
operation; when they find it they leave validation to the server instead of downloading the v2 schema. Built-in
kinds get an open schema (the emulator knows their names, not their fields); custom resources get their CRD's
openAPIV3Schema. Pure functions: the glue serves what they return.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
K8S_VERSION = "v1.31.0"


@dataclass(frozen=True)
class Served:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    schema: dict[str, Any] | None = None  # a CRD's openAPIV3Schema; None for built-ins

    @property
    def group_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def prefix(self) -> str:
        """The URL prefix of the group version: api/v1 or apis/<group>/<version>."""
        return f"apis/{self.group}/{self.version}" if self.group else f"api/{self.version}"

    @property
    def gvk(self) -> dict[str, str]:
        return {"group": self.group, "version": self.version, "kind": self.kind}

    def definition_name(self) -> str:
        """Kubernetes' naming of a kind's schema: reversed group, version, kind (dev.rlt.v1alpha1.RLTRun)."""
        if not self.group:
            return f"io.k8s.api.core.{self.version}.{self.kind}"
        parts = self.group.split(".")
        return ".".join([*reversed(parts), self.version, self.kind])


def _object_meta() -> dict[str, Any]:
    return {
        "type": "object",
        "description": "Standard object metadata: name, namespace, labels, annotations, ...",
        "x-kubernetes-preserve-unknown-fields": True,
    }


def kind_schema(res: Served, ref_prefix: str) -> dict[str, Any]:
    """A kind's schema: the CRD's (with apiVersion/kind/metadata as the API server adds them) or an open object."""
    common = {
        "apiVersion": {"type": "string", "description": "APIVersion defines the versioned schema of this object."},
        "kind": {"type": "string", "description": "Kind is a string value representing the REST resource."},
        "metadata": {"$ref": f"{ref_prefix}{OBJECT_META}", "description": "Standard object's metadata."},
    }
    if res.schema is None:
        schema: dict[str, Any] = {
            "type": "object",
            "description": f"{res.kind} ({res.group_version}).",
            "properties": dict(common),
            "x-kubernetes-preserve-unknown-fields": True,
        }
    else:
        schema = json.loads(json.dumps(res.schema))  # a copy: the CRD stays as it was
        schema.setdefault("type", "object")
        schema["properties"] = {**common, **schema.get("properties", {})}
    schema["x-kubernetes-group-version-kind"] = [res.gvk]
    return schema


def _operations(res: Served, body_ref: str) -> dict[str, dict[str, Any]]:
    """The paths of one resource, with the parameters clients look for (fieldValidation, dryRun)."""
    query = [
        {"name": name, "in": "query", "schema": {"type": "string"}, "description": desc}
        for name, desc in (
            ("fieldValidation", "Strict/Warn/Ignore: how unknown or duplicate fields are handled."),
            ("dryRun", "All: do not persist (the emulator honours it on create only)."),
            ("fieldManager", "Name of the actor making the change."),
        )
    ]
    ns = "/namespaces/{namespace}" if res.namespaced else ""
    collection = f"/{res.prefix}{ns}/{res.plural}"
    item = f"{collection}/{{name}}"
    ext = {"x-kubernetes-group-version-kind": res.gvk}

    def op(verb: str, action: str, with_body: bool) -> dict[str, Any]:
        out: dict[str, Any] = {
            "operationId": f"{verb}{res.kind}",
            "x-kubernetes-action": action,
            **ext,
            "parameters": query if action in ("post", "put", "patch") else [],
            "responses": {
                "200": {"description": "OK", "content": {"application/json": {"schema": {"$ref": body_ref}}}}
            },
        }
        if with_body:
            out["requestBody"] = {"content": {"application/json": {"schema": {"$ref": body_ref}}}}
        return out

    return {
        collection: {"get": op("list", "list", False), "post": op("create", "post", True)},
        item: {
            "get": op("read", "get", False),
            "put": op("replace", "put", True),
            "patch": op("patch", "patch", True),
            "delete": op("delete", "delete", False),
        },
    }


def v3_group_version(resources: list[Served]) -> dict[str, Any]:
    """The /openapi/v3/<api|apis/group>/<version> document of one group version."""
    schemas: dict[str, Any] = {OBJECT_META: _object_meta()}
    paths: dict[str, Any] = {}
    for res in resources:
        name = res.definition_name()
        schemas[name] = kind_schema(res, "#/components/schemas/")
        paths.update(_operations(res, f"#/components/schemas/{name}"))
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes (rlt sandbox emulation)", "version": K8S_VERSION},
        "paths": paths,
        "components": {"schemas": schemas},
    }


def v3_discovery(resources: list[Served]) -> dict[str, Any]:
    """/openapi/v3: one entry per group version, with a hash of its document (clients cache by it)."""
    by_gv: dict[str, list[Served]] = {}
    for res in resources:
        by_gv.setdefault(res.prefix, []).append(res)
    paths = {}
    for prefix, members in sorted(by_gv.items()):
        digest = hashlib.sha256(json.dumps(v3_group_version(members), sort_keys=True).encode()).hexdigest()[:16]
        paths[prefix] = {"serverRelativeURL": f"/openapi/v3/{prefix}?hash={digest.upper()}"}
    return {"paths": paths}


def v2_document(resources: list[Served]) -> dict[str, Any]:
    """/openapi/v2 as JSON (Swagger 2.0). Clients that ask for the protobuf form get a 406 from the glue."""
    definitions: dict[str, Any] = {OBJECT_META: _object_meta()}
    paths: dict[str, Any] = {}
    for res in resources:
        name = res.definition_name()
        definitions[name] = kind_schema(res, "#/definitions/")
        for path, ops in _operations(res, f"#/definitions/{name}").items():
            paths[path] = {
                verb: {
                    **{k: v for k, v in body.items() if k not in ("requestBody", "responses", "parameters")},
                    "parameters": [
                        {"name": p["name"], "in": "query", "type": "string", "uniqueItems": True}
                        for p in body["parameters"]
                    ],
                    "responses": {"200": {"description": "OK", "schema": {"$ref": f"#/definitions/{name}"}}},
                }
                for verb, body in ops.items()
            }
    return {
        "swagger": "2.0",
        "info": {"title": "Kubernetes (rlt sandbox emulation)", "version": K8S_VERSION},
        "paths": paths,
        "definitions": definitions,
    }
