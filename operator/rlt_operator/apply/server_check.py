"""`rlt validate --server`: each run's children and their pods dry-run on the current kubeconfig's API server, as the
operator's gate sends them (rlt_operator.apply.dry_run), by the user who runs it.

A dry-run is authorized as a create: a user who may create RLTRuns but not Jobs (bound only to the chart's
`rltrun-editor` role) would get a 403 for every child, which says nothing about the run. So the user's rights are
asked first (a SelfSubjectAccessReview per kind the run needs, verb create); what is missing is one line and its own
exit code (rlt.contract.exitcodes.ExitCode.NO_PERMISSION), not INVALID. Where the review cannot be asked, an RBAC
403 of the dry-run itself (`User "u" cannot create resource "jobs" ...`) is read the same way.
"""

from __future__ import annotations

from typing import Any, Protocol

from rlt.checks.validation import NotChecked, NotPermitted
from rlt_operator import builders
from rlt_operator.apply import admission, dry_run
from rlt_operator.config.kinds import BY_PLURAL, RUN
from rlt_operator.config.settings import kubeconfig_path

# What `rlt validate --server` reports: every refusal but 409 (the run's children exist: it runs already).
CLI_CODES = dry_run.CLI_CODES
PLACEHOLDER_UID = "00000000-0000-0000-0000-000000000000"
VERB = "create"


class ServerRunner(dry_run.DryRunner, Protocol):
    def access_review(self, namespace: str, verb: str, group: str, resource: str) -> tuple[bool, str]: ...


def _without_owner(body: dict[str, Any]) -> dict[str, Any]:
    """The child as the user's dry-run sends it: no owner reference (the run may not exist yet, and the owner's
    permissions are the operator's, not the user's)."""
    meta = {k: v for k, v in body["metadata"].items() if k != "ownerReferences"}
    return {**body, "metadata": meta}


def current_namespace() -> str:
    """The current kubeconfig context's namespace, else default (as kubectl reads it)."""
    import kubernetes

    try:
        where = kubeconfig_path()
        _, active = kubernetes.config.list_kube_config_contexts(config_file=where)  # type: ignore[no-untyped-call]
    except (kubernetes.config.ConfigException, OSError):
        return "default"
    return str(((active or {}).get("context") or {}).get("namespace") or "default")


def kind_name(plural: str) -> str:
    """`jobs.batch`, `pods`: a resource as kubectl and RBAC name it."""
    kind = BY_PLURAL[plural]
    return f"{plural}.{kind.group}" if kind.group else plural


def needed_kinds(children: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """The plurals the check creates (dry-run), the RLTRun itself first (the user's own create), each once."""
    return list(dict.fromkeys([RUN.plural, *(plural for plural, _ in children)]))


def lacking_line(namespace: str, lacking: list[str]) -> str:
    what = ", ".join(f"{VERB} {k}" for k in lacking)
    return (
        f"you may not {what} in namespace {namespace} (SelfSubjectAccessReview; `kubectl auth can-i --list -n "
        f"{namespace}`): not a verdict on the run; --server dry-runs the children the operator would create, which "
        "needs the same rights. Ask for them, or apply the run: the operator checks it (condition ChildrenValid)"
    )


def missing(runner: ServerRunner, namespace: str, plurals: list[str]) -> list[str] | None:
    """The kinds (kubectl's names) of `plurals` the user may not create in `namespace`; None when the review cannot
    be asked (an old or emulated server): the dry-runs' own 403s say it then."""
    out = []
    for plural in plurals:
        try:
            allowed, _ = runner.access_review(namespace, VERB, BY_PLURAL[plural].group, plural)
        except Exception:  # noqa: BLE001 - no review API: fall back to the 403s' own reasons
            return None
        if not allowed:
            out.append(kind_name(plural))
    return out


def server_problems(runs: list[Any], runner: ServerRunner | None = None) -> list[str]:
    """Each run's children (every enabled stage) and their pods dry-run on the current kubeconfig's API server: one
    line per refused field, the run's field (or the cluster object that refused) first; a server that cannot be
    reached is one line too. Raises NotPermitted, naming the verbs and kinds, when the user may not create them, and
    NotChecked when there is no server to ask (no kubeconfig, or it does not answer before any refusal is found)."""
    from rlt_operator.cluster.kube import Kube

    try:
        kube: ServerRunner = runner or Kube.from_environment()
    except Exception as err:  # noqa: BLE001 - no kubeconfig, a broken one: said, never a traceback
        raise NotChecked(f"--server: no cluster to ask ({type(err).__name__}: {err})") from None
    problems: list[str] = []
    for run in runs:
        namespace = run.metadata.namespace or current_namespace()
        ref = builders.RunRef(name=run.name, namespace=namespace, uid=PLACEHOLDER_UID)
        children = [(plural, _without_owner(body)) for plural, body in dry_run.run_children(ref, run.spec)]
        try:
            lacking = missing(kube, namespace, needed_kinds(children))
            if lacking:
                raise NotPermitted(lacking_line(namespace, lacking))
            refused = dry_run.check(kube, namespace, run.spec, children, CLI_CODES)
        except NotPermitted:
            raise
        except Exception as err:  # noqa: BLE001 - unreachable server, 5xx: said, never a traceback
            said = f"--server: the API server did not answer ({type(err).__name__}: {err})"[:600]
            if not problems:  # nothing found before it stopped answering: no verdict at all
                raise NotChecked(said) from None
            return [*problems, said]
        denied = [admission.rbac_denial(r.causes[0][2]) for r in refused if r.status == 403]
        if any(denied):  # the review was not there to ask: the 403s name the rights
            kinds = list(dict.fromkeys(d[1] for d in denied if d))
            raise NotPermitted(lacking_line(namespace, kinds))
        problems += [line for r in refused for line in r.lines()]
    return problems
