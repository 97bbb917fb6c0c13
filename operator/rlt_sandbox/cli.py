"""`rlt sandbox`: the emulated Kubernetes API with the operator attached, registered through the `rlt.commands`
entry point like the operator's commands."""

from __future__ import annotations

import argparse


def cmd_sandbox(args: argparse.Namespace) -> int:
    from rlt_sandbox import sandbox

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
        node_labels=parse_labels(args.node_label),
        missing_images=args.missing_image,
    )


def parse_labels(specs: list[str]) -> dict[str, str]:
    out = {}
    for spec in specs:
        key, sep, value = spec.partition("=")
        if not sep or not key:
            raise SystemExit(f"--node-label {spec!r}: expected KEY=VALUE")
        out[key] = value
    return out


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "sandbox",
        help="emulated Kubernetes API + the operator, for kubectl: a preview of what the operator would "
        "create, not a cluster",
    )
    p.add_argument(
        "--port", type=int, help="port of the emulated API (default 18443, or a free one when 18443 is taken)"
    )
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
    p.add_argument(
        "--node-label",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="with --run-pods: a label of the sandbox's one node, for nodeSelectors (e.g. "
        "nvidia.com/gpu.memory=81559, which the trainer's preflight reads as the GPUs' memory)",
    )
    p.add_argument(
        "--missing-image",
        action="append",
        default=[],
        metavar="PATTERN",
        help="with --run-pods: images matching this pattern (fnmatch, e.g. '*:nope') cannot be pulled: their pods "
        "stay Pending with ErrImagePull / ImagePullBackOff, as a kubelet reports it",
    )
    p.set_defaults(func=cmd_sandbox)
