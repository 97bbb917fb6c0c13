"""`rlt sandbox`: an emulated Kubernetes API (kmock + glue) with the operator attached, for trying RLTRuns.

A PREVIEW OF WHAT THE OPERATOR WOULD CREATE, NOT A CLUSTER: nothing is scheduled, no pod ever runs,
Jobs and StatefulSets never progress unless you patch their status yourself. It answers kubectl so
you can `kubectl apply -f manifests/examples/rltrun-tiny.yaml` and look at the children, labels,
Events and status the operator produces.

The same pieces serve the tests and the scale benchmark: `serve` (the emulated API on a port),
`write_kubeconfig`, and `InProcessOperator` (Kopf's operator as a task in the current event loop).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import logging
import os
import signal
import socket
import sys
import tempfile
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import yaml

from rlt.contract.metrics import TRAINER_METRICS_PORT
from rlt_operator import crd as crd_mod
from rlt_operator.builders import L_RUN
from rlt_operator.cluster import peering
from rlt_operator.config.kinds import CHILDREN

# "Finish" a Job by hand as the Job controller would (a real API server refuses a Complete condition without
# SuccessCriteriaMet, startTime and completionTime); docs/operator.md and the sandbox's banner show it.
COMPLETE_JOB_PATCH = (
    '{"status":{"startTime":"2026-01-01T00:00:00Z","completionTime":"2026-01-01T00:01:00Z","succeeded":1,'
    '"conditions":[{"type":"SuccessCriteriaMet","status":"True"},{"type":"Complete","status":"True"}]}}'
)


@contextlib.asynccontextmanager
async def serve(port: int | None = None, host: str = "127.0.0.1") -> AsyncIterator[tuple[Any, str]]:
    """The emulated API with the RLTRun CRD and Kopf's peering CRDs registered and namespace `default`; yields
    (cluster, url). No peering object exists: operators run standalone unless a test creates one."""
    try:
        import kmock

        from rlt_sandbox.kmock_glue import Cluster
        from rlt_sandbox.kmock_patches import patch_kmock
    except ImportError as err:  # the operator image installs the operator extra only
        raise SystemExit(f"the emulated API needs the sandbox extra (pip install 'rlt[sandbox]'): {err}") from None

    patch_kmock()
    cluster = Cluster()
    cluster.register_crd(crd_mod.crd())
    for peering_crd in peering.crds():  # so that replicas of `rlt operator --peering` can be run against it
        cluster.register_crd(peering_crd)
    kwargs: dict[str, Any] = {"host": host}
    if port:
        kwargs["port"] = port
    async with cluster, kmock.Server(cluster, **kwargs) as server:
        try:
            yield cluster, str(server.url).rstrip("/")
        finally:
            cluster.watches_end.set()  # an open `kubectl get -w` would hold the server's shutdown for a minute


def kubeconfig(url: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "rlt-sandbox", "cluster": {"server": url}}],
        "users": [{"name": "rlt-sandbox", "user": {}}],
        "contexts": [
            {
                "name": "rlt-sandbox",
                "context": {"cluster": "rlt-sandbox", "user": "rlt-sandbox", "namespace": "default"},
            }
        ],
        "current-context": "rlt-sandbox",
    }


def write_kubeconfig(path: Path, url: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(kubeconfig(url), sort_keys=False))
    return path


class InProcessOperator:
    """Kopf's operator with rlt_operator.handlers in a thread with its own event loop.

    Its own loop because Kopf cancels every task of its loop when it stops, which would take the
    emulated API (and a test's own tasks) down with it.
    """

    def __init__(
        self, namespaces: list[str] | None = None, liveness: str | None = None, overrides: dict[str, Any] | None = None
    ):
        self.namespaces = namespaces
        self.liveness = liveness
        self.overrides = overrides or {}  # OperatorSettings fields the sandbox sets (e.g. progress_url for local pods)
        self.thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.error: BaseException | None = None
        self.memo: Any = None  # Kopf's root memo of the running operator (memo.rlt: its OperatorState, once started)

    async def start(self) -> None:
        import kopf

        from rlt_operator import handlers  # noqa: F401 - registers the handlers
        from rlt_operator.config.settings import OperatorSettings

        config = OperatorSettings.from_env()  # read once, when this operator starts
        if self.overrides:
            config = dataclasses.replace(config, **self.overrides)

        self.memo = memo = kopf.Memo(settings=config)

        def main() -> None:
            try:
                asyncio.run(
                    kopf.operator(
                        registry=kopf.get_default_registry(),
                        settings=kopf.OperatorSettings(),
                        standalone=True,
                        clusterwide=not self.namespaces,
                        namespaces=self.namespaces or [],
                        liveness_endpoint=self.liveness,
                        stop_flag=self._stop,
                        memo=memo,
                    )
                )
            except BaseException as err:  # reported by stop()
                self.error = err

        self._stop.clear()
        self.thread = threading.Thread(target=main, name="rlt-operator", daemon=True)
        self.thread.start()

    @property
    def alive(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    async def stop(self, timeout: float = 20.0) -> None:
        if self.thread is None:
            return
        self._stop.set()
        thread, self.thread = self.thread, None
        await asyncio.to_thread(thread.join, timeout)
        if thread.is_alive():
            raise RuntimeError(f"the operator did not stop within {timeout}s")
        if self.error is not None:
            raise RuntimeError("the operator failed") from self.error


def show_operator_log(path: Path) -> Path:
    """The in-process operator's log (Kopf's and rlt's lines, a run's prefixed [namespace/run]) into `path`, as
    `rlt operator` would print it; handler-success lines are debug, as there."""
    from rlt_operator.cli import quiet_success

    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path, mode="w")
    handler.setFormatter(_PrefixingFormatter("[%(asctime)s] %(name)-20.20s [%(levelname)-8s] %(message)s"))
    handler.addFilter(lambda record: record.name.startswith(("kopf", "rlt")))  # not the emulated API's access log
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(min(root.level or logging.INFO, logging.INFO))
    quiet_success(debug=False)
    return path


class _PrefixingFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        ref = getattr(record, "k8s_ref", None)  # Kopf's per-object loggers set it
        if isinstance(ref, dict) and ref.get("name"):
            where = f"{ref['namespace']}/{ref['name']}" if ref.get("namespace") else ref["name"]
            return super().format(record).replace(record.getMessage(), f"[{where}] {record.getMessage()}", 1)
        return super().format(record)


async def _main(
    port: int,
    kubeconfig_path: Path,
    namespaces: list[str],
    run_pods: Path | None = None,
    images: list[str] | None = None,
    node_labels: dict[str, str] | None = None,
    missing_images: list[str] | None = None,
) -> None:
    async with serve(port) as (cluster, url):
        for ns in namespaces:
            if ns != "default":
                cluster.seed_namespace(ns)
        write_kubeconfig(kubeconfig_path, url)
        os.environ["KUBECONFIG"] = str(kubeconfig_path)  # before kopf/kubernetes are imported
        kubelet = None
        if run_pods is not None:  # pods run as local processes (rlt_sandbox.sandbox_pods)
            from rlt_sandbox import sandbox_pods

            kubelet = await sandbox_pods.start(url, run_pods, images or [], node_labels or {}, missing_images or [])
        operator_log = show_operator_log(kubeconfig_path.parent / "operator.log")
        # Kopf runs in a thread here, where it cannot own OS signals; the sandbox handles Ctrl-C itself.
        logging.getLogger("kopf._core.reactor.running").addFilter(
            lambda record: "OS signals are ignored" not in record.getMessage()
        )
        # With local pods, progress comes from the trainer's rank 0 on loopback (an explicit RLT_PROGRESS_URL wins).
        local = kubelet is not None and "RLT_PROGRESS_URL" not in os.environ
        overrides: dict[str, Any] = (
            {"progress_url": sandbox_pods.local_progress_url(kubelet)} if local and kubelet else {}
        )
        if run_pods is not None:
            # A tiny local run's rl stage lasts seconds: read its progress every 2 s (not a cluster's 30 s), or
            # STEP and REWARD never show in `kubectl get rlt`. An explicit environment variable wins.
            for field, env in (
                ("progress_interval", "RLT_PROGRESS_INTERVAL"),
                ("resync_seconds", "RLT_RESYNC_SECONDS"),
            ):
                if env not in os.environ:
                    overrides[field] = 2.0
        op = InProcessOperator(overrides=overrides or None)
        await op.start()
        restart = asyncio.Event()  # SIGHUP: the operator stops and starts again (a day-two trial's restart)
        if kubelet is not None:
            print(
                f"rlt sandbox --run-pods: pods run as local processes (kubelet emulator), files under {run_pods}; "
                f"the trainer's metrics at http://127.0.0.1:{TRAINER_METRICS_PORT}/metrics while it runs (a run "
                "applied beside another gets free ports instead, printed with its pods).",
                flush=True,
            )
        if kubelet is not None:
            cluster.pod_log = kubelet.log_of
            what = (
                "The operator's Jobs and StatefulSets run: each pod is a local process (kubelet emulator), on CPU.\n\n"
                f"  export KUBECONFIG={kubeconfig_path}\n"
                "  kubectl apply -f manifests/examples/rltrun-tiny.yaml\n"
                "  kubectl get rlt -w                     # Pending -> Running sft/rl/distill -> Succeeded\n"
                "  kubectl get pods -l rlt.dev/run=tiny\n"
                "  kubectl logs tiny-sft-0-<suffix> -c trainer  # a pod's log (-c validate: the checks before it)\n\n"
            )
        else:
            what = (
                "This is a PREVIEW of what the operator would create, not a cluster: nothing runs (add\n"
                "--run-pods DIR to run the pods as local processes), and Job/StatefulSet status changes only\n"
                "if you patch it (kubectl patch ... --subresource=status).\n\n"
                f"  export KUBECONFIG={kubeconfig_path}\n"
                "  kubectl apply -f manifests/examples/rltrun-tiny.yaml\n"
                "  kubectl get rlt\n"
                f"  kubectl get {','.join(c.plural for c in CHILDREN if c.plural != 'pods')} -l {L_RUN}=tiny\n"
                f"  kubectl patch job tiny-sft --subresource=status --type=merge \\\n    -p '{COMPLETE_JOB_PATCH}'\n\n"
            )
        print(
            f"rlt sandbox: emulated Kubernetes API at {url} with the RLTRun operator attached.\n"
            + what
            + f"The operator's log: tail -f {operator_log}\n"
            + f"Restart the operator (its memory lost, as a pod restart): kill -HUP {os.getpid()}\n"
            + "Ctrl-C stops it.",
            flush=True,
        )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        loop.add_signal_handler(signal.SIGHUP, restart.set)
        while not stop.is_set() and op.alive:
            if restart.is_set():
                restart.clear()
                op = await restart_operator(op)
            await asyncio.sleep(0.2)
        await op.stop()
        if kubelet is not None:
            await kubelet.stop()


async def restart_operator(op: InProcessOperator) -> InProcessOperator:
    """Stop the operator (as Kopf stops on SIGTERM) and start a new one with the same settings: what a day-two
    trial does to the operator's pod. What it kept in memory is lost; what it wrote to the API stays."""
    log = logging.getLogger("rlt.sandbox")
    log.warning("SIGHUP: restarting the operator")
    print("rlt sandbox: SIGHUP: restarting the operator", flush=True)
    try:
        await op.stop()
    except RuntimeError as err:  # it failed or hung: said, and a new one starts anyway
        log.error("the operator did not stop cleanly: %s", err)
    new = InProcessOperator(op.namespaces, op.liveness, op.overrides)
    await new.start()
    log.warning("the operator was restarted")
    print("rlt sandbox: the operator was restarted", flush=True)
    return new


