"""CLI commands of the operator side (`rlt crd`, `rlt operator`); `rlt sandbox` is rlt_sandbox.cli.

Kopf and the Kubernetes client are imported inside the handlers: `rlt validate` must stay light.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
import threading
from typing import Any

from rlt_operator.cluster.leader import DEFAULT_LEASE_DURATION, DEFAULT_RENEW_DEADLINE, DEFAULT_RETRY_PERIOD
from rlt_operator.cluster.peering import DEFAULT_LIFETIME

# Below Kubernetes' default terminationGracePeriodSeconds (30 s), which the chart keeps.
DEFAULT_SHUTDOWN_TIMEOUT = 10.0
# How long a stopped operator waits for API calls still running in worker threads before it exits without them.
EXECUTOR_DRAIN_SECONDS = 0.5


def cmd_crd(args: argparse.Namespace) -> int:
    from rlt_operator import crd

    sys.stdout.write(crd.render())
    return 0


def cmd_operator(args: argparse.Namespace) -> int:
    import kopf

    from rlt_operator import handlers  # noqa: F401 - registers the handlers
    from rlt_operator.cluster import peering, peering_watch  # noqa: F401 - registers the handlers
    from rlt_operator.cluster.leader import LeaseConfig, timing_problem
    from rlt_operator.cluster.operator_metrics import build_labels
    from rlt_operator.config.settings import OperatorSettings

    config = OperatorSettings.from_env()  # every RLT_* variable, read once here
    problem = timing_problem(args.lease_duration, args.renew_deadline, args.retry_period)
    if problem:
        sys.stderr.write(f"rlt operator: {problem}\n")
        return 2
    problem = no_cluster()
    if problem:
        sys.stderr.write(f"rlt operator: {problem}\n")
        return 1

    # The operator owns its log format: drop handlers another command's registration may have installed.
    logging.getLogger().handlers.clear()
    # Every line about one run names it: `[namespace/run]` in text, an `object` {namespace, name, ...} in JSON.
    json_logs = args.log_format == "json"
    fmt = kopf.LogFormat.JSON if json_logs else kopf.LogFormat.FULL
    kopf.configure(debug=args.debug, verbose=args.verbose, quiet=args.quiet, log_format=fmt, log_prefix=not json_logs)
    quiet_success(debug=bool(args.debug or args.verbose))
    log = logging.getLogger("rlt.operator")
    settings = kopf.OperatorSettings()
    priority = None
    if args.peering:
        # Several replicas: Kopf's mandatory peering on this object (no object or CRD: every replica stays paused,
        # never active unpeered); the live replica of highest priority works, the others wait (rlt_operator.cluster.peering).
        priority = args.priority if args.priority is not None else peering.auto_priority()
        settings.peering.lifetime = args.peering_lifetime
        settings.peering.stealth = True  # keep-alives are not logged; pauses and resumes are
        log.info(f"peering in {args.peering!r} with priority {priority}, keep-alive lifetime {args.peering_lifetime}s")
        _warn_missing_peering(log, args)
    info = None
    if args.peering:
        assert priority is not None
        info = peering_watch.PeeringInfo(
            name=args.peering,
            # Kopf's record key for this replica: the pod's name (POD_ID, as the chart sets it), as Kopf would take.
            identity=config.pod_id or f"{socket.gethostname()}/{os.getpid()}/{priority}",
            priority=priority,
            namespaces=None if args.all_namespaces else tuple(args.namespace or []),
            lifetime=args.peering_lifetime,
            interval=max(1.0, args.peering_lifetime / 4),
        )
    lease = None
    if info is not None:
        # Several replicas: the one holding the Lease acts, fenced by its own renew deadline (rlt_operator.cluster.leader);
        # the Lease lives in the operator's namespace, named as the peering object.
        lease = LeaseConfig(
            name=args.peering,
            namespace=config.pod_namespace or (args.namespace or ["default"])[0],
            identity=info.identity,
            lease_duration=args.lease_duration,
            renew_deadline=args.renew_deadline,
            retry_period=args.retry_period,
        )
        log.info(
            f"leader election in Lease {lease.namespace}/{lease.name}: duration {lease.lease_duration:g}s, renew "
            f"deadline {lease.renew_deadline:g}s, retry {lease.retry_period:g}s"
        )
    built = build_labels()
    log.info(f"rlt-operator {built['version']} (kopf {built['kopf_version']}) starting")
    health = config.health_port
    return serve(
        args.shutdown_timeout,
        settings=settings,
        standalone=None if args.peering else True,  # one replica: no peering objects needed
        peering_name=args.peering,
        priority=priority,
        clusterwide=args.all_namespaces,
        namespaces=args.namespace or [],
        liveness_endpoint=f"http://0.0.0.0:{health}/healthz" if health > 0 else None,
        memo=kopf.Memo(settings=config, peering=info, lease=lease),
        identity=info.identity if info else None,
    )


def no_cluster() -> str | None:
    """Why no API client can be built here (no service account, no readable kubeconfig), or None. Checked once at
    the start: in Kopf's startup handler it would be a traceback retried every minute, for ever."""
    import kubernetes
    import yaml

    from rlt_operator.cluster.kube import Kube
    from rlt_operator.config.settings import kubeconfig_path

    try:
        Kube.from_environment()
    except (kubernetes.config.ConfigException, OSError, yaml.YAMLError) as err:
        reason = " ".join(str(err).split())  # a YAML error's lines as one
    except (ValueError, TypeError, KeyError, AttributeError) as err:  # the client library's reading of odd shapes
        reason = f"not a kubeconfig ({type(err).__name__}: {err})"
    else:
        return None
    where = kubeconfig_path() or "~/.kube/config ($KUBECONFIG unset)"
    return f"no cluster to connect to: not in a pod, and the kubeconfig {where}: {reason}"


