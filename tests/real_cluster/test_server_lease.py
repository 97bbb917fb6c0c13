"""Two `rlt operator --peering` replicas and the leader Lease (rlt_operator.cluster.leader) on the real kube-apiserver, its
Job controller finishing each stage's Job once the test marks the trainer pod Succeeded (no kubelet runs here).

Each replica runs as a ServiceAccount of its own, bound to the operator's rules (rlt_operator.cluster.rbac, which the
chart renders), so the API server's audit log names the sender of every write; it also keeps each Lease write's
body (its holder) and when the server received and answered every write. tests/lease_fence.py then checks that each
write of a replica lies inside a window in which that replica held the Lease: at no moment do two replicas act.

- SIGKILL of the working replica, and SIGSTOP for longer than the lease, with the chart's timings (peering
  lifetime, lease duration, renew deadline, retry period from values.yaml): the standby takes over, the frozen one,
  resumed, acts again only once it holds the Lease again. The failover times are printed (docs/operator.md).
- Both replicas starved (SIGSTOP and SIGCONT on a fixed random schedule, up to 1.5 s each) through all three
  stages, with short timings: Kopf's peering lets both work at times; the Lease lets one write at any moment.

The same with the emulated API: tests/operator/test_ha_lease.py.
"""

from __future__ import annotations

import contextlib
import json
import random
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import yaml
from conftest import skip_without_assets
from kube_env import AuditedWrite, running_operator
from lease_fence import Write, acts, holder_written, lease_claims, turns, unfenced_writes, windows
from suite_helpers import EXAMPLES
from suite_helpers import wait_for as suite_wait_for

skip_without_assets()

from rlt_operator.cluster import rbac  # noqa: E402

pytestmark = [pytest.mark.real_cluster, pytest.mark.xdist_group("real_cluster"), pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "rlt-operator"
SYSTEM = "ha-system"  # the replicas' own namespace: their ServiceAccounts and the Lease
REPLICAS = ("op-a", "op-b")
STAGES = ("sft", "rl", "distill")


def chart_timing() -> tuple[str, ...]:
    """The chart's defaults for the peering lifetime and the election, as its Deployment passes them."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())["operator"]
    election = values["leaderElection"]
    return (
        "--peering-lifetime", str(values["peering"]["lifetime"]),
        "--lease-duration", str(election["leaseDuration"]),
        "--renew-deadline", str(election["renewDeadline"]),
        "--retry-period", str(election["retryPeriod"]),
    )  # fmt: skip


CHART_TIMING = chart_timing()


def timing(flag: str, args: tuple[str, ...]) -> float:
    return float(args[args.index(flag) + 1])


def wait_for(probe, what: str, timeout: float = 120.0):
    return suite_wait_for(probe, what, seconds=timeout, every=0.5)


def _get(cluster, *args: str) -> dict | None:
    r = cluster.kubectl("get", *args, "-o", "json", check=False)
    return json.loads(r.stdout) if r.returncode == 0 else None


def _role(kind: str, name: str, namespace: str, rules) -> dict:
    meta = {"name": name, **({"namespace": namespace} if namespace else {})}
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind, "metadata": meta, "rules": list(rules)}


def _binding(kind: str, role_kind: str, name: str, namespace: str) -> dict:
    meta = {"name": name, **({"namespace": namespace} if namespace else {})}
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": kind,
        "metadata": meta,
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": r, "namespace": SYSTEM} for r in REPLICAS],
    }


@pytest.fixture(scope="module")
def ha(cluster, tmp_path_factory):
    """The CRDs, and each replica's ServiceAccount with the operator's cluster rules (the Lease's: runs_namespace);
    yields each replica's kubeconfig (a token of its ServiceAccount)."""
    if not cluster.has_controllers:
        pytest.skip("needs kube-controller-manager (the Job controller completes each stage) in $KUBEBUILDER_ASSETS")
    ours = cluster.ensure_crd(ROOT / "manifests" / "crd" / "rltruns.rlt.dev.yaml", "rltruns.rlt.dev")
    cluster.ensure_crd(CHART / "crds" / "kopf-peerings.yaml", "kopfpeerings.kopf.dev")  # kept, as helm keeps crds/
    cluster.create_namespace(SYSTEM)
    docs = [
        _role("ClusterRole", "rlt-ha-test", "", rbac.CLUSTER_RBAC_RULES),
        _binding("ClusterRoleBinding", "ClusterRole", "rlt-ha-test", ""),
    ]
    cluster.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(docs))
    work = tmp_path_factory.mktemp("ha")
    configs = {}
    for name in REPLICAS:
        cluster.kubectl("create", "serviceaccount", name, "-n", SYSTEM, check=False)
        token = cluster.kubectl("create", "token", name, "-n", SYSTEM, "--duration=2h").stdout.strip()
        configs[name] = cluster.write_kubeconfig(work / f"{name}.kubeconfig", {"token": token})
    yield configs
    if ours:
        cluster.kubectl("delete", "crd", "rltruns.rlt.dev", "--wait=false", check=False)


def runs_namespace(cluster, ns: str) -> None:
    """A namespace the replicas watch: the operator's namespaced rules there, the KopfPeering `ns`, and in SYSTEM the
    rules of the Lease `ns` (named as the peering; get and update on it alone, as the chart grants)."""
    cluster.create_namespace(ns)
    docs = [
        _role("Role", f"rlt-ha-lease-{ns}", SYSTEM, rbac.lease_rules(ns)),
        _binding("RoleBinding", "Role", f"rlt-ha-lease-{ns}", SYSTEM),
        _role("Role", "rlt-ha-operator", ns, (*rbac.RBAC_RULES, *rbac.PEERING_RULES)),
        _binding("RoleBinding", "Role", "rlt-ha-operator", ns),
        {"apiVersion": "kopf.dev/v1", "kind": "KopfPeering", "metadata": {"name": ns, "namespace": ns}},
    ]
    cluster.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(docs))


