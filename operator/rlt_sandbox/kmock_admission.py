"""What the sandbox's API server refuses or does not store before kmock sees a request: admission by API feature.

- dryRun: a dry-run create is validated and answered as the object that would be stored, and stored nowhere (the
  operator dry-runs every child before creating it: rlt_operator.apply.dry_run); dryRun on any other verb is refused
  (400) rather than persisted, as kmock would.
- Optimistic concurrency: a PUT (replace) whose metadata.resourceVersion is not the stored one gets 409 Conflict,
  as from the API server (the operator's leader Lease is taken and renewed so: rlt_operator.cluster.leader).
- ResourceQuota: a pod (compute resources) or another object (its count, a claim's storage) that a quota of its
  namespace does not admit gets the quota plugin's 403 (rlt_sandbox.quota).
- RBAC, minimally: the sandbox has no users nor roles, so every request is allowed and a SelfSubjectAccessReview
  answers allowed (kmock would store it and answer without a verdict); a test may name in `forbidden` the
  (group, plural) that nobody may create: a create of those gets the RBAC authorizer's 403 and a review says no.
A mixin of kmock_glue.Cluster.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import kmock
from kmock._internal import enums, k8s, k8s_views, rendering

if TYPE_CHECKING:
    from aiohttp import web


def status_response(code: int, reason: str, message: str, **more: Any) -> web.Response:
    """A Status answer as the API server sends one."""
    from aiohttp import web

    body = {"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure", "reason": reason, "code": code}
    return web.json_response({**body, "message": message, **more}, status=code)


USER = "system:anonymous"  # who the sandbox's RBAC answers about (it has no users)
REVIEWS = ("authorization.k8s.io", "selfsubjectaccessreviews")


class Admission:
    objects: k8s_views.ObjectsArray  # kmock's object store (the emulator's)
    forbidden: frozenset[tuple[str, str]] = frozenset()  # (group, plural) nobody may create (tests set it)

    def _refusal(self, request: rendering.Request) -> web.Response | None:
        """The answer of a request refused (or, for a SelfSubjectAccessReview, answered) before kmock stores
        anything, else None."""
        if request.params.get("dryRun") and request.action != enums.action.CREATE:
            why = "the rlt sandbox honours dryRun on create only (it would persist this)"
            return status_response(400, "BadRequest", why)
        if request.action == enums.action.CREATE and isinstance(request.data, dict):
            return self._rbac_refusal(request) or self._access_review(request) or self._quota_refusal(request)
        if request.method == enums.method.PUT and isinstance(request.data, list):
            return self._conflict(request)
        return None

    def _conflict(self, request: rendering.Request) -> web.Response | None:
        """409 for a replace that names a resourceVersion other than the stored one (the glue turned the PUT into one
        JSON-patch `replace` of the whole document), else None."""
        body = request.data[0].get("value") if request.data and isinstance(request.data[0], dict) else None
        wanted = ((body or {}).get("metadata") or {}).get("resourceVersion")
        if request.resource is None or request.name is None:
            return None
        key = (request.resource, request.namespace, request.name)
        current = self.objects[key] if key in self.objects else None  # noqa: SIM401 - kmock's store has no get()
        if not wanted or current is None or current.deleted:
            return None  # an unconditional replace, or kmock answers 404 itself
        stored = (current.raw.get("metadata") or {}).get("resourceVersion")
        if str(wanted) == str(stored):
            return None
        what = (
            f"{request.resource.plural}.{request.resource.group}" if request.resource.group else request.resource.plural
        )
        why = f'Operation cannot be fulfilled on {what} "{request.name}": the object has been modified; please apply '
        return status_response(409, "Conflict", why + "your changes to the latest version and try again")

    def _rbac_refusal(self, request: rendering.Request) -> web.Response | None:
        """The RBAC authorizer's 403 for a create of a forbidden kind, as kube-apiserver words it."""
        assert request.resource is not None  # _handle asks only for resource requests
        group, plural = request.resource.group or "", request.resource.plural
        if (group, plural) not in self.forbidden:
            return None
        where = f' in the namespace "{request.namespace}"' if request.namespace else " at the cluster scope"
        why = (
            f'{plural}{"." + group if group else ""} is forbidden: User "{USER}" cannot create resource "{plural}" '
            f'in API group "{group}"{where}'
        )
        return status_response(403, "Forbidden", why, details={"kind": plural, **({"group": group} if group else {})})

    def _access_review(self, request: rendering.Request) -> web.Response | None:
        """A SelfSubjectAccessReview's verdict: allowed unless its resource is in `forbidden` (create only)."""
        from aiohttp import web

        assert request.resource is not None  # _handle asks only for resource requests
        if (request.resource.group, request.resource.plural) != REVIEWS:
            return None
        attrs = (request.data.get("spec") or {}).get("resourceAttributes") or {}
        key = (str(attrs.get("group") or ""), str(attrs.get("resource") or ""))
        denied = attrs.get("verb") == "create" and key in self.forbidden
        verdict = {"allowed": not denied, **({"reason": "forbidden in the rlt sandbox"} if denied else {})}
        return web.json_response({**request.data, "status": verdict}, status=201)

    async def _dry_run_create(self, request: rendering.Request) -> web.StreamResponse:
        """A dry-run create as a server answers it: 409 for a taken name, else the object as it would be stored,
        stored nowhere. kmock's own _handle stores every create (even one a test's reaction answers), so this goes
        to the reactions and fallbacks past it (the glue's _serve_create answers with the object)."""
        name = request.data["metadata"].get("name")
        assert request.resource is not None  # _handle dry-runs only resource requests
        key = (request.resource, request.namespace or request.data["metadata"].get("namespace"), name)
        if name and key in self.objects and not self.objects[key].deleted:
            raise k8s.KubernetesObjectConflictError()
        # a mixin: mypy does not see the emulator past it in the MRO, as super(KubernetesEmulator, self) reaches it
        answer: web.StreamResponse = await super(kmock.KubernetesEmulator, self)._handle(request)  # type: ignore[misc]
        return answer

    def _quota_refusal(self, request: rendering.Request) -> web.Response | None:
        """The quota plugin's 403 for an object that a ResourceQuota of its namespace does not admit (a pod's
        compute resources, any other kind's count and a claim's storage: rlt_sandbox.quota), else None."""
        ns = request.namespace or (request.data.get("metadata") or {}).get("namespace")
        if request.resource is None or not ns:
            return None
        group, plural = request.resource.group or "", str(request.resource.plural)
        quotas, same_kind = [], []
        for (resource, namespace, _name), obj in self.objects.items():
            if namespace != ns or obj.deleted:
                continue
            if resource.plural == "resourcequotas" and not resource.group:
                quotas.append(obj.raw)
            elif resource.plural == plural and (resource.group or "") == group:
                same_kind.append(obj.raw)
        if not quotas:
            return None
        from rlt_sandbox.quota import object_refusal, refusal

        if plural == "pods" and not group:
            why = refusal(request.data, quotas, same_kind)
        else:
            why = object_refusal(plural, group, request.data, quotas, same_kind)
        if why is None:
            return None
        details = {"name": (request.data.get("metadata") or {}).get("name"), "kind": plural}
        return status_response(403, "Forbidden", why, details=details)
