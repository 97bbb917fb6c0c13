"""Glue that makes kmock 0.8 behave enough like a Kubernetes API server for Kopf and kubectl.

This is NOT a Kubernetes cluster and NOT an apiserver: it is kmock's in-memory object store behind
HTTP, plus the fixes below, written by hand. There is no scheduler, no controllers (Job and
StatefulSet status never change unless a test or a person patches them), no garbage collection of
owned objects, no admission, no RBAC, no schema validation, no server-side apply. The operator's
tests and `rlt sandbox` use it; anything proven against it still has to be proven on a cluster.

What the glue adds to `kmock.KubernetesEmulator` (each gap was seen failing, see
docs/operator.md and the tooling notes); the two items marked (patch) replace kmock internals and are
installed only by an explicit `patch_kmock()` call (rlt_sandbox.kmock_patches):
- metadata on create (uid, resourceVersion, creationTimestamp, generation, namespace from the URL),
  a new resourceVersion on every write and generation+1 when `spec` changes (Kopf's patches `test`
  the resourceVersion);
- `/status` writes change only `status`, as with a real status subresource;
- list responses carry `kind: <Kind>List`/`apiVersion`, and honour equality label selectors;
- core discovery says `groupVersion: v1` (not `/v1`), the version is a plausible v1.31;
- PUT (replace) works, create answers 201, errors use the API's reasons (NotFound, AlreadyExists);
- watches stream JSON lines and end after `timeoutSeconds`;
- a watch joins the event stream as it takes its snapshot, so an object created while it opens is not lost
  (kmock joined after sending the snapshot);
- creating a CustomResourceDefinition registers its resource and reports it Established (Helm waits for that
  after installing a chart's crds/), and `kubectl get` on it receives a
  server-side Table with the CRD's printer columns (kubectl shows them only that way);
- (patch) matching a request to the emulator's reactions costs O(1), not a scan of the whole request log;
- a failed JSON-patch `test` answers 422 (as the apiserver does), not 500;
- (patch) `parse_path('/api/v1/namespaces')` no longer crashes (kmock bug);
- created objects carry their `kind` (Kopf posts Events without one; `kubectl get events` needs it);
- lists and watches honour equality field selectors (`kubectl describe` asks for one object's Events);
- a watch that asks for a Table (`kubectl get -w`) streams Tables, and a watch from a resourceVersion does not
  replay objects unchanged since (kmock replays everything: kubectl printed each row twice);
- strategic-merge patches of built-in kinds merge lists by their patch-merge keys (rlt_sandbox.strategic_merge:
  `helm upgrade`/`rollback`, `kubectl apply` a second time); custom resources refuse them with 415 as the API does;
- a Secret or ConfigMap sent as protobuf (Helm's release records) is decoded to JSON (rlt_sandbox.kube_protobuf);
- OpenAPI v3 (discovery and one document per group version) and v2 as JSON, generated from the served
  resources and the CRDs' schemas (rlt_sandbox.openapi), so `kubectl explain`, `kubectl apply` without
  `--validate=false` and helm's validation work.

By API feature: `Cluster` here (writes, lists, watches, discovery, OpenAPI, errors) with its mixins
rlt_sandbox.kmock_admission (dryRun, quotas), rlt_sandbox.kmock_tables (server-side Tables, pod STATUS words) and
rlt_sandbox.kmock_pod_logs (`kubectl logs`); rlt_sandbox.kmock_selectors (label and field selectors) and
rlt_sandbox.kmock_patches (the two kmock internals replaced).
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import re
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from typing import TYPE_CHECKING, Any, cast

import attrs
import jsonpatch
import kmock
from kmock._internal import enums, k8s, references, rendering

from rlt.contract.layout import format_time
from rlt_sandbox.kmock_admission import Admission
from rlt_sandbox.kmock_graceful import graceful_pod_deletion
from rlt_sandbox.kmock_openapi import OpenApi
from rlt_sandbox.kmock_pod_logs import POD_LOG, PodLogFile, PodLogs
from rlt_sandbox.kmock_selectors import (
    fields_match,
    labels_match,
    parse_field_selector,
    parse_label_selector,
    resource_version,
)
from rlt_sandbox.kmock_tables import EVENT_COLUMNS, POD_COLUMNS, Tables

if TYPE_CHECKING:
    from aiohttp import web


_REASONS = {404: "NotFound", 409: "AlreadyExists", 422: "Invalid"}


def not_found_status(path: str) -> dict[str, Any]:
    """The API server's 404 for a request path (`rltruns.rlt.dev "nope" not found`), in place of kmock's own
    message, which tells a test author how to declare the object in the emulator."""
    parts = path.split("?", 1)[0].strip("/").split("/")
    group, rest = ("", parts[2:]) if parts[:1] == ["api"] else (parts[1] if len(parts) > 1 else "", parts[3:])
    if rest[:1] == ["namespaces"] and len(rest) > 2:
        rest = rest[2:]
    plural = rest[0] if rest else ""
    name = rest[1] if len(rest) > 1 else None
    resource = f"{plural}.{group}" if group else plural
    message = f'{resource} "{name}" not found' if name else f"the server could not find the requested resource ({path})"
    return {
        "apiVersion": "v1",
        "kind": "Status",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": "NotFound",
        "details": {"name": name, "group": group, "kind": plural},
        "code": 404,
    }


def _now() -> str:
    return format_time()


def _mutate(request: rendering.Request, **fields: Any) -> None:
    # Requests are frozen, and kmock's views match requests by identity: change this one in place.
    for key, value in fields.items():
        object.__setattr__(request, key, value)


_WATCH_OVER = object()  # a watch stream has nothing more to send


def _in_scope(request: rendering.Request, resource: Any, namespace: str | None, name: str | None) -> bool:
    """Does a watch request cover this object? Its resource; its namespace unless the watch is cluster-wide; its
    name when the watch's path names one (kmock's own rule)."""
    return (
        resource == request.resource
        and (request.namespace is None or namespace == request.namespace)
        and (request.name is None or name == request.name)
    )


@attrs.define(kw_only=True)
class Cluster(Admission, Tables, PodLogs, OpenApi, kmock.KubernetesEmulator):
    """kmock's emulator with the glue above. Use as `kmock_cls` in tests, or serve it for the sandbox."""

    _rv: itertools.count[int] = attrs.field(factory=lambda: itertools.count(1), init=False)
    # plural resource → additionalPrinterColumns of its CRD (for server-side Tables)
    _printer_columns: dict[references.resource, list[dict[str, Any]]] = attrs.field(factory=dict, init=False)

    # plural resource → openAPIV3Schema of its CRD (for the OpenAPI documents)
    _schemas: dict[references.resource, dict[str, Any]] = attrs.field(factory=dict, init=False)
    # (namespace, pod) → its log file, when pods run (`rlt sandbox --run-pods`); None: no pod ever runs
    pod_log: PodLogFile | None = attrs.field(default=None, init=False)
    # Set when the server stops: open watches (`kubectl get -w`) end, or the HTTP server waits for them (60 s).
    watches_end: asyncio.Event = attrs.field(factory=asyncio.Event, init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.resources.load_bundled()
        self.seed_namespace("default")
        self._printer_columns[references.resource(group="", version="v1", plural="events")] = EVENT_COLUMNS
        self._printer_columns[references.resource(group="", version="v1", plural="pods")] = POD_COLUMNS
        self.fallback["get", re.compile(r"/openapi/v3")] << self._serve_openapi_v3_discovery
        self.fallback["get", re.compile(r"/openapi/v3/.+")] << self._serve_openapi_v3
        self.fallback["get", re.compile(r"/openapi/v2")] << self._serve_openapi_v2

    # ------------------------------------------------------------------ setup helpers

    def seed_namespace(self, name: str) -> None:
        self.objects["v1/namespaces", None, name] = {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {
                "name": name,
                "uid": str(uuid.uuid4()),
                "resourceVersion": str(next(self._rv)),
                "creationTimestamp": _now(),
            },
            "status": {"phase": "Active"},
        }

    def register_crd(self, crd: dict[str, Any]) -> None:
        """Make a CRD's kind servable (what the apiserver does when a CRD is established)."""
        spec = crd["spec"]
        names = spec["names"]
        for version in spec["versions"]:
            res = references.resource(group=spec["group"], version=version["name"], plural=names["plural"])
            self.resources[res] = kmock.ResourceInfo(
                kind=names["kind"],
                singular=names.get("singular"),
                namespaced=spec.get("scope", "Namespaced") == "Namespaced",
                shortnames=set(names.get("shortNames", [])),
                categories=set(names.get("categories", [])),
                verbs={"create", "delete", "get", "list", "patch", "update", "watch"},
                subresources=set(version.get("subresources", {})),
            )
            self._printer_columns[res] = version.get("additionalPrinterColumns", [])
            if version.get("schema", {}).get("openAPIV3Schema"):
                self._schemas[res] = version["schema"]["openAPIV3Schema"]

    # ------------------------------------------------------------------ request handling

    async def __call__(self, raw_request: web.BaseRequest) -> web.StreamResponse:
        log = POD_LOG.match(raw_request.path) if raw_request.method == "GET" else None
        if log:  # `kubectl logs POD`: the pod's log as text (kmock would answer with the pod object)
            query = raw_request.query
            namespace, name = log.groups()
            return self._serve_pod_log(namespace, name, tail=query.get("tailLines"), container=query.get("container"))
        # Helm stores its releases as Secrets sent in protobuf: decode those (and ConfigMaps) to JSON first.
        if "protobuf" in raw_request.headers.get("Content-Type", "") and raw_request.method in ("POST", "PUT"):
            import json

            from aiohttp import web

            from rlt_sandbox.kube_protobuf import UnsupportedProtobuf, decode

            headers = {**raw_request.headers, "Content-Type": "application/json"}
            clone = raw_request.clone(headers=headers)
            try:
                obj = decode(await clone.read())
            except UnsupportedProtobuf as err:
                return web.json_response(
                    {
                        "apiVersion": "v1",
                        "kind": "Status",
                        "status": "Failure",
                        "code": 415,
                        "reason": "UnsupportedMediaType",
                        "message": str(err),
                    },
                    status=415,
                )
            clone._read_bytes = json.dumps(obj).encode()
            raw_request = clone
        response = await super().__call__(raw_request)
        if getattr(response, "status", None) == 404 and b"kmock" in (getattr(response, "body", None) or b""):
            from aiohttp import web

            return web.json_response(not_found_status(raw_request.path), status=404)
        return response

    async def _handle(self, request: rendering.Request) -> web.StreamResponse:
        if request.resource is not None and request.method == enums.method.PUT and request.name:
            # kmock maps no action to PUT: replace the whole document through a JSON-patch.
            body = dict(request.data or {})
            _mutate(request, action=enums.action.UPDATE, data=[{"op": "replace", "path": "", "value": body}])
        if request.resource is not None:
            refused = self._refusal(request)  # kmock_admission: dryRun beyond create, quotas
            if refused is not None:
                return refused
            if request.action == enums.action.CREATE and isinstance(request.data, dict):
                self._stamp_create(request)
                if request.params.get("dryRun") == "All":
                    return await self._dry_run_create(request)
            elif request.action == enums.action.DELETE and request.name is not None:
                marked = graceful_pod_deletion(self.objects, request)
                if marked is not None:  # the pod stays, marked, until its kubelet deletes it (kmock_graceful)
                    _mutate(request, action=enums.action.UPDATE, data=marked)
                    self._stamp_update(request)
            elif request.action == enums.action.UPDATE and request.name is not None:
                refused = self._strategic_merge(request)
                if refused is not None:
                    return refused
                self._stamp_update(request)
        return await super()._handle(request)

    def _strategic_merge(self, request: rendering.Request) -> web.Response | None:
        """Turn a strategic-merge patch (helm upgrade/rollback, kubectl apply/set) into the JSON patch from the
        stored object to its merge (rlt_sandbox.strategic_merge); None when done or not one. Custom resources
        refuse them with the API server's 415 (clients send merge patches for those)."""
        ctype = next((v for k, v in request.headers.items() if k.lower() == "content-type"), "")
        if "strategic-merge-patch" not in ctype:
            return None
        from aiohttp import web

        from rlt_sandbox import strategic_merge

        def refuse(code: int, reason: str, message: str) -> web.Response:
            body = {"apiVersion": "v1", "kind": "Status", "status": "Failure", "code": code, "reason": reason}
            return web.json_response({**body, "message": message}, status=code)

        assert request.resource is not None and request.resource.group is not None  # an update names its resource
        if not strategic_merge.is_builtin(request.resource.group):
            why = "the body of the request was in an unknown format - accepted media types include: "
            why += "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml"
            return refuse(415, "UnsupportedMediaType", why)
        assert request.name is not None  # _handle merges only updates of a named object
        key = (request.resource, request.namespace, request.name)
        current = self.objects[key] if key in self.objects else None
        if current is None or current.deleted:
            return None  # kmock answers 404 itself
        old = copy.deepcopy(dict(current.raw))
        kind = self.resources[request.resource].kind if request.resource in self.resources else None
        try:
            merged = strategic_merge.apply(old, request.data, request.resource.group, kind or old.get("kind", ""))
        except strategic_merge.PatchError as err:
            return refuse(422, "Invalid", str(err))
        _mutate(request, data=jsonpatch.make_patch(old, merged).patch)
        return None

    def _stamp_create(self, request: rendering.Request) -> None:
        assert request.resource is not None  # only resource requests are stamped
        meta = request.data.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        if request.namespace and not meta.get("namespace"):
            meta["namespace"] = request.namespace
        meta.setdefault("uid", str(uuid.uuid4()))
        meta["resourceVersion"] = str(next(self._rv))
        if not meta.get("creationTimestamp"):
            meta["creationTimestamp"] = _now()
        meta.setdefault("generation", 1)
        request.data.setdefault("apiVersion", f"{request.resource.group}/{request.resource.version}".lstrip("/"))
        if not request.data.get("kind") and request.resource in self.resources:
            request.data["kind"] = self.resources[request.resource].kind  # Kopf's Events come without one
        if request.resource.plural == "customresourcedefinitions" and not request.params.get("dryRun"):
            self.register_crd(request.data)
            # Established at once, as the apiserver reports it: Helm waits for this after installing crds/.
            now = _now()
            request.data["status"] = {
                "acceptedNames": request.data["spec"]["names"],
                "conditions": [
                    {"type": t, "status": "True", "reason": r, "lastTransitionTime": now}
                    for t, r in (("NamesAccepted", "NoConflicts"), ("Established", "InitialNamesAccepted"))
                ],
                "storedVersions": [v["name"] for v in request.data["spec"]["versions"] if v.get("storage")],
            }

    def _stamp_update(self, request: rendering.Request) -> None:
        assert request.resource is not None and request.name is not None  # _handle stamps updates of named objects
        key = (request.resource, request.namespace, request.name)
        current = self.objects[key] if key in self.objects else None
        if current is None or current.deleted:
            return  # kmock answers 404 itself
        old = current.raw
        rv = str(next(self._rv))
        data = request.data
        status_only = request.subresource == "status"
        if isinstance(data, dict):
            data = {"status": data.get("status")} if status_only else dict(data)
            meta = dict(data.get("metadata") or {})
            meta["resourceVersion"] = rv
            if not status_only and "spec" in data and data["spec"] != old.get("spec"):
                meta["generation"] = int(old.get("metadata", {}).get("generation", 1)) + 1
            data["metadata"] = meta
        elif isinstance(data, list):
            ops = list(data)
            if status_only:
                ops = [op for op in ops if op.get("path", "").startswith("/status") or op.get("op") == "test"]
            if not status_only and any(
                op.get("path", "").startswith("/spec") or op.get("path") == "" for op in ops if op.get("op") != "test"
            ):
                gen = int(old.get("metadata", {}).get("generation", 1)) + 1
                ops.append({"op": "add", "path": "/metadata/generation", "value": gen})
            ops.append({"op": "add", "path": "/metadata/resourceVersion", "value": rv})
            data = ops
        _mutate(request, data=data)

    async def _serve_create(self, request: rendering.Request) -> Any:
        if request.params.get("dryRun") == "All":  # _dry_run_create: nothing stored
            return rendering.Response(status=201, payload=request.data)
        # kubernetes-client 37 maps only 201 to the created object.
        return rendering.Response(status=201, payload=await super()._serve_create(request))

    async def _serve_list(self, request: rendering.Request) -> Any:
        # kmock's list answer is a dict (its declared Payload is any answer)
        result = cast("dict[str, Any]", await super()._serve_list(request))
        assert request.resource is not None  # kmock has listed it (else it answered 404)
        items: list[dict[str, Any]] = result["items"]
        selector = request.params.get("labelSelector")
        if selector:
            terms = parse_label_selector(selector)
            items = [o for o in items if labels_match(o.get("metadata", {}).get("labels") or {}, terms)]
        field_selector = request.params.get("fieldSelector")
        if field_selector:
            fterms = parse_field_selector(field_selector)
            items = [o for o in items if fields_match(o, fterms)]
        info = self.resources[request.resource] if request.resource in self.resources else None
        kind = info.kind if info is not None and info.kind else "Object"
        api_version = f"{request.resource.group}/{request.resource.version}".lstrip("/")
        for item in items:  # objects stored before the kind was stamped on create
            if not item.get("kind") and info is not None and info.kind:
                item["kind"], item["apiVersion"] = info.kind, item.get("apiVersion") or api_version
        if self._wants_table(request):
            return self._table(request.resource, items)
        return {
            "apiVersion": api_version,
            "kind": f"{kind}List",
            "metadata": {"resourceVersion": str(next(self._rv))},
            "items": items,
        }

    async def _serve_fetch(self, request: rendering.Request) -> Any:
        obj = cast("dict[str, Any]", await super()._serve_fetch(request))  # kmock answers a fetch with the object
        if self._wants_table(request):
            assert request.resource is not None  # _wants_table holds only for a resource with printer columns
            return self._table(request.resource, [obj])
        return obj

    async def _next_unless_ending(self, it: AsyncIterator[Any], timeout: float | None) -> Any:
        """The stream's next event, or _WATCH_OVER when it ends, its timeout passes or the server stops."""
        nxt = asyncio.ensure_future(anext(it))
        ending = asyncio.ensure_future(self.watches_end.wait())
        try:
            await asyncio.wait({nxt, ending}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            ending.cancel()
            if not nxt.done():
                # The cancelled read must finish before the stream is closed: aclose() on a generator still inside
                # its __anext__ raises "already running", which ended every watch at its time limit with a 500.
                nxt.cancel()
                await asyncio.wait({nxt})
        if nxt.cancelled():
            return _WATCH_OVER
        try:
            return nxt.result()
        except StopAsyncIteration:
            return _WATCH_OVER

    async def _events_since_snapshot(self, request: rendering.Request) -> AsyncGenerator[Any, None]:
        """The objects as they are (ADDED each), then every change after them, with no gap between the two.

        kmock's own watch took its snapshot, sent it, and only then joined the resource's event bus: an object
        created meanwhile was in neither, and a watch opened as it was created never saw it (a restarted
        operator missed the run applied at that moment). Here the bus is joined under the same lock as the
        snapshot is taken, and writes publish under that lock too."""
        yield b""  # the headers go out before the first event (kmock's watch does the same)
        assert request.resource is not None  # kmock routes only resource requests to its watch
        bus = self._buses[request.resource]
        async with self._lock:
            mark = await bus.mark()
            snapshot = [
                {"type": "ADDED", "object": obj.raw}
                for (resource, namespace, name), obj in self.objects.items()
                if not obj.deleted and _in_scope(request, resource, namespace, name)
            ]
        try:
            for event in snapshot:
                yield event
            async for event in bus.stream(since=mark):
                meta = event.get("object", {}).get("metadata", {})
                if _in_scope(request, request.resource, meta.get("namespace"), meta.get("name")):
                    yield event
        finally:
            await bus.unmark(mark)

    # kmock's watch is an async generator; this one answers with a Response wrapping it (a Payload kmock unfolds).
    async def _serve_watch(self, request: rendering.Request) -> Any:  # type: ignore[override]
        # JSON lines (kubectl refuses octet-stream) and an end after timeoutSeconds (clients rely on it).
        resource = request.resource
        assert resource is not None  # kmock routes only resource requests to its watch
        timeout = float(request.params.get("timeoutSeconds") or 0) or None
        selector = request.params.get("labelSelector")
        terms = parse_label_selector(selector) if selector else None
        field_selector = request.params.get("fieldSelector")
        fterms = parse_field_selector(field_selector) if field_selector else None
        since = resource_version({"metadata": {"resourceVersion": request.params.get("resourceVersion")}})
        as_table = self._wants_table(request)
        stream = self._events_since_snapshot(request)

        async def limited() -> AsyncIterator[Any]:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout if timeout else None
            it = aiter(stream)
            first_table = True
            try:
                while True:
                    remaining = None if deadline is None else deadline - loop.time()
                    if remaining is not None and remaining <= 0:
                        return
                    event = await self._next_unless_ending(it, remaining)
                    if event is _WATCH_OVER:
                        return
                    if not isinstance(event, dict):
                        yield event
                        continue
                    obj = event.get("object", {})
                    if terms is not None and not labels_match(obj.get("metadata", {}).get("labels") or {}, terms):
                        continue
                    if fterms is not None and not fields_match(obj, fterms):
                        continue
                    rv = resource_version(obj)
                    if since is not None and rv is not None and rv <= since and event.get("type") == "ADDED":
                        continue  # kmock replays the current state; a watch from a version starts after it
                    if as_table and event.get("type") in ("ADDED", "MODIFIED", "DELETED"):
                        event = {"type": event["type"], "object": self._table(resource, [obj], first_table)}
                        first_table = False
                    yield event
            finally:
                await stream.aclose()  # `it` is the generator itself

        return rendering.Response(headers={"Content-Type": "application/json"}, payload=limited())

    async def _serve_version(self, request: rendering.Request) -> Any:
        result = cast("dict[str, Any]", await super()._serve_version(request))  # kmock's APIResourceList, a dict
        result["groupVersion"] = result["groupVersion"].lstrip("/")  # core says "/v1" in kmock 0.8
        for res in result.get("resources", []):
            if "/" in res["name"]:  # kmock repeats short names on subresources: kubectl then finds two matches
                res["shortNames"], res["categories"] = [], []
        return result

    async def _render_error(self, exc: Exception) -> web.StreamResponse:
        if isinstance(exc, jsonpatch.JsonPatchTestFailed):
            # A failed `test` (Kopf's resourceVersion precondition) is a 422 on a real apiserver; Kopf then
            # re-reads and retries, whereas kmock's 500 makes it resend the same stale patch.
            exc = k8s.KubernetesError(status=422, reason="Invalid", message=f"the patch test failed: {exc}")
        if isinstance(exc, k8s.KubernetesError) and exc.status in _REASONS:
            exc = attrs.evolve(exc, reason=_REASONS[exc.status])
        return await super()._render_error(exc)