@contextlib.contextmanager
def replicas(ha, ns: str, work: Path, flags: tuple[str, ...]):
    """`start(name)` runs replica `name` in `ns` with the peering (and Lease) named `ns`; `procs` holds them. On
    leaving, every stopped replica is resumed and all are stopped (each log's tail printed)."""
    procs: dict[str, subprocess.Popen] = {}
    with contextlib.ExitStack() as stack:

        def start(name: str) -> subprocess.Popen:
            args = ["--namespace", ns, "--peering", ns, *flags]
            proc, _ = stack.enter_context(
                running_operator(ha[name], args, work, name, pod_namespace=SYSTEM, log_name=name)
            )
            procs[name] = proc
            return proc

        try:
            yield start, procs
        finally:
            for p in procs.values():
                if p.poll() is None:
                    p.send_signal(signal.SIGCONT)


def log_says(work: Path, name: str, text: str) -> bool:
    path = work / f"{name}.log"
    return path.exists() and text in path.read_text()


def tiny(ns: str) -> dict:
    doc = yaml.safe_load((EXAMPLES / "rltrun-tiny.yaml").read_text())
    doc["metadata"] = {"name": "tiny", "namespace": ns}
    doc["spec"]["storage"] = {"retentionPolicy": "Delete"}
    return doc


def exited(containers: list[dict]) -> list[dict]:
    """Container statuses of containers that exited 0."""
    done = {"terminated": {"exitCode": 0, "reason": "Completed"}}
    return [
        {"name": c["name"], "image": c["image"], "imageID": "", "ready": False, "restartCount": 0, "state": done}
        for c in containers
    ]


def finish_stage(cluster, ns: str, stage: str) -> None:
    """What a kubelet would report when the stage's trainer exits 0: every pod of its Job Succeeded (the real Job
    controller then completes the Job, and the run's leader moves on)."""
    job = f"tiny-{stage}"
    selector = f"batch.kubernetes.io/job-name={job}"
    pods = wait_for(lambda: (_get(cluster, "pods", "-n", ns, "-l", selector) or {}).get("items"), f"{job}'s pods")
    for pod in pods:
        status = {
            "phase": "Succeeded",
            "initContainerStatuses": exited(pod["spec"].get("initContainers") or []),
            "containerStatuses": exited(pod["spec"]["containers"]),
        }
        cluster.kubectl(
            "patch", "pod", pod["metadata"]["name"], "-n", ns, "--subresource=status", "--type=merge", "-p",
            json.dumps({"status": status}),
        )  # fmt: skip