class _SuccessAtDebug(logging.Filter):
    """Kopf's "Handler/Activity/Daemon 'x' succeeded." lines (most of a working operator's log: every
    wake-up of every run) are debug lines: shown with --verbose/--debug, else dropped."""

    def __init__(self, debug: bool):
        super().__init__()
        self.debug = debug

    def filter(self, record: logging.LogRecord) -> bool:
        message = str(record.msg)
        if (
            record.levelno == logging.INFO
            and message.endswith(" succeeded.")
            and message.startswith(("Handler '", "Activity '", "Daemon '"))
        ):
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return self.debug
        return True


def quiet_success(debug: bool) -> None:
    for handler in logging.getLogger().handlers:
        handler.addFilter(_SuccessAtDebug(debug))


def serve(shutdown_timeout: float, **kopf_args: Any) -> int:
    """Run Kopf until SIGTERM/SIGINT; return 0 once Kopf has stopped, or exit with ExitCode.STOPPED when its
    shutdown is still going `shutdown_timeout` seconds after the signal.

    Kopf's shutdown waits for its last requests, with no deadline of its own but the request timeout and its
    retries (minutes; then its `ultimate_exiting_timeout` SIGKILLs it after 10 min): with `--peering` the
    working replica's goodbye, a merge-patch removing its record from the peering object (kopf/_core/engines/
    cluster/peering.py, `keepalive`: a shielded `touch(lifetime=0)` in `finally`). An API server that does not answer it
    would hold the pod until the kubelet kills it. A standby resumes when the record expires anyway, so the
    wait buys nothing past a short bound, kept below the pod's terminationGracePeriodSeconds."""
    import asyncio
    import concurrent.futures
    import signal

    import kopf

    from rlt.contract.exitcodes import ExitCode

    log = logging.getLogger("rlt.operator")

    def overdue(name: str) -> None:  # a timer thread: it fires even while the event loop or its threads hang
        log.warning(
            f"{name}: the shutdown did not finish in {shutdown_timeout:g}s (the API server did not answer?): "
            f"exiting with {int(ExitCode.STOPPED)}; a standby resumes when this replica's peering record expires"
        )
        logging.shutdown()  # flush the handlers: os._exit skips them
        os._exit(ExitCode.STOPPED)

    async def operate() -> None:
        loop = asyncio.get_running_loop()
        executor = concurrent.futures.ThreadPoolExecutor(thread_name_prefix="rlt-api")  # drained below, not awaited
        loop.set_default_executor(executor)
        existing = asyncio.all_tasks()  # ours: Kopf must not cancel them as hung tasks at its exit
        stop = asyncio.Event()
        tasks = await kopf.spawn_tasks(stop_flag=stop, **kopf_args)

        def stopping(sig: signal.Signals) -> None:
            if stop.is_set():
                return
            log.info(f"{sig.name}: stopping, at most {shutdown_timeout:g}s")
            timer = threading.Timer(shutdown_timeout, overdue, args=(sig.name,))
            timer.daemon = True
            timer.start()
            stop.set()

        # After spawn_tasks, which installed Kopf's own handlers (they stop Kopf with no deadline): ours replace them.
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stopping, sig)
        await kopf.run_tasks(tasks, ignored=existing)
        # Kopf has stopped (loops cancelled, goodbye sent). A reconcile's API call may still be running in a worker
        # thread, which asyncio.run and the interpreter would wait for (up to the client timeout, 15 s): its result
        # is no longer wanted, so it is abandoned after a short drain, as a kill would.
        drained = threading.Event()

        def drain() -> None:
            executor.shutdown(wait=True)
            drained.set()

        threading.Thread(target=drain, daemon=True).start()
        if not drained.wait(EXECUTOR_DRAIN_SECONDS):
            log.info(f"stopped; abandoning API calls still in flight after {EXECUTOR_DRAIN_SECONDS:g}s")
        # Everything that matters is done (Kopf stopped, goodbye and Lease release sent, logs flushed below). The
        # interpreter's own teardown (freeing every module and object) took 2-3 s on a loaded machine: skipped.
        logging.shutdown()  # flush the handlers: os._exit skips them
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(ExitCode.OK)

    asyncio.run(operate())
    return int(ExitCode.OK)


