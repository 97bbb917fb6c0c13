"""The one validation entry point: what makes an RLTRun invalid beyond its field types.

`rlt validate`, the local runner, the pods (`rlt stage`) and the operator all call this module, so a
spec the CLI refuses is refused by the operator too, with the same message. The pydantic model checks
each field (and the cross-field rules the CRD repeats as CEL); the rules here look at what the model
cannot: the prompt format against the method, trainerArgs against TRL's option table (every key
reported), the volume's access mode against the number of nodes, and the run's name, which the operator
receives apart from the spec.

`local_files=False` is for the operator: it cannot read paths that only exist inside the pods
(`format.file`, `rcl.format` as a path), so those are checked where they are read.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from rlt.contract.method_registry import load_function, method_info
from rlt.contract.stage_registry import TRAINER_STAGES, stage_info
from rlt.spec.inputs import DATA_SUFFIXES
from rlt.spec.k8s import RunName
from rlt.spec.loading import SpecError, parse_spec, read_runs, resolve_local_paths
from rlt.spec.run import RLTRun, RLTRunSpec, stage_settings
from rlt.spec.trainer_args import trainer_args_problems as check_trainer_args


class NotPermitted(Exception):  # noqa: N818 - a verdict on the user's rights, not on the run
    """A check the user may not make (`rlt validate --server` without the rights to dry-run the children): one line
    naming the verbs and kinds, exit code NO_PERMISSION, never INVALID."""


class NotChecked(Exception):  # noqa: N818 - a check that could not be made, not a verdict on the run
    """A check with no one to ask (`rlt validate --server` without a reachable API server): one line, exit code
    UNAVAILABLE, never INVALID."""


def run_name_problem(name: str) -> str | None:
    """The run name's rule (rlt.spec.k8s.RunName, the type of metadata.name) for the operator, which receives the
    name apart from the spec."""
    try:
        TypeAdapter(RunName).validate_python(name)
    except ValidationError as err:
        return f"metadata.name: {err.errors()[0]['msg'].removeprefix('Value error, ')}"
    return None


def format_problems(spec: RLTRunSpec, local_files: bool = True) -> list[str]:
    """The prompt format the run names must load and fit its method."""
    method = method_info(spec.method)
    try:
        load_function(method.format_check)(spec, local_files)
    except (ValueError, ValidationError) as err:
        first = str(err).splitlines()[0]
        return [
            first
            if first.startswith("spec.")
            else f"{method.format_field}: not a usable {method.name} format ({first})"
        ]
    return []


def trainer_args_problems(spec: RLTRunSpec) -> list[str]:
    """Every trainerArgs key of every enabled Trainer stage that rlt sets itself, that its TRL config does not have,
    or whose value is not of the option's type (rlt.spec.trainer_args, TRL's option table: no TRL needed)."""
    out: list[str] = []
    for stage in TRAINER_STAGES:
        settings = stage_settings(spec, stage)
        config = stage_info(stage).trl_config
        if settings.enabled and settings.trainer_args and config is not None:
            out += check_trainer_args(stage, config, settings.owned_trainer_args, settings.trainer_args)
    return out


def _model_refs(spec: RLTRunSpec) -> list[tuple[str, Any]]:
    return [(f"{where}.model", ref) for where, ref, _ in spec.named_models()]


def model_name_problem(name: str) -> str | None:
    """What is wrong with a model's name as a loader would read it (a web address, an unknown built-in); None when
    it is a hub id, a local path or a known built-in (`rlt validate` for the spec's, `rlt eval --teacher`)."""
    from rlt.spec.inputs import BUILTIN_MODELS

    if "://" in name:
        hub = name.split("huggingface.co/", 1)[1].strip("/") if "huggingface.co/" in name else None
        fix = f"give the hub id {hub!r}" if hub else "give a hub id (org/name) or a local directory"
        return f"{name!r} is a URL; models load from a hub id or a local directory: {fix}"
    if name.startswith("builtin:") and name.removeprefix("builtin:") not in BUILTIN_MODELS:
        known = ", ".join(f"builtin:{b}" for b in BUILTIN_MODELS)
        return f"unknown built-in model {name!r} (choose from {known})"
    return None


def source_problems(spec: RLTRunSpec) -> list[str]:
    """Models and datasets named in a form something can load: a hub id, a local path or a known built-in; a web
    address or another URL scheme is refused here, not by the loader hours later."""
    from rlt.data.tasks import TASKS

    out = [f"{where}: {problem}" for where, ref in _model_refs(spec) if (problem := model_name_problem(ref.model))]
    for where, ds in ((f"{w}.source", ds) for w, ds, _ in spec.named_datasets()):
        if "://" in ds.source:
            out.append(
                f"{where}: {ds.source!r} is a URL, which no dataset reader of rlt takes; give a hub dataset id "
                "(org/name), a local file or folder (copy it to the run's volume), or builtin:<task>"
            )
        elif ds.source.startswith("builtin:") and ds.source.removeprefix("builtin:") not in TASKS:
            out.append(f"{where}: unknown built-in task {ds.source!r} (choose from {', '.join(TASKS)})")
    return out


def local_entry_problems(spec: RLTRunSpec) -> list[str]:
    """Local format files of the run that no reader can open: a symlink loop, a device file, a pipe, a name too
    long for the filesystem, one line each naming the field (nothing is read)."""
    from rlt.spec.local_files import entry_exists, entry_problem

    entries = []  # the data sources' are the data check's (exit DATA_ERROR in the pods), not the spec's
    if spec.format.file:
        entries.append(("spec.format.file", spec.format.file))
    if Path(spec.rcl.format).suffix:  # a file named (a bundled format's name has none): checked whatever the method
        entries.append(("spec.rcl.format", spec.rcl.format))
    out = []
    for where, value in entries:
        if not value.startswith("builtin:") and "://" not in value and entry_exists(value):
            out += [p for p in [entry_problem(value, where, _short(value))] if p]
    return out


def _short(value: str) -> str:
    return value if len(value) <= 80 else f"{value[:40]}...{value[-20:]} ({len(value)} characters)"


def local_model_problems(spec: RLTRunSpec) -> list[str]:
    """The config.json of every model this machine holds (a local folder, a built built-in, the Hugging Face cache),
    read by the guarded reader: a GGUF file, a device file, a loop, a truncated or non-causal-LM config is one line
    naming the field (rlt.checks.shapes.config_refusals; no torch)."""
    from rlt.checks.model_config import config_refusals

    return [line for where, ref in _model_refs(spec) for line in config_refusals(ref, where)]


def cluster_problems(spec: RLTRunSpec) -> list[str]:
    """Combinations a cluster cannot run, refused before anything is created."""
    out: list[str] = []
    nodes = spec.resources.trainer.nodes
    # the Trainer stages' Jobs have resources.trainer.nodes pods (distill and evaluate run on one pod)
    multi = [s for s in spec.stages.enabled() if s in TRAINER_STAGES]
    if spec.storage.access_mode == "ReadWriteOnce" and nodes > 1 and multi:
        # A ReadWriteOnce volume attaches to one node: the other trainer pods would wait on a
        # Multi-Attach error forever.
        out.append(
            f"spec.storage.accessMode: ReadWriteOnce attaches to one node, but stages {', '.join(multi)} "
            f"run {nodes} trainer pods (resources.trainer.nodes), one per node; use ReadWriteMany"
        )
    ev = spec.stages.evaluate
    if ev.enabled and ev.generation.mode == "server" and not ev.generation.server_url:
        # Nothing starts a vLLM server for evaluate (the operator's generators serve rl and distill only).
        out.append(
            "spec.stages.evaluate.generation.serverUrl: required with mode server (no server is started for "
            "evaluate); give the URL of a vLLM server that serves the model, or use mode inprocess"
        )
    lc = spec.resources.trainer.local_checkpoints
    if lc.enabled and lc.storage_class_name is not None and lc.size is None and multi:
        from rlt.checks.step_time import local_checkpoint_size

        size, why = local_checkpoint_size(spec)
        if size is None:  # a claim needs a size; an emptyDir without one is only unbounded
            out.append(f"spec.resources.trainer.localCheckpoints.size: required with storageClassName here ({why})")
    return out


def spec_problems(spec: RLTRunSpec, name: str | None = None, local_files: bool = True) -> list[str]:
    """Every problem beyond the schema, as 'field: message' lines (empty when the spec is usable)."""
    from rlt.checks.consumers import consumer_problems

    out: list[str] = []
    if name is not None:
        problem = run_name_problem(name)
        if problem:
            out.append(problem)
    return (
        out
        + format_problems(spec, local_files)
        + trainer_args_problems(spec)
        + cluster_problems(spec)
        + source_problems(spec)
        + (local_entry_problems(spec) + local_model_problems(spec) if local_files else pod_path_problems(spec))
        + consumer_problems(spec, None if out else name, local_files=local_files)
    )


# Where a cluster run's files are: the recipe of docs/gpu-cluster.md ("Your own dataset or model on the run's volume").
POD_PATH_HELP = (
    "put it on the run's volume and name it by its path there (/data/...; docs/gpu-cluster.md, \"Your own dataset "
    "or model on the run's volume\"), or name a hub id or an object store URL"
)


def pod_path_problems(spec: RLTRunSpec) -> list[str]:
    """A cluster run reads its files inside the trainer pod: a relative path (a file beside the run file on the
    user's machine) names nothing there. One line per such field, saying where the path is read and how to get the
    file there. Absolute paths are the pod's (a volume); hub ids, URLs and built-ins are not paths."""

    def local(value: str | None, suffixes: tuple[str, ...]) -> bool:
        """`suffixes`: the endings that make a bare name a file (a format file is always one)."""
        if not value or value.startswith(("builtin:", "/")) or "://" in value:
            return False
        return value.startswith(("./", "../", "~")) or value.endswith(suffixes)

    formats = (".yaml", ".yml")
    fields: list[tuple[str, str, tuple[str, ...]]] = [
        (f"{where}.source", ds.source, DATA_SUFFIXES) for where, ds, _ in spec.named_datasets()
    ]
    fields += [(f"{where}.model", ref.model, ()) for where, ref, _ in spec.named_models()]
    if spec.format.file:
        fields.append(("spec.format.file", spec.format.file, formats))
    if spec.rcl.format.endswith(formats):
        fields.append(("spec.rcl.format", spec.rcl.format, formats))
    return [
        f"{field}: {value} is a path on your machine, but a cluster run reads it inside the trainer pod, where it is "
        f"not; {POD_PATH_HELP}"
        for field, value, suffixes in fields
        if local(value, suffixes)
    ]


def validate_spec(raw: Any, name: str | None = None, local_files: bool = False, source: str = "<spec>") -> RLTRunSpec:
    """The operator's entry point: the raw `.spec` → a usable spec, or SpecError listing every problem."""
    spec = parse_spec(raw, source)
    problems = spec_problems(spec, name, local_files)
    if problems:
        raise SpecError(source, problems)
    return spec


def run_problems(run: RLTRun, local_files: bool = True) -> list[str]:
    return spec_problems(run.spec, run.name, local_files)


def load_valid_runs(path: str | Path, paths_from_file: bool = False) -> list[RLTRun]:
    """`rlt validate`, `rlt run` and `rlt stage`: every RLTRun of a file, fully checked. `paths_from_file`: the
    commands that run on the user's machine read relative local paths from the file's folder."""
    runs = read_runs(path)
    problems = []
    if paths_from_file:
        problems += [p for run in runs for p in missing_relative_models(run, Path(path).parent)]
        runs = [resolve_local_paths(run, Path(path).parent) for run in runs]
    problems += [p for run in runs for p in run_problems(run)]
    if problems:
        raise SpecError(str(path), problems)
    return runs


def missing_relative_models(run: RLTRun, base: Path) -> list[str]:
    """A model written ./… or ../… is a folder on this machine, read from the run file's folder `base` (a pod
    refuses relative paths: rlt.checks.consumers): one that is not there is named, as a missing dataset is. An
    absolute path may be a path inside the pods, read where it is."""
    from rlt.spec.local_files import entry_exists

    return [
        f"{where}.model: {ref.model}: no such folder ({os.path.abspath(base / ref.model)})"  # noqa: PTH100
        for where, ref, stage in run.spec.named_models()
        if (stage is None or stage_settings(run.spec, stage).enabled)
        and ref.model.startswith(("./", "../"))
        and not entry_exists(base / ref.model)
    ]


def load_valid_run(path: str | Path, paths_from_file: bool = False) -> RLTRun:
    runs = load_valid_runs(path, paths_from_file)
    if len(runs) != 1:
        raise SpecError(str(path), [f"<root>: expected one RLTRun, found {len(runs)}"])
    return runs[0]


def check_datasets(run: RLTRun) -> tuple[list[str], list[str]]:
    """The run's data where this machine can read it: (problems, notes). Every bad row is listed (up to 20)."""
    from rlt.data.dataset import check_data, data_system_prompt, group_problems, is_reachable, scan_rows
    from rlt.data.errors import DataError
    from rlt.method.prompts import resolve_format

    problems: list[str] = []
    notes: list[str] = []
    datasets = [
        (where, ds)
        for where, ds, stage in run.spec.named_datasets()
        if stage is None or stage_settings(run.spec, stage).enabled
    ]
    for where, ds in datasets:
        if not is_reachable(ds):
            notes.append(f"{where}: {ds.source} not checked (a hub dataset is read at run time)")
            continue
        fmt = resolve_format(run.spec.format)
        try:
            data = check_data(ds, fmt, listed=True)
        except DataError as err:
            problems.append(str(err) if str(err).startswith("spec.") else f"{where}: {err}")
            try:  # every bad row, grouped by problem, not only the first
                _, bad, _, _ = scan_rows(ds, fmt)
                problems += [f"  {line}" for line in group_problems(bad)] if len(bad) > 1 else []
            except DataError:
                pass
            continue
        usable = len(data.train)  # check_data does not split: every usable row
        if where == "spec.dataset" and ds.held_out_rows(usable) >= usable:  # the stages train and generate on the rest
            problems.append(
                f"spec.dataset.evalFraction: {ds.eval_fraction:g} holds out {ds.held_out_rows(usable)} of "
                f"{ds.source}'s {usable} usable rows, leaving none to train on (lower it, or add rows)"
            )
            continue
        if where == "spec.dataset":  # each enabled stage says what it needs of the training rows
            train = usable - ds.held_out_rows(usable)
            found = [
                p
                for stage in run.spec.stages.enabled()
                if (p := stage_settings(run.spec, stage).training_rows_problem(train, ds.source))
            ]
            if found:
                problems += found
                continue
        if where == "spec.dataset" and ds.columns.system is not None:
            try:  # the documented cross-row rule the stages apply (one student, one system prompt), here too
                data_system_prompt(ds)
            except DataError as err:
                problems.append(f"spec.dataset.columns.system: {ds.source} {str(err).removeprefix(ds.source + ' ')}")
                continue
        if where == "spec.dataset" and run.spec.stages.sft.enabled:
            # stage sft learns the explanations from the traces (rlt.stages.sft, rlt.rcl.stages): at the door
            bare = [r for r in data.train if not (r.get("reasoning_trace") or "").strip()]
            if bare and (run.spec.dataset.bad_rows == "reject" or len(bare) == len(data.train)):
                column = ds.columns.reasoning_trace
                named = "" if column == "reasoning_trace" else f" (column {column!r})" if column else " (no column)"
                problems.append(
                    f"{where}: {ds.source} {data.where(bare[0]['row'])}: reasoning_trace{named} is missing "
                    f"({len(bare)} of {len(data.train)} rows); stage sft learns explanations from it (map "
                    "spec.dataset.columns.reasoningTrace, disable stages.sft, or set badRows: skip)"
                )
                continue
        used = data.read - len(data.skipped)
        note = f"{where}: {used} usable rows"
        if data.skipped:
            note += f"; badRows: skip drops {len(data.skipped)} of {data.read} (first: {data.skipped[0]})"
        if data.numbers:
            note += f"; {len(data.numbers)} numeric values used as text (first: {data.numbers[0]})"
        notes.append(note)
    return problems, notes


def main(argv: list[str] | None = None) -> int:
    """`python -m rlt.checks.validation FILE...`: the trainer pods' preflight (an init container, before any launcher).

    Exits ExitCode.CONFIG_ERROR for an invalid spec and ExitCode.DATA_ERROR for unusable data (the data check
    of `rlt validate`, where the pod can read the data); the Job's podFailurePolicy then fails the run at once.
    It runs before `accelerate launch`, whose launcher would turn a rank's exit code into 1."""
    import sys

    from rlt.contract.exitcodes import ExitCode

    paths = sys.argv[1:] if argv is None else argv
    status = ExitCode.OK
    for path in paths:
        try:
            runs = load_valid_runs(path)
        except SpecError as err:
            print(str(err), file=sys.stderr)
            status = ExitCode.CONFIG_ERROR
            continue
        for run in runs:
            problems, _notes = check_datasets(run)
            if problems:
                print(f"{path}: unusable data", file=sys.stderr)
                for p in problems:
                    print(f"  {p}", file=sys.stderr)
                status = ExitCode.DATA_ERROR if status == ExitCode.OK else status
    return int(status)


if __name__ == "__main__":
    raise SystemExit(main())