def phase(cluster, ns: str) -> str:
    return str(((_get(cluster, "rltrun", "tiny", "-n", ns) or {}).get("status") or {}).get("phase") or "")


def replica_writes(cluster, since: float) -> list[Write]:
    """The replicas' writes in the audit log since `since`, as the fence's `Write`s (epoch seconds)."""
    users = {f"system:serviceaccount:{SYSTEM}:{r}": r for r in REPLICAS}

    def write(a: AuditedWrite) -> Write:
        return Write(a.received, a.answered, users[a.user], a.verb, a.resource, f"{a.namespace}/{a.name}", a.body,
                     200 <= a.code < 300)  # fmt: skip

    return [write(a) for a in cluster.audit_writes(since) if a.user in users]


def check_fence(cluster, ns: str, since: float) -> list[Write]:
    """The audit log's verdict: every replica write inside its sender's leadership window; returns the Lease's
    applied writes."""
    writes = replica_writes(cluster, since)
    lease = f"{SYSTEM}/{ns}"
    claims = lease_claims(writes, lease)
    tries = [w for w in writes if w.resource == "leases" and w.name == lease]
    print(f"Lease {lease}: {len(tries)} writes sent, {len(claims)} applied")
    spans = windows(claims, time.time())
    print(
        f"Lease {lease}: {len(claims)} writes, windows "
        + ", ".join(f"{h} {b - since:.1f}-{e - since:.1f}s" for h, b, e in spans)
    )
    bad = unfenced_writes(writes, lease)
    assert not bad, "\n".join(
        f"{w.who} {w.verb} {w.resource} {w.name} at {w.start - since:.2f}s, holder {h}" for w, h in bad[:20]
    )
    acting = [w for w in writes if acts(w) and w.ok]
    assert acting, "no write of a replica in the audit log"
    return claims


def say(capsys, line: str) -> None:
    """A figure for the terminal (docs/operator.md quotes them), shown even when output is captured."""
    with capsys.disabled():
        print(f"\n{line}")


def first_claim(claims: list[Write], who: str, after: float) -> Write:
    return next(c for c in claims if holder_written(c) == who and c.start >= after)


def first_act(cluster, who: str, after: float) -> Write:
    return next(w for w in replica_writes(cluster, after) if w.who == who and acts(w) and w.ok)


def test_sigkill_of_the_leader_the_standby_takes_over_with_the_charts_timings(cluster, ha, tmp_path, capsys):
    ns = "ha-kill"
    runs_namespace(cluster, ns)
    since = time.time()
    with replicas(ha, ns, tmp_path, CHART_TIMING) as (start, procs):
        start("op-a")
        wait_for(lambda: log_says(tmp_path, "op-a", "this replica works (active): it holds"), "op-a leads")
        cluster.kubectl("apply", "--server-side", "-f", "-", stdin=yaml.safe_dump(tiny(ns)))
        wait_for(lambda: _get(cluster, "job", "tiny-sft", "-n", ns), "the sft Job")
        start("op-b")
        wait_for(lambda: log_says(tmp_path, "op-b", "this replica is the standby"), "op-b stands by")
        killed = time.time()
        procs["op-a"].send_signal(signal.SIGKILL)  # no goodbye, no release: its keep-alive and Lease must expire
        procs["op-a"].wait()
        finish_stage(cluster, ns, "sft")  # work for whoever acts: the rl stage's Job
        wait_for(lambda: _get(cluster, "job", "tiny-rl", "-n", ns), "the rl Job, made by op-b", timeout=180)
        cluster.kubectl("delete", "rltrun", "tiny", "-n", ns, "--wait=false")
        wait_for(lambda: _get(cluster, "rltrun", "tiny", "-n", ns) is None, "the run deleted by op-b")
    claims = check_fence(cluster, ns, since)
    assert turns(claims)[:2] == ["op-a", "op-b"], turns(claims)
    takeover = first_claim(claims, "op-b", killed).end - killed
    acted = first_act(cluster, "op-b", killed).start - killed
    say(
        capsys,
        f"SIGKILL failover ({' '.join(CHART_TIMING)}): op-b holds the Lease {takeover:.1f} s after the kill, "
        f"its first write {acted:.1f} s after",
    )


