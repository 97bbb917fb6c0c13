"""`rlt sandbox`: the emulated Kubernetes API with the operator attached, registered through the `rlt.commands`
entry point like the operator's commands."""

from __future__ import annotations

import argparse
import sys

from rlt.cli.arg_types import add_output_dir, file_to_write, folder_to_write, port, seconds


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


def cmd_monitor(args: argparse.Namespace) -> int:
    import tempfile
    from pathlib import Path

    from rlt_sandbox.monitoring import run_monitor

    run_file = Path(args.file) if args.file else None
    if run_file is None and args.trainer is None and args.operator is None:
        raise SystemExit("rlt monitor: give a run file, --trainer HOST:PORT or --operator HOST:PORT to scrape")
    run_name = None
    if run_file is not None:  # checked as `rlt run` will check it, before anything starts
        from rlt.checks.validation import load_valid_run
        from rlt.contract.exitcodes import ExitCode
        from rlt.spec.loading import SpecError

        try:
            run_name = load_valid_run(run_file, paths_from_file=True).name
        except SpecError as err:
            print(str(err), file=sys.stderr)
            return int(ExitCode.CONFIG_ERROR)
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="rlt-monitor-"))
    out = Path(args.output_dir) if args.output_dir else None
    return run_monitor(run_file, run_name, args.trainer, args.operator, args.port, out, args.every, work)


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
        "--port", type=port, help="port of the emulated API (default 18443, or a free one when 18443 is taken)"
    )
    p.add_argument(
        "--kubeconfig",
        metavar="FILE",
        type=file_to_write,
        help="where to write the kubeconfig (default: $TMPDIR/rlt-sandbox/kubeconfig)",
    )
    p.add_argument("--namespace", action="append", metavar="NS", help="extra namespaces to create")
    p.add_argument(
        "--run-pods",
        nargs="?",
        const="",
        metavar="DIR",
        type=folder_to_write,
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

    m = sub.add_parser(
        "monitor",
        help="the chart's monitoring on this machine: a real Prometheus (make tools) with the chart's scrape config "
        "and alert rules, and its dashboards drawn as PNGs, for a local run (started here from FILE) or the sandbox",
    )
    m.add_argument(
        "file", nargs="?", metavar="FILE", help="a run file to run here with its metrics served (rlt run FILE)"
    )
    m.add_argument("--trainer", metavar="HOST:PORT", help="a run's exporter already serving (rlt run --metrics-port)")
    m.add_argument(
        "--operator", metavar="HOST:PORT", help="the operator's metrics (rlt sandbox with RLT_OPERATOR_METRICS_PORT)"
    )
    m.add_argument("--port", type=port, default=9090, help="Prometheus' port on 127.0.0.1 (default 9090)")
    add_output_dir(m, "where the dashboards' PNGs go (default results/<run>/dashboards)", default=None, old="--out")
    m.add_argument(
        "--every",
        type=seconds(above=True),
        default=30.0,
        metavar="SECONDS",
        help="seconds between two drawings of the dashboards (default: 30)",
    )
    m.add_argument(
        "--work",
        metavar="DIR",
        type=folder_to_write,
        help="Prometheus' data and config folder (default a new temp folder)",
    )
    m.set_defaults(func=cmd_monitor)
