"""CLI commands of the operator side (`rlt crd`, `rlt operator`); `rlt sandbox` is rlt_sandbox.cli.

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


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("crd", help="print the RLTRun CustomResourceDefinition generated from the spec model")
    p.add_argument("--write", action="store_true", help="write it under manifests/crd/ instead")
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