def test_a_leader_frozen_longer_than_the_lease_never_writes_beside_the_new_one(cluster, ha, tmp_path, capsys):
    """SIGSTOP of the working replica for longer than the lease and the peering lifetime (chart timings): the
    standby takes over; resumed, the old one's fence is closed before it runs a line, and it acts again only once
    it holds the Lease again (Kopf's peering hands the work back to it: it has the higher priority)."""
    ns = "ha-stop"
    runs_namespace(cluster, ns)
    lease = timing("--lease-duration", CHART_TIMING)
    frozen_for = max(lease, timing("--peering-lifetime", CHART_TIMING)) + 20
    since = time.time()
    with replicas(ha, ns, tmp_path, CHART_TIMING) as (start, procs):
        start("op-a")
        wait_for(lambda: log_says(tmp_path, "op-a", "this replica works (active): it holds"), "op-a leads")
        cluster.kubectl("apply", "--server-side", "-f", "-", stdin=yaml.safe_dump(tiny(ns)))
        wait_for(lambda: _get(cluster, "job", "tiny-sft", "-n", ns), "the sft Job")
        start("op-b")
        wait_for(lambda: log_says(tmp_path, "op-b", "this replica is the standby"), "op-b stands by")
        stopped = time.time()
        procs["op-a"].send_signal(signal.SIGSTOP)  # frozen: no renewal, no keep-alive, no goodbye
        finish_stage(cluster, ns, "sft")
        wait_for(lambda: _get(cluster, "job", "tiny-rl", "-n", ns), "the rl Job, made by op-b", timeout=180)
        time.sleep(max(0.0, stopped + frozen_for - time.time()))
        resumed = time.time()
        procs["op-a"].send_signal(signal.SIGCONT)  # its clock moved on: its fence is closed
        for stage in ("rl", "distill"):
            finish_stage(cluster, ns, stage)
            if stage == "rl":
                wait_for(lambda: _get(cluster, "job", "tiny-distill", "-n", ns), "the distill Job", timeout=180)
        wait_for(lambda: phase(cluster, ns) == "Succeeded", "phase Succeeded", timeout=180)
        cluster.kubectl("delete", "rltrun", "tiny", "-n", ns, "--wait=false")
        wait_for(lambda: _get(cluster, "rltrun", "tiny", "-n", ns) is None, "the run deleted")
    claims = check_fence(cluster, ns, since)
    assert turns(claims)[:2] == ["op-a", "op-b"], turns(claims)
    writers = {w.who for w in replica_writes(cluster, since) if w.resource == "rltruns/status" and w.ok}
    assert writers == set(REPLICAS), writers  # each wrote the run's status in its turn
    takeover = first_claim(claims, "op-b", stopped).end - stopped
    acted = first_act(cluster, "op-b", stopped).start - stopped
    back = [c for c in claims if holder_written(c) == "op-a" and c.start >= resumed]
    handback = f", op-a holds it again {back[0].end - resumed:.1f} s after SIGCONT" if back else ""
    say(
        capsys,
        f"SIGSTOP failover ({' '.join(CHART_TIMING)}): op-b holds the Lease {takeover:.1f} s after the stop, its "
        f"first write {acted:.1f} s after{handback}",
    )


