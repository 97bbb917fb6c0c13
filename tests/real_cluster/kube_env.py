"""A real Kubernetes control plane for tests, envtest-style: etcd, kube-apiserver and (when present)
kube-controller-manager from the folder $KUBEBUILDER_ASSETS (controller-runtime's convention), on free local ports,
with certificates made here. No kubelet and no scheduler: pods are created by the real Job and StatefulSet
controllers and stay Pending, unscheduled.

The API server runs with RBAC, the default admission plugins (ServiceAccount, ResourceQuota, Priority, LimitRanger,
OwnerReferencesPermissionEnforcement...) and service-account tokens, so a client with a `kubectl create token`
token is held to its ServiceAccount's Roles exactly as in a cluster. It keeps an audit log of every write
(`audit_writes`): who sent it, when the server received and answered it, and for Leases and RLTRuns the body.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import ipaddress
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID
from suite_helpers import free_port

ASSETS_VAR = "KUBEBUILDER_ASSETS"

# Reads are not logged; writes with their metadata, and the body of the Lease and RLTRun writes (a Lease's holder, a
# patch of a run's finalizers) so that a test can tell who held the Lease when each write came.
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {"level": "None", "verbs": ["get", "list", "watch"]},
        {
            "level": "Request",
            "resources": [
                {"group": "coordination.k8s.io", "resources": ["leases"]},
                {"group": "rlt.dev", "resources": ["rltruns"]},
            ],
        },
        {"level": "Metadata"},
    ],
}


@dataclass(frozen=True)
class AuditedWrite:
    """One write in the API server's audit log."""

    received: float  # epoch seconds: when the server received it
    answered: float  # when it answered
    user: str
    verb: str
    resource: str  # plural, "/subresource" if any
    namespace: str
    name: str  # a create's name from its body where the log keeps the body
    code: int
    dry_run: bool
    body: Any


def _epoch(stamp: str) -> float:
    return dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def audited_write(event: dict[str, Any]) -> AuditedWrite:
    ref = event.get("objectRef") or {}
    body = event.get("requestObject")
    name = ref.get("name") or (isinstance(body, dict) and (body.get("metadata") or {}).get("name")) or ""
    return AuditedWrite(
        received=_epoch(event["requestReceivedTimestamp"]),
        answered=_epoch(event["stageTimestamp"]),
        user=(event.get("user") or {}).get("username", ""),
        verb=event["verb"],
        resource=str(ref.get("resource", "")) + (f"/{ref['subresource']}" if ref.get("subresource") else ""),
        namespace=str(ref.get("namespace", "")),
        name=str(name),
        code=int((event.get("responseStatus") or {}).get("code") or 0),
        dry_run="dryRun=" in event.get("requestURI", ""),
        body=body,
    )


def _key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _pem_key(key: rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _cert(
    subject: x509.Name,
    key: rsa.RSAPrivateKey,
    issuer: x509.Name,
    issuer_key: rsa.RSAPrivateKey,
    *,
    ca: bool = False,
    server: bool = False,
) -> x509.Certificate:
    now = dt.datetime.now(dt.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [
                    x509.DNSName("localhost"),
                    x509.DNSName("kubernetes.default.svc"),
                    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                    x509.IPAddress(ipaddress.ip_address("10.0.0.1")),
                ]
            ),
            critical=False,
        )
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True
        )
    return builder.sign(issuer_key, hashes.SHA256())