def _warn_missing_peering(log: Any, args: argparse.Namespace) -> None:
    """One clear line when the peering object is absent: Kopf itself only logs it at debug level, and waits."""
    from rlt_operator.cluster import peering
    from rlt_operator.cluster.kube import Kube

    try:
        absent = peering.missing(Kube.from_environment(), args.peering, None if args.all_namespaces else args.namespace)
    except Exception as err:  # a diagnostic only (e.g. 404: no peering CRD): Kopf reports real API failures itself
        log.error(f"--peering {args.peering}: cannot read the peering objects ({err}); this replica stays paused")
        return
    if absent:
        log.error(
            f"--peering {args.peering}: {', '.join(absent)} not found; this replica stays paused until it exists "
            "(the chart creates it; see docs/operator.md, High availability)"
        )


def _seconds(raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 2:
        raise argparse.ArgumentTypeError(f"--peering-lifetime {raw!r}: expected whole seconds, at least 2")
    return value


def _positive_seconds(flag: str) -> Any:
    def parse(raw: str) -> float:
        try:
            value = float(raw)
        except ValueError:
            value = 0.0
        if not 0 < value < 3600:
            raise argparse.ArgumentTypeError(f"{flag} {raw!r}: expected seconds, above 0 and below 3600")
        return value

    return parse


def validate_on_server(path: str, args: argparse.Namespace) -> list[str]:
    """`rlt validate --server`: every child the operator would create for each run of the file, and the pods they
    would make, dry-run on the current kubeconfig's API server (rlt_operator.apply.server_check); each refusal names the
    run's field or the cluster object that refused; a user without the rights is told so (NotPermitted)."""
    if not args.server:
        return []
    from rlt.checks.validation import NotChecked, load_valid_runs, pod_path_problems
    from rlt_operator.apply import server_check

    runs = load_valid_runs(path)  # as the operator reads it: no local path resolution
    in_pods = [p for run in runs for p in pod_path_problems(run.spec)]
    try:
        return in_pods + server_check.server_problems(runs)
    except NotChecked as err:  # no server to ask: no verdict, unless the run is already INVALID without one
        if not in_pods:
            raise
        return [*in_pods, str(err)]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    validate = sub.choices.get("validate")
    if validate is not None:  # the core's validate, with the check only the operator's package can make
        validate.add_argument(
            "--server",
            action="store_true",
            help="also dry-run every child the operator would create on the current kubeconfig's API server "
            "(kubectl's --dry-run=server); each refusal names the run's field",
        )
        validate.set_defaults(more_checks=[*validate.get_default("more_checks"), validate_on_server])
    p = sub.add_parser("crd", help="print the RLTRun CustomResourceDefinition generated from the spec model")
    p.set_defaults(func=cmd_crd)

    p = sub.add_parser("operator", help="run the RLTRun operator (Kopf) against the current kubeconfig/cluster")
    scope = p.add_mutually_exclusive_group(required=True)
    scope.add_argument("--namespace", action="append", metavar="NS", help="watch this namespace (repeatable)")
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="watch every namespace")
    p.add_argument(
        "--peering",
        metavar="NAME",
        help="run as one of several replicas: Kopf peering in the ClusterKopfPeering NAME (with -A) or the "
        "KopfPeering NAME of each watched namespace; one replica works, the others wait (default: standalone)",
    )
    p.add_argument(
        "--priority",
        type=int,
        help="peering priority, the highest live replica works (default: derived from the start time, the "
        "replica started first works; a random tie-break)",
    )
    p.add_argument(
        "--peering-lifetime",
        type=_seconds,
        default=DEFAULT_LIFETIME,
        metavar="SECONDS",
        help="how long a replica's keep-alive stays valid: a standby takes over at most this long after the "
        f"working replica died (default: {DEFAULT_LIFETIME})",
    )
    for flag, default, what in (
        (
            "--lease-duration",
            DEFAULT_LEASE_DURATION,
            "how long a standby waits, after the Lease last changed, before "
            "it takes the Lease of a leader that stopped renewing (whole seconds)",
        ),
        (
            "--renew-deadline",
            DEFAULT_RENEW_DEADLINE,
            "the leader stops acting when it has not renewed the Lease for "
            "this long; below --lease-duration, so that it stops before another replica may take over",
        ),
        ("--retry-period", DEFAULT_RETRY_PERIOD, "how often each replica tries to take or renew the Lease"),
    ):
        p.add_argument(
            flag,
            type=_positive_seconds(flag),
            default=default,
            metavar="SECONDS",
            help=f"with --peering, leader election by a coordination.k8s.io Lease: {what} (default: {default:g})",
        )
    p.add_argument(
        "--shutdown-timeout",
        type=_positive_seconds("--shutdown-timeout"),
        default=DEFAULT_SHUTDOWN_TIMEOUT,
        metavar="SECONDS",
        help="after SIGTERM, exit with code 75 if Kopf has not stopped within this many seconds (e.g. the API "
        "server does not answer the peering goodbye); keep it below the pod's terminationGracePeriodSeconds "
        f"(default: {DEFAULT_SHUTDOWN_TIMEOUT:g})",
    )
    p.add_argument(
        "--log-format",
        choices=("text", "json"),
        default="text",
        help="text lines prefixed [namespace/run], or one JSON object per line with the run under 'object' "
        "(default: text)",
    )
    level = p.add_mutually_exclusive_group()
    level.add_argument("--verbose", action="store_true", help="log at INFO: every handler run and object written")
    level.add_argument("--debug", action="store_true", help="log at DEBUG: Kopf's and the API client's own detail")
    level.add_argument("--quiet", action="store_true", help="log warnings and errors only")
    p.set_defaults(func=cmd_operator)