def test_both_replicas_starved_act_one_at_a_time(cluster, ha, tmp_path, capsys):
    """Both replicas frozen again and again for 0.5-3.5 s (SIGSTOP/SIGCONT on a fixed random schedule) while the
    run goes through its three stages. A pause past Kopf's keep-alive lifetime (2 s) lets the other replica's Kopf
    resume while the frozen one still thinks it works, so Kopf's peering lets both work at times (issue 53); the
    Lease lets one write at any moment. The pauses stay below the margin the Lease leaves a write already sent
    (lease 8 s - renew deadline 4 s)."""
    ns = "ha-starve"
    runs_namespace(cluster, ns)
    flags = ("--peering-lifetime", "2", "--lease-duration", "8", "--renew-deadline", "4", "--retry-period", "1")
    rng = random.Random(53)
    since = time.time()
    with replicas(ha, ns, tmp_path, flags) as (start, procs):
        start("op-a")
        start("op-b")

        def both_up() -> bool:  # one holds the Lease, the other has said what it is (a start takes long on a busy box)
            said = [log_says(tmp_path, r, "this replica") for r in REPLICAS]
            return all(said) and any(log_says(tmp_path, r, "it holds Lease") for r in REPLICAS)

        wait_for(both_up, "both replicas up", timeout=240)
        cluster.kubectl("apply", "--server-side", "-f", "-", stdin=yaml.safe_dump(tiny(ns)))
        starving = threading.Event()
        starving.set()

        def starve() -> None:
            while starving.is_set():
                who = procs[rng.choice(REPLICAS)]
                who.send_signal(signal.SIGSTOP)
                time.sleep(rng.uniform(0.5, 3.5))
                who.send_signal(signal.SIGCONT)
                time.sleep(rng.uniform(0.0, 1.0))

        chaos = threading.Thread(target=starve, name="starve", daemon=True)
        chaos.start()
        try:
            for stage in STAGES:
                wait_for(lambda s=stage: _get(cluster, "job", f"tiny-{s}", "-n", ns), f"the {stage} Job", 240)
                time.sleep(10)  # starved a while in each stage (resyncs, status writes), whoever works
                finish_stage(cluster, ns, stage)
        finally:
            starving.clear()
            chaos.join()
            for p in procs.values():
                p.send_signal(signal.SIGCONT)
        wait_for(lambda: phase(cluster, ns) == "Succeeded", "phase Succeeded", timeout=180)
        cluster.kubectl("delete", "rltrun", "tiny", "-n", ns, "--wait=false")
        wait_for(lambda: _get(cluster, "rltrun", "tiny", "-n", ns) is None, "the run deleted")
    claims = check_fence(cluster, ns, since)
    say(capsys, f"starved: {len(claims)} Lease writes, holders in turn: {turns(claims)}")


def test_kopf_resumes_the_standby_early_and_the_lease_holds_it_back(cluster, ha, tmp_path, capsys):
    """The leader frozen past Kopf's keep-alive lifetime (2 s) but not past the lease (15 s): Kopf's peering lets
    the standby work at once (its view of issue 53: the frozen one looks dead), and the stage finishes then, so the
    standby has work; it may act only once it holds the Lease. Seen red with the fence removed (Kube.may_write unset
    and OperatorState.leads() always True): op-b patched the run's status and created the rl Job, its Service and
    ConfigMap while op-a held the Lease. (Removing only may_write stays green: each run's loop waits on leads().)"""
    ns = "ha-early"
    runs_namespace(cluster, ns)
    flags = ("--peering-lifetime", "2", "--lease-duration", "15", "--renew-deadline", "10", "--retry-period", "2")
    since = time.time()
    with replicas(ha, ns, tmp_path, flags) as (start, procs):
        start("op-a")
        wait_for(lambda: log_says(tmp_path, "op-a", "it holds Lease"), "op-a leads", timeout=240)
        cluster.kubectl("apply", "--server-side", "-f", "-", stdin=yaml.safe_dump(tiny(ns)))
        wait_for(lambda: _get(cluster, "job", "tiny-sft", "-n", ns), "the sft Job")
        start("op-b")
        wait_for(lambda: log_says(tmp_path, "op-b", "this replica is the standby"), "op-b stands by", timeout=240)
        stopped = time.time()
        procs["op-a"].send_signal(signal.SIGSTOP)
        wait_for(lambda: log_says(tmp_path, "op-b", "Kopf's peering lets this replica work"), "Kopf resumes op-b")
        finish_stage(cluster, ns, "sft")  # work for op-b while op-a still holds the Lease
        wait_for(lambda: _get(cluster, "job", "tiny-rl", "-n", ns), "the rl Job", timeout=180)
        procs["op-a"].send_signal(signal.SIGCONT)
        cluster.kubectl("delete", "rltrun", "tiny", "-n", ns, "--wait=false")
        wait_for(lambda: _get(cluster, "rltrun", "tiny", "-n", ns) is None, "the run deleted")
    claims = check_fence(cluster, ns, since)
    assert turns(claims)[:2] == ["op-a", "op-b"], turns(claims)
    acted = first_act(cluster, "op-b", stopped).start - stopped
    say(capsys, f"Kopf resumed op-b early ({' '.join(flags)}): its first write {acted:.1f} s after the stop")
