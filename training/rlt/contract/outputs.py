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
from pathlib import Path
from typing import Any, Protocol

from rlt.contract.env import HF_TOKEN
from rlt.contract.layout import DISTILL_DATASET_FILE, RunLayout
from rlt.contract.stage_registry import newest_teacher_stage, stage_info

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


def teacher_stage(spec: RunSpecView) -> str | None:
    """The stage whose model is the run's final teacher: the last enabled teacher stage."""
    return newest_teacher_stage(spec.stages.enabled())


def stage_outputs(spec: RunSpecView, stage: str) -> list[tuple[str, str, str]]:
    """(name, destination, kind) to push once `stage` has finished: what it produces (the stage table's
    `produces`), where spec.outputs names a destination for it; kind: a model folder or the dataset file."""
    out = []
    produces = stage_info(stage).produces
    if spec.outputs.teacher and stage == teacher_stage(spec):
        out.append(("teacher", spec.outputs.teacher, "model"))
    if spec.outputs.distill_dataset and produces == "dataset":
        out.append(("distillDataset", spec.outputs.distill_dataset, "dataset"))
    if spec.outputs.student and produces == "student":
        out.append(("student", spec.outputs.student, "model"))
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
        local = layout.distill_dataset if kind == "dataset" else layout.model_dir(stage)
        pushed[name] = push(local, uri, kind, hub_api)
        atomic_write_json(record, {**previous, name: pushed[name]})  # after each push: a retry redoes only the rest
        log.info("outputs: %s -> %s", local, pushed[name])
        print(f"[{stage}] pushed {name} -> {pushed[name]}", flush=True)
    return pushed
