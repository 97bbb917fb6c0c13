"""spec.outputs: copies of a run's results off the volume, pushed right after the stage that produces each.

Object storage goes through fsspec (s3:// with s3fs, gs:// with gcsfs; file:// and memory:// work as well), the
Hugging Face Hub through huggingface_hub (`hf://<org>/<model>`, `hf://datasets/<org>/<name>`; token HF_TOKEN from
spec.hfTokenSecret). Credentials are the storage library's own environment variables, which the operator fills
from the Secrets named in spec.outputs.credentials. What was pushed is recorded in <run>/outputs.json.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from rlt.contract.env import HF_TOKEN
from rlt.contract.layout import DISTILL_DATASET_FILE, RunLayout
from rlt.contract.stage_registry import Role, producer_of

log = logging.getLogger(__name__)


# What this module reads of a run's spec and of a stage's context. The contract sits below rlt.spec and
# rlt.stages (hack/import_graph.py), so it names the few members it uses rather than RLTRunSpec and StageContext.
class _Destinations(Protocol):
    @property
    def teacher(self) -> str | None: ...
    @property
    def distill_dataset(self) -> str | None: ...
    @property
    def student(self) -> str | None: ...


class _Stages(Protocol):
    def enabled(self) -> list[str]: ...


class RunSpecView(Protocol):
    """The parts of RLTRunSpec that say what to push: the enabled stages and spec.outputs."""

    @property
    def stages(self) -> _Stages: ...
    @property
    def outputs(self) -> _Destinations: ...


class PushContext(Protocol):
    """The parts of a StageContext a push needs: the spec, whether this is rank 0, and the run's folders."""

    @property
    def spec(self) -> RunSpecView: ...
    @property
    def is_main(self) -> bool: ...
    @property
    def layout(self) -> RunLayout: ...


def pushed_uri(uri: str, kind: str) -> str:
    """Where the result lands: the distillation dataset is one file under an object-storage prefix; a model is
    the folder's files under the prefix; a Hub destination is the repository."""
    if kind == "dataset" and not uri.startswith("hf://"):
        return uri.rstrip("/") + "/" + DISTILL_DATASET_FILE
    return uri


@dataclass(frozen=True)
class RunProduct:
    """One result of a run, named by role: the product of the last enabled stage producing the role
    (rlt.contract.stage_registry.producer_of). spec.outputs pushes it, the operator's status names it."""

    role: Role
    output: str  # its spec.outputs field (camelCase)
    attr: str  # ... as the model's attribute
    kind: Literal["model", "dataset"]  # a model folder or the dataset file
    status_path: str  # status.outputs' key of its path on the volume
    status_uri: str  # status.outputs' key of its pushed copy


# The models and datasets a run produces, in one list.
RUN_PRODUCTS: tuple[RunProduct, ...] = (
    RunProduct("teacher", "teacher", "teacher", "model", "teacherCheckpoint", "teacherUri"),
    RunProduct("dataset", "distillDataset", "distill_dataset", "dataset", "distilledDataset", "distilledDatasetUri"),
    RunProduct("student", "student", "student", "model", "studentCheckpoint", "studentUri"),
)
PRODUCT_BY_OUTPUT = {p.output: p for p in RUN_PRODUCTS}


def teacher_stage(spec: RunSpecView) -> str | None:
    """The stage whose model is the run's final teacher: the last enabled teacher stage."""
    return producer_of("teacher", spec.stages.enabled())


def stage_outputs(spec: RunSpecView, stage: str) -> list[tuple[str, str, str]]:
    """(name, destination, kind) to push once `stage` has finished: each run product whose final producer (the last
    enabled stage producing its role) is `stage`, where spec.outputs names a destination for it."""
    enabled = spec.stages.enabled()
    out: list[tuple[str, str, str]] = []
    for p in RUN_PRODUCTS:
        uri = getattr(spec.outputs, p.attr)
        if uri and producer_of(p.role, enabled) == stage:
            out.append((p.output, uri, p.kind))
    return out


def _files(local: Path) -> list[Path]:
    return sorted(p for p in local.rglob("*") if p.is_file()) if local.is_dir() else [local]


def push_fsspec(local: Path, uri: str, kind: str) -> str:
    import fsspec

    fs, root = fsspec.core.url_to_fs(uri)
    root = root.rstrip("/")
    base = local if local.is_dir() else local.parent
    for f in _files(local):
        rel = DISTILL_DATASET_FILE if kind == "dataset" else f.relative_to(base).as_posix()
        target = f"{root}/{rel}"
        fs.makedirs(target.rsplit("/", 1)[0], exist_ok=True)
        fs.put_file(str(f), target)  # one object per file: readers see whole files or none
    return pushed_uri(uri, kind)


def push_hub(local: Path, uri: str, kind: str, api: Any = None) -> str:
    """Upload to a Hub repo (created private if missing). `api` is an HfApi; tests pass a local stand-in."""
    if api is None:
        from huggingface_hub import HfApi

        api = HfApi(token=os.environ.get(HF_TOKEN.name))
    parts = uri.removeprefix("hf://").strip("/").split("/")
    repo_type = "dataset" if parts[0] == "datasets" else "model"
    repo_id = "/".join(parts[1:] if repo_type == "dataset" else parts)
    api.create_repo(repo_id, repo_type=repo_type, private=True, exist_ok=True)
    if local.is_dir():
        api.upload_folder(
            repo_id=repo_id, repo_type=repo_type, folder_path=str(local), commit_message="rlt: push model"
        )
    else:
        api.upload_file(
            repo_id=repo_id,
            repo_type=repo_type,
            path_or_fileobj=str(local),
            path_in_repo=DISTILL_DATASET_FILE,
            commit_message="rlt: push distillation dataset",
        )
    return uri


def push(local: Path, uri: str, kind: str, hub_api: Any = None) -> str:
    if not local.exists():
        raise FileNotFoundError(f"spec.outputs: nothing to push at {local}")
    if uri.startswith("hf://"):
        return push_hub(local, uri, kind, hub_api)
    return push_fsspec(local, uri, kind)


def push_stage_outputs(ctx: PushContext, stage: str, hub_api: Any = None) -> dict[str, str]:
    """Push what `stage` produced to its spec.outputs destinations (rank 0); returns {name: uri}."""
    todo = stage_outputs(ctx.spec, stage)
    if not todo or not ctx.is_main:
        return {}
    from rlt.contract.layout import atomic_write_json

    layout = ctx.layout
    record = layout.outputs_record
    pushed: dict[str, str] = {}
    for name, uri, kind in todo:
        previous = json.loads(record.read_text()) if record.exists() else {}
        if previous.get(name) == pushed_uri(uri, kind):
            continue  # pushed by an earlier attempt of this stage
        local = layout.product(stage)
        pushed[name] = push(local, uri, kind, hub_api)
        atomic_write_json(record, {**previous, name: pushed[name]})  # after each push: a retry redoes only the rest
        log.info("outputs: %s -> %s", local, pushed[name])
        print(f"[{stage}] pushed {name} -> {pushed[name]}", flush=True)
    return pushed
