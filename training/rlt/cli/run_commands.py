"""CLI commands that train: `rlt run` (local, all stages) and `rlt stage` (one stage, in a pod)."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from typing import NoReturn

from rlt.checks.validation import load_valid_run
from rlt.cli.arg_types import add_output_dir, folder_to_write, metrics_port, seconds
from rlt.contract.exitcodes import ExitCode
from rlt.contract.metrics import TRAINER_METRICS_PORT
from rlt.contract.stage_registry import STAGE_ORDER
from rlt.spec.loading import SpecError
from rlt.spec.run import RLTRun

DEFAULT_METRICS_PORT = TRAINER_METRICS_PORT


def _load(path: str, paths_from_file: bool = True) -> RLTRun:
    """The run of a file, fully checked. On this machine (run, eval, compare) relative local paths are taken from
    the file's folder; in a pod (`rlt stage`, paths_from_file=False) they are the container's."""
    # Logging is set up by the command that runs, not at registration: the operator has its own format.
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        return load_valid_run(path, paths_from_file)  # the checks `rlt validate` and the operator make
    except SpecError as err:
        _fail(str(err), ExitCode.CONFIG_ERROR)


def input_errors() -> tuple[type[Exception], ...]:
    """Problems a person must fix (spec, data, a stage finished under another spec, a taken port): said in one line
    without a traceback, exit code DATA_ERROR or CONFIG_ERROR, so the operator fails the run instead of restarting its pods."""
    from rlt.contract.layout import MissingStageInput
    from rlt.data.errors import DataError
    from rlt.run.lock import RunLockedError
    from rlt.run.runner import MetricsPortError
    from rlt.spec.fingerprint import StaleStageError

    return SpecError, DataError, StaleStageError, MetricsPortError, RunLockedError, MissingStageInput


def _one_line_on_input_error(command: str, fn: Callable[[], object]) -> int:
    from rlt.data.models import ModelLoadError
    from rlt.stages.preemption import Stopped

    try:
        fn()
    except Stopped as stopped:  # SIGTERM: the checkpoint is saved; a disruption, not an error
        print(f"rlt {command}: {stopped}", file=sys.stderr)
        return ExitCode.STOPPED
    except input_errors() as err:
        from rlt.data.errors import DataError

        return _said(command, err, ExitCode.DATA_ERROR if isinstance(err, DataError) else ExitCode.CONFIG_ERROR)
    except ModelLoadError as err:  # one line; a hub that may answer next time keeps exit 1, so a pod is retried
        return _said(command, err, ExitCode.CONFIG_ERROR if err.definitive else ExitCode.FAILED)
    return ExitCode.OK


def _said(command: str, err: Exception, code: ExitCode) -> ExitCode:
    return _say(f"rlt {command}: {err}", code)


def _say(line: str, code: ExitCode) -> ExitCode:
    """The one line, on stderr and to `rlt launch` when it runs this rank (its launcher's reports come after, and its
    exit 1 would hide the code)."""
    from rlt.cli.launch import note_failure

    print(line, file=sys.stderr)
    note_failure(line, code)
    return code


def _fail(line: str, code: ExitCode) -> NoReturn:
    raise SystemExit(_say(line, code)) from None


def _chosen_metrics_port(command: str, flag: int | None = None) -> int | None:
    """The --metrics-port flag, else $RLT_METRICS_PORT; None when neither says. A bad value is one line."""
    from rlt.contract.metrics import metrics_port_from_env

    if flag is not None:
        return flag
    try:
        return metrics_port_from_env()
    except ValueError as err:
        _fail(f"rlt {command}: {err}", ExitCode.CONFIG_ERROR)


def _check_device(command: str, device: str | None) -> None:
    """--device cuda on a machine with no CUDA device: one line before anything loads (it was a traceback from
    transformers' arguments once a stage had started)."""
    if device != "cuda":
        return
    import torch

    if not torch.cuda.is_available():
        build = f"torch {torch.__version__}, " + ("built for CPU" if torch.version.cuda is None else "no GPU visible")
        _fail(
            f"rlt {command}: --device cuda: no CUDA device here ({build}); leave --device out for the CPU",
            ExitCode.UNAVAILABLE,
        )


def _bars(no_progress: bool) -> bool:
    """Progress bars only where someone watches them: a terminal on stderr (as pip does); a log file gets the stages'
    lines and the metrics, not a carriage-return stream."""
    return not no_progress and sys.stderr.isatty()


def _port_to_serve(chosen: int | None) -> int | None:
    return DEFAULT_METRICS_PORT if chosen is None else None if chosen < 0 else chosen


def _skip_unused_tracking_libraries(args: argparse.Namespace, run: RLTRun) -> None:
    """Before the runner (and through it TRL and DeepSpeed) is imported: their imports of W&B and MLflow cost
    seconds per process."""
    if getattr(args, "owns_process", False):
        from rlt.stages.tracking import hide_unused_tracking_libraries

        hide_unused_tracking_libraries(run)


def cmd_run(args: argparse.Namespace) -> int:
    run = _load(args.file)
    _check_device("run", args.device)
    _skip_unused_tracking_libraries(args, run)
    from rlt.run.runner import run_local

    # The flag, else $RLT_METRICS_PORT, else 9400 with a free port when that is taken.
    chosen = _chosen_metrics_port("run", args.metrics_port)
    return _one_line_on_input_error(
        "run",
        lambda: run_local(
            run,
            args.output_dir,
            _port_to_serve(chosen),
            args.linger,
            args.stage or None,
            args.device,
            _bars(args.no_progress),
            from_stage=args.from_stage,
            port_fallback=chosen is None,
        ),
    )


def cmd_stage(args: argparse.Namespace) -> int:
    run = _load(args.config, paths_from_file=False)
    _skip_unused_tracking_libraries(args, run)
    from rlt.run.runner import run_stage_in_pod

    port = _port_to_serve(_chosen_metrics_port("stage"))
    return _one_line_on_input_error(
        "stage", lambda: run_stage_in_pod(run, args.name, args.root, port, restart=args.restart)
    )


def _eval_choice_problem(run: RLTRun, teacher: str | None, label: str | None, output: str) -> str | None:
    """What is wrong with `rlt eval`'s --teacher and --label, before any model loads; None when nothing."""
    import re
    from pathlib import Path

    from rlt.checks.validation import model_name_problem
    from rlt.contract.layout import RunLayout
    from rlt.contract.stage_registry import teacher_stages_before
    from rlt.spec.run import stage_settings

    if label is not None and (label in (".", "..") or not re.fullmatch(r"[A-Za-z0-9_.-]+", label)):
        return f"--label {label!r}: a report row and a folder name: letters, digits, '.', '_' and '-' only"
    if teacher is None:  # the run's newest trained teacher: one must have finished under --output-dir
        layout = RunLayout.for_run(output, run.name)
        trains = [s for s in teacher_stages_before("evaluate") if stage_settings(run.spec, s).enabled]
        if trains and not any(layout.stage_done(s).exists() for s in trains):
            return (
                f"no finished teacher stage ({', '.join(trains)}) under {layout.root}: run `rlt run` first, check "
                "--output-dir, or pass --teacher initial to evaluate spec.teacher"
            )
    elif named := model_name_problem(teacher):
        return f"--teacher: {named}"
    elif (teacher.startswith(("/", "./", "../", "~")) or teacher.count("/") > 1) and not Path(teacher).is_dir():
        return f"--teacher {teacher}: no such folder"  # a path, not a hub id (org/name), as written
    return None


def cmd_eval(args: argparse.Namespace) -> int:
    from rlt.contract.method_registry import load_function, method_info

    run = _load(args.file)
    teaching_eval = method_info(run.spec.method).teaching_eval
    if teaching_eval is None:
        print(
            f"{args.file}: rlt eval runs the rcl teaching evaluation; this run has method {run.spec.method} "
            "(use its evaluate stage)",
            file=sys.stderr,
        )
        return ExitCode.CONFIG_ERROR
    _check_device("eval", args.device)
    problem = _eval_choice_problem(run, args.teacher, args.label, args.output_dir)
    if problem:
        print(f"rlt eval: {problem}", file=sys.stderr)
        return ExitCode.USAGE
    run_teaching_eval = load_function(teaching_eval)

    def evaluate() -> None:
        report = run_teaching_eval(run, args.output_dir, args.teacher, args.label, args.device)
        print(report.read_text())
        print(f"report: {report}")

    return _one_line_on_input_error("eval", evaluate)


def cmd_compare(args: argparse.Namespace) -> int:
    from rlt.run.compare import run_compare

    run = _load(args.file)
    _check_device("compare", args.device)
    _skip_unused_tracking_libraries(args, run)
    port = None if args.metrics_port < 0 else args.metrics_port
    return _one_line_on_input_error(
        "compare", lambda: run_compare(run, args.output_dir, args.device, _bars(args.no_progress), port)
    )


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("run", help="run an RLTRun's stages on this machine into DIR/<run>/")
    p.add_argument("file", metavar="FILE", help="RLTRun YAML")
    add_output_dir(p, "results folder (default: results)", default="results", old="--output")
    p.add_argument(
        "--metrics-port",
        type=metrics_port,
        default=None,
        help=f"Prometheus port on 127.0.0.1 (default $RLT_METRICS_PORT, else {DEFAULT_METRICS_PORT} or a free one "
        "when it is taken; 0 = any, -1 = off)",
    )
    p.add_argument(
        "--linger",
        type=seconds(),
        default=0.0,
        metavar="SECONDS",
        help="keep serving metrics this many seconds after the run (default: 0)",
    )
    p.add_argument("--stage", action="append", choices=STAGE_ORDER, help="run only this stage (repeatable)")
    p.add_argument(
        "--from-stage",
        choices=STAGE_ORDER,
        help="start this stage and every later one over (old outputs move to DIR/<run>/replaced/); "
        "needed after editing the spec of a finished stage",
    )
    p.add_argument("--device", choices=["cpu", "cuda"], help="default: cuda if available")
    p.add_argument(
        "--no-progress", action="store_true", help="no progress bars (there are none when stderr is not a terminal)"
    )
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("eval", help="rcl: APG/NDR/TES of a teacher on the held-out split -> DIR/<run>/eval/")
    p.add_argument("file", metavar="FILE", help="RLTRun YAML (method: rcl)")
    p.add_argument(
        "--teacher",
        help="teacher to evaluate: a model path or hub id, builtin:<name>, 'initial' "
        "(spec.teacher), 'none' (no teacher); default: the run's latest trained teacher (rl, else sft)",
    )
    p.add_argument("--label", help="row name in the report (default: from --teacher)")
    add_output_dir(p, "results folder of the run (default: results)", default="results", old="--output")
    p.add_argument("--device", choices=["cpu", "cuda"], help="default: cuda if available")
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("stage", help="run one stage of the run in --config (what the operator's pods execute)")
    p.add_argument("name", choices=STAGE_ORDER, metavar="STAGE", help=f"the stage to run: {', '.join(STAGE_ORDER)}")
    p.add_argument("--config", metavar="FILE", required=True, help="RLTRun YAML (the run's ConfigMap)")
    p.add_argument(
        "--root",
        metavar="ROOT",
        type=folder_to_write,
        default="/data",
        help="data root, the run's PVC (default: /data)",
    )
    p.add_argument(
        "--restart",
        action="store_true",
        help="start the stage over even if it finished (old outputs move to ROOT/<run>/replaced/)",
    )
    p.set_defaults(func=cmd_stage)
    p = sub.add_parser(
        "compare",
        help="distil students from the RL teacher, the SFT-only teacher and the dataset's traces; "
        "evaluate them and the untrained student (DIR/<run>/compare/)",
    )
    p.add_argument(
        "file", metavar="FILE", help="RLTRun YAML (sft and rl enabled; student/evaluate defaults apply when disabled)"
    )
    add_output_dir(p, "results folder (default: results)", default="results", old="--output")
    p.add_argument(
        "--metrics-port",
        type=metrics_port,
        default=-1,
        help="Prometheus port on 127.0.0.1 (0 = any, -1 = off; default: off)",
    )
    p.add_argument("--device", choices=["cpu", "cuda"], help="default: cuda if available")
    p.add_argument(
        "--no-progress", action="store_true", help="no progress bars (there are none when stderr is not a terminal)"
    )
    p.set_defaults(func=cmd_compare)