def _name(cn: str, org: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    if org:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


@dataclass
class ControlPlane:
    """etcd + kube-apiserver (+ kube-controller-manager) in `workdir`; `kubeconfig` is cluster-admin's."""

    assets: Path
    workdir: Path
    port: int = 0
    kubeconfig: Path = field(init=False)
    procs: list[tuple[str, subprocess.Popen]] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def audit_log(self) -> Path:
        return self.workdir / "audit.log"

    def audit_writes(self, since: float = 0.0) -> list[AuditedWrite]:
        """The writes the server answered since `since` (epoch seconds), in the log's order."""
        out = []
        for line in self.audit_log.read_text().splitlines():
            event = json.loads(line)
            if event.get("stage") == "ResponseComplete" and event["verb"] not in ("get", "list", "watch"):
                w = audited_write(event)
                if w.received >= since:
                    out.append(w)
        return out

    @property
    def ca(self) -> Path:
        return self.workdir / "ca.crt"

    def _write(self, name: str, data: bytes) -> Path:
        path = self.workdir / name
        path.write_bytes(data)
        return path

    def _certificates(self) -> None:
        ca_key = _key()
        ca_name = _name("rlt-test-ca")
        ca = _cert(ca_name, ca_key, ca_name, ca_key, ca=True)
        self._write("ca.crt", ca.public_bytes(serialization.Encoding.PEM))
        for stem, subject, server in (
            ("apiserver", _name("kube-apiserver"), True),
            ("admin", _name("admin", "system:masters"), False),
            ("controller-manager", _name("system:kube-controller-manager"), False),
        ):
            key = _key()
            self._write(f"{stem}.key", _pem_key(key))
            cert = _cert(subject, key, ca_name, ca_key, server=server)
            self._write(f"{stem}.crt", cert.public_bytes(serialization.Encoding.PEM))
        sa = _key()
        self._write("sa.key", _pem_key(sa))
        self._write(
            "sa.pub",
            sa.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo),
        )

    def write_kubeconfig(self, path: Path, user: dict) -> Path:
        path.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [
                        {"name": "real", "cluster": {"server": self.url, "certificate-authority": str(self.ca)}}
                    ],
                    "users": [{"name": "user", "user": user}],
                    "contexts": [{"name": "real", "context": {"cluster": "real", "user": "user"}}],
                    "current-context": "real",
                }
            )
        )
        return path

    def _start(self, name: str, argv: list[str]) -> None:
        log = (self.workdir / f"{name}.log").open("wb")  # noqa: SIM115 - kept open for the process's lifetime
        self.procs.append((name, subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)))

    def log_tail(self, name: str, lines: int = 30) -> str:
        path = self.workdir / f"{name}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def start(self, timeout: float = 120.0) -> ControlPlane:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._certificates()
        etcd_port, peer_port, self.port = free_port(), free_port(), free_port()
        etcd = shutil.which("etcd", path=str(self.assets)) or shutil.which("etcd")
        if etcd is None:
            raise RuntimeError(f"no etcd in {self.assets} nor on PATH")
        self._start(
            "etcd",
            [
                etcd,
                "--data-dir",
                str(self.workdir / "etcd"),
                "--listen-client-urls",
                f"http://127.0.0.1:{etcd_port}",
                "--advertise-client-urls",
                f"http://127.0.0.1:{etcd_port}",
                "--listen-peer-urls",
                f"http://127.0.0.1:{peer_port}",
                "--initial-advertise-peer-urls",
                f"http://127.0.0.1:{peer_port}",
                "--initial-cluster",
                f"default=http://127.0.0.1:{peer_port}",
                "--unsafe-no-fsync",
            ],
        )
        w = self.workdir
        self._start(
            "kube-apiserver",
            [
                str(self.assets / "kube-apiserver"),
                f"--etcd-servers=http://127.0.0.1:{etcd_port}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={self.port}",
                f"--cert-dir={w / 'certs'}",
                f"--tls-cert-file={w / 'apiserver.crt'}",
                f"--tls-private-key-file={w / 'apiserver.key'}",
                f"--client-ca-file={self.ca}",
                "--authorization-mode=RBAC",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={w / 'sa.pub'}",
                f"--service-account-signing-key-file={w / 'sa.key'}",
                "--service-cluster-ip-range=10.0.0.0/24",
                "--allow-privileged=true",
                f"--audit-policy-file={self._write('audit-policy.yaml', yaml.safe_dump(AUDIT_POLICY).encode())}",
                f"--audit-log-path={self.audit_log}",
                "--audit-log-mode=blocking",  # each write is in the log before its answer goes out
            ],
        )
        self.kubeconfig = self.write_kubeconfig(
            w / "admin.kubeconfig",
            {"client-certificate": str(w / "admin.crt"), "client-key": str(w / "admin.key")},
        )
        self._wait_ready(timeout)
        kcm = self.assets / "kube-controller-manager"
        if kcm.exists():
            kcm_config = self.write_kubeconfig(
                w / "controller-manager.kubeconfig",
                {
                    "client-certificate": str(w / "controller-manager.crt"),
                    "client-key": str(w / "controller-manager.key"),
                },
            )
            self._start(
                "kube-controller-manager",
                [
                    str(kcm),
                    f"--kubeconfig={kcm_config}",
                    f"--authentication-kubeconfig={kcm_config}",
                    f"--authorization-kubeconfig={kcm_config}",
                    "--leader-elect=false",
                    "--bind-address=127.0.0.1",
                    f"--secure-port={free_port()}",
                    f"--cert-dir={w / 'kcm-certs'}",
                    f"--root-ca-file={self.ca}",
                    f"--service-account-private-key-file={w / 'sa.key'}",
                    "--use-service-account-credentials=true",
                    "--controllers=*",
                ],
            )
        return self

    @property
    def has_controllers(self) -> bool:
        return any(name == "kube-controller-manager" for name, _ in self.procs)

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            for name, proc in self.procs:
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited with {proc.returncode}:\n{self.log_tail(name)}")
            r = self.kubectl("get", "--raw", "/readyz", check=False)
            # ready, and the default namespace and the built-in RBAC roles exist once the bootstrap hooks ran
            if (
                r.returncode == 0
                and r.stdout.strip() == "ok"
                and self.kubectl("get", "namespace", "default", check=False).returncode == 0
            ):
                return
            last = r.stderr or r.stdout
            time.sleep(0.5)
        raise RuntimeError(f"kube-apiserver not ready in {timeout:.0f}s: {last}\n{self.log_tail('kube-apiserver')}")

    def kubectl(self, *args: str, check: bool = True, stdin: str | None = None, kubeconfig: Path | None = None):
        env = {**os.environ, "KUBECONFIG": str(kubeconfig or self.kubeconfig)}
        r = subprocess.run(["kubectl", *args], capture_output=True, text=True, input=stdin, env=env, timeout=120)
        if check and r.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)}: rc {r.returncode}\n{r.stdout}\n{r.stderr}")
        return r

    def create_namespace(self, name: str, timeout: float = 60.0) -> None:
        """A namespace whose pods can be admitted, with its `default` ServiceAccount: made here when no
        kube-controller-manager runs, else waited for (its ServiceAccount controller makes it a moment later; the
        ServiceAccount admission plugin refuses a pod, and so the operator's pod dry-run, until it exists)."""
        self.kubectl("create", "namespace", name, check=False)
        if not self.has_controllers:
            self.kubectl("create", "serviceaccount", "default", "-n", name, check=False)
            return
        deadline = time.monotonic() + timeout
        while self.kubectl("get", "serviceaccount", "default", "-n", name, check=False).returncode != 0:
            if time.monotonic() > deadline:
                raise AssertionError(f"no ServiceAccount default in namespace {name} after {timeout:.0f}s")
            time.sleep(0.5)

    def ensure_crd(self, path: Path, name: str, timeout: float = 90.0) -> bool:
        """Apply the CRD(s) in `path` unless the CRD `name` exists, then wait until it is Established. True when
        applied here (the caller removes it again). One an earlier module deletes is waited out first."""
        found = self.kubectl("get", "crd", name, "-o", "json", check=False)
        if found.returncode == 0 and not json.loads(found.stdout)["metadata"].get("deletionTimestamp"):
            return False
        if found.returncode == 0:
            self.kubectl("wait", "--for=delete", f"crd/{name}", f"--timeout={timeout:.0f}s", check=False)
        self.kubectl("apply", "--server-side", "-f", str(path))
        jsonpath = "jsonpath={range .status.conditions[*]}{.type}={.status} {end}"
        deadline = time.monotonic() + timeout
        # (kubectl wait fails at once while the CRD has no conditions yet)
        while "Established=True" not in self.kubectl("get", "crd", name, "-o", jsonpath).stdout:
            if time.monotonic() > deadline:
                raise AssertionError(f"CRD {name} not Established in {timeout:.0f}s")
            time.sleep(0.5)
        return True

    def stop(self) -> None:
        for _name, proc in reversed(self.procs):
            proc.terminate()
        for _name, proc in reversed(self.procs):
            try:
                proc.wait(timeout=5)  # nothing to keep: no graceful drain
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs.clear()