DEFAULT_PORT = 18443


class PortTaken(OSError):
    """The port asked for with --port is in use; the message is one line."""


def _in_use(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds: TIME_WAIT is not "in use"
        try:
            s.bind((host, port))
        except OSError as err:
            if err.errno != errno.EADDRINUSE:
                raise
            return True
    return False


def choose_port(port: int | None, host: str = "127.0.0.1") -> int:
    """The emulated API's port: --port when given (taken: PortTaken, one line); else DEFAULT_PORT, or any free port
    (0, the server picks) when that one is taken, which is said on stdout (as `rlt run`'s metrics port does)."""
    if port is not None:
        if _in_use(port, host):
            raise PortTaken(
                f"rlt sandbox: --port {port}: {host}:{port} is already in use (another sandbox?); pick another "
                "port, or leave --port out to get a free one"
            )
        return port
    if not _in_use(DEFAULT_PORT, host):
        return DEFAULT_PORT
    print(
        f"rlt sandbox: port {DEFAULT_PORT} is in use; the API takes a free port instead (its URL follows)", flush=True
    )
    return 0


def run(
    port: int | None = None,
    kubeconfig_path: str | None = None,
    namespaces: list[str] | None = None,
    run_pods: str | None = None,
    images: list[str] | None = None,
    node_labels: dict[str, str] | None = None,
    missing_images: list[str] | None = None,
) -> int:
    path = Path(kubeconfig_path) if kubeconfig_path else Path(tempfile.gettempdir()) / "rlt-sandbox" / "kubeconfig"
    pods_dir = Path(run_pods) if run_pods else None
    try:
        asyncio.run(
            _main(choose_port(port), path, namespaces or ["default"], pods_dir, images, node_labels, missing_images)
        )
    except PortTaken as err:
        print(err, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        pass
    print("rlt sandbox stopped.", file=sys.stderr)
    return 0
