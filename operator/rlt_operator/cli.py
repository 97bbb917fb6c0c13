"""CLI commands of the operator side (`rlt crd`, `rlt operator`, `rlt sandbox`).

Kopf and the Kubernetes client are imported inside the handlers: `rlt validate` must stay light.
"""

from __future__ import annotations

import argparse
import sys


def cmd_crd(args: argparse.Namespace) -> int:
    from rlt_operator import crd

    if args.write:
        print(f"wrote {crd.write()}")
    else:
        sys.stdout.write(crd.render())
    return 0


def cmd_operator(args: argparse.Namespace) -> int:
    import logging

    import kopf

    from rlt_operator import handlers  # noqa: F401 - registers the handlers
    from rlt_operator.settings import OperatorSettings

    config = OperatorSettings.from_env()  # every RLT_* variable, read once here

    # The operator owns its log format: drop handlers another command's registration may have installed.
    logging.getLogger().handlers.clear()
    kopf.configure(debug=args.debug, verbose=args.verbose, quiet=args.quiet)
    logging.getLogger("rlt.operator").info("starting")
    health = config.health_port
    kopf.run(
        standalone=True,  # one replica (Deployment strategy Recreate); no peering objects needed
        clusterwide=args.all_namespaces,
        namespaces=args.namespace or [],
        liveness_endpoint=f"http://0.0.0.0:{health}/healthz" if health > 0 else None,
        memo=kopf.Memo(settings=config),
    )
    return 0


def cmd_sandbox(args: argparse.Namespace) -> int:
    from rlt_operator import sandbox

    run_pods = None
    if args.run_pods is not None:
        import tempfile

        run_pods = args.run_pods or tempfile.mkdtemp(prefix="rlt-sandbox-pods-")
    return sandbox.run(
        port=args.port,
        kubeconfig_path=args.kubeconfig,
        namespaces=args.namespace or ["default"],
        run_pods=run_pods,
        images=args.image,
    )


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("crd", help="print the RLTRun CustomResourceDefinition generated from the spec model")
    p.add_argument("--write", action="store_true", help="write manifests/crd/rltruns.rlt.dev.yaml instead")
    p.set_defaults(func=cmd_crd)

    p = sub.add_parser("operator", help="run the RLTRun operator (Kopf) against the current kubeconfig/cluster")
    scope = p.add_mutually_exclusive_group(required=True)
    scope.add_argument("--namespace", action="append", metavar="NS", help="watch this namespace (repeatable)")
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="watch every namespace")
    level = p.add_mutually_exclusive_group()
    level.add_argument("--verbose", action="store_true")
    level.add_argument("--debug", action="store_true")
    level.add_argument("--quiet", action="store_true")
    p.set_defaults(func=cmd_operator)

    p = sub.add_parser(
        "sandbox",
        help="emulated Kubernetes API + the operator, for kubectl: a preview of what the operator would "
        "create, not a cluster",
    )
    p.add_argument("--port", type=int, default=18443, help="port of the emulated API (default 18443)")
    p.add_argument("--kubeconfig", help="where to write the kubeconfig (default: $TMPDIR/rlt-sandbox/kubeconfig)")
    p.add_argument("--namespace", action="append", metavar="NS", help="extra namespaces to create")
    p.add_argument(
        "--run-pods",
        nargs="?",
        const="",
        metavar="DIR",
        help="run the pods as local processes (kubelet emulator; volumes and logs under DIR, "
        "default a new temp folder)",
    )
    p.add_argument(
        "--image",
        action="append",
        default=[],
        metavar="IMAGE=BINDIR",
        help="with --run-pods: the local bin folder standing for IMAGE (default for every image: this "
        "Python environment); e.g. the generator image = .vllm-venv/bin",
    )
    p.set_defaults(func=cmd_sandbox)