# `rlt` as a subprocess from this interpreter (the venv's code, whatever is on PATH).
RLT = [sys.executable, "-c", "from rlt.cli import main; raise SystemExit(main())"]


@contextlib.contextmanager
def running_operator(
    kubeconfig: Path,
    args: list[str],
    work: Path,
    pod_id: str,
    tail: int = 40,
    pod_namespace: str = "",
    log_name: str = "operator",
):
    """`rlt operator ARGS` against the real server as `kubeconfig`'s user, its metrics and health ports off and a 5 s
    resync; yields the process and its log (`work`/LOG_NAME.log), stops it after, and prints the log's last lines
    (what failed shows). `pod_namespace`: the operator's own namespace (POD_NAMESPACE, as the chart sets it), where
    its leader Lease is; `pod_id` its replica name (POD_ID: Kopf's peering identity, the Lease's holder)."""
    env = {
        **os.environ,
        "KUBECONFIG": str(kubeconfig),
        "POD_ID": pod_id,
        "POD_NAMESPACE": pod_namespace,
        "RLT_OPERATOR_METRICS_PORT": "-1",
        "RLT_OPERATOR_HEALTH_PORT": "-1",
        "RLT_RESYNC_SECONDS": "5",
    }
    log_path = work / f"{log_name}.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen([*RLT, "operator", *args, "--verbose"], env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        yield proc, log_path
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        print(f"operator log (last {tail} lines):\n{chr(10).join(log_path.read_text().splitlines()[-tail:])}")
