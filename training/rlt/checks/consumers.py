"""Each value checked by the rules of what consumes it, where the spec model cannot see them: hub ids by the hub
library's own validator, W&B's key where online mode needs it, file:// outputs off the run's own volume, and the
sizes of what the operator creates from the run (the run's YAML in the ConfigMap and in the trainer pods'
RLT_RUN_YAML, a pod's annotations, one env value) against the limits of the API server and of Linux' execve.
Every line names the spec field to change."""

from __future__ import annotations

import json
import posixpath
from pathlib import Path
from typing import Any

from rlt.contract.env import RUN_YAML
from rlt.contract.layout import PVC_MOUNT
from rlt.contract.outputs import RUN_PRODUCTS
from rlt.spec.loading import dump_run
from rlt.spec.run import Metadata, RLTRun, RLTRunSpec
from rlt.spec.tracking_outputs import output_place

# --------------------------------------------------------------------------------------------------- hub ids

_LOCAL_STARTS = ("/", "./", "../", "~")
_DATA_FILES = (".jsonl", ".json", ".parquet", ".csv")


def _hub_id_problem(repo_id: str, revision_field: str | None = "revision") -> str | None:
    """huggingface_hub's own refusal of `repo_id` (None when it takes it, or when the hub library is not installed:
    the operator's image has none, the pods' loaders apply the same validator)."""
    try:
        from huggingface_hub.errors import HFValidationError
        from huggingface_hub.utils import validate_repo_id  # type: ignore[attr-defined]  # re-exported lazily
    except ImportError:
        return None
    if "@" in repo_id:
        if revision_field is None:  # an output: pushed to the repo's main branch, no field names a revision
            return f"{repo_id!r} writes a revision into the id; an output is pushed to the repo's main branch: drop it"
        return (
            f"{repo_id!r} writes a revision into the id; give the id and set {revision_field}: "
            f"{repo_id.split('@', 1)[1]!r}"
        )
    try:
        validate_repo_id(repo_id)
    except HFValidationError as err:
        return f"{repo_id!r} is not a Hugging Face repo id ({str(err).splitlines()[0]})"
    return None


def _is_local(name: str, local_files: bool) -> bool:
    """A path, as transformers reads it: an existing folder is local; anything else is taken for a hub id."""
    return name.startswith(_LOCAL_STARTS) or (local_files and Path(name).exists())


def hub_id_problems(spec: RLTRunSpec, local_files: bool = True) -> list[str]:
    """Every model or dataset field that names a hub repo, and every hf:// output, by the hub's repo-id rules."""
    out = []
    for where, ref in ((f"{w}.model", ref) for w, ref, _ in spec.named_models()):
        if ref.model.startswith("builtin:") or "://" in ref.model:
            continue  # built-ins and URLs: rlt.checks.validation.source_problems
        if not _is_local(ref.model, local_files):
            problem = _hub_id_problem(ref.model, where.rsplit(".", 1)[0] + ".revision")
            if problem:
                out.append(f"{where}: {problem} (or a local folder: /abs/path or ./relative)")
    for where, ds in ((f"{w}.source", ds) for w, ds, _ in spec.named_datasets()):
        source = ds.source
        # a data file's name (train.jsonl) is a path wherever it is read; the rest loads from the hub by id
        if source.startswith("builtin:") or "://" in source or source.endswith(_DATA_FILES):
            continue
        if not _is_local(source, local_files):
            problem = _hub_id_problem(source, where.rsplit(".", 1)[0] + ".revision")
            if problem:
                out.append(f"{where}: {problem} (or a local file or folder: /abs/path or ./relative)")
    for product in RUN_PRODUCTS:
        uri = getattr(spec.outputs, product.attr)
        if uri and uri.startswith("hf://"):
            repo = uri.removeprefix("hf://").strip("/").removeprefix("datasets/")
            problem = _hub_id_problem(repo, None)
            if problem:
                out.append(f"spec.outputs.{product.output}: {problem}")
    return out


def output_volume_problems(spec: RLTRunSpec, name: str | None) -> list[str]:
    """An output is a copy off the run's volume: a file:// destination on the volume the pods mount at PVC_MOUNT
    (inside the run's own folder PVC_MOUNT/<name>, or beside it) would copy the run's results into the volume they
    are on, nested in or over the run's own files, and gone with the volume."""
    out = []
    run_folder = posixpath.join(PVC_MOUNT, name) if name else None
    for product in RUN_PRODUCTS:
        uri = getattr(spec.outputs, product.attr)
        if not uri or not uri.startswith("file://"):
            continue
        path = output_place(uri).removeprefix("file://")
        if not path.startswith(PVC_MOUNT.rstrip("/") + "/"):
            continue
        if run_folder and path.startswith(run_folder + "/"):
            where = f"inside the run's own folder {run_folder} (metadata.name: {name})"
        else:
            where = f"on the run's own volume (mounted at {PVC_MOUNT} in its pods)"
        out.append(
            f"spec.outputs.{product.output}: {uri!r} is {where}; an output is a copy off the volume: give a path "
            f"outside {PVC_MOUNT} (another volume) or an object store (s3://, gs://, hf://)"
        )
    return out


# --------------------------------------------------------------------------------------------------- tracking


def wandb_key_problems(spec: RLTRunSpec) -> list[str]:
    """W&B online mode logs in with WANDB_API_KEY: without it every trainer pod stops at wandb.init."""
    wandb = spec.tracking.wandb
    if wandb is None or wandb.mode != "online" or wandb.api_key_secret is not None:
        return []
    for i, var in enumerate(spec.env):
        if var.name == "WANDB_API_KEY":
            if var.value_from is not None and var.value_from.secret_key_ref is not None:
                return []
            return [f"spec.env.{i}: WANDB_API_KEY must come from a Secret (valueFrom.secretKeyRef), not the spec"]
    return [
        "spec.tracking.wandb.apiKeySecret: online mode needs a W&B key; name the Secret holding WANDB_API_KEY "
        "(or use mode: offline)"
    ]


# --------------------------------------------------------------------------------------------------- sizes

MAX_CONFIGMAP = 1024 * 1024  # the API server's bound on a ConfigMap's data (keys and values)
MAX_ANNOTATIONS = 256 * 1024  # ... on an object's annotations in all (keys and values)
# Linux' MAX_ARG_STRLEN (32 pages of 4 KiB): the longest one "NAME=value" string execve passes a process; a longer
# env var makes the container fail to start (E2BIG, "argument list too long").
MAX_ENV_STRING = 32 * 4096
# What the operator and the Job controller add to a pod's annotations (Prometheus scrape settings, the Job's
# completion index) and, in the run's YAML, the generator's URL: room kept for them.
RESERVED = 1024
CONFIG_KEY = "run.yaml"


def _size(node: Any) -> int:
    return len(json.dumps(node, ensure_ascii=False).encode())


def largest_field(node: Any, path: str) -> str:
    """The field that holds most of `node`'s bytes: down the largest child while it holds at least a quarter."""
    while isinstance(node, (dict, list)) and node:
        items = list(node.items()) if isinstance(node, dict) else list(enumerate(node))
        key, child = max(items, key=lambda kv: _size(kv[1]))
        if _size(child) * 4 < _size(node):
            break
        path, node = f"{path}.{key}", child
    return path


def size_problems(spec: RLTRunSpec, name: str, namespace: str | None) -> list[str]:
    """The children's sizes: the run's YAML (ConfigMap data; RLT_RUN_YAML in the trainer pods, one env string),
    the pods' annotations and each env value."""
    out = []
    # the ConfigMap's text as the operator writes it (rlt_operator.builders.run_children.pod_config: dump_run)
    text = dump_run(_as_run(spec, name, namespace))
    size = len(text.encode()) + RESERVED
    doc = spec.model_dump(mode="json", by_alias=True, exclude_none=True)
    for what, bound, used in (
        (f"{RUN_YAML.name} (one env var of the trainer pods)", MAX_ENV_STRING, size + len(RUN_YAML.name) + 2),
        ("the run's ConfigMap", MAX_CONFIGMAP, size + len(CONFIG_KEY)),
    ):
        if used > bound:
            out.append(
                f"{largest_field(doc, 'spec')}: the run's YAML makes {what} {used} bytes, over {bound}; "
                "keep large texts in files on the volume (format.file, dataset files)"
            )
    annotations = spec.scheduling.pod_annotations
    used = sum(len(k.encode()) + len(v.encode()) for k, v in annotations.items()) + RESERVED
    if used > MAX_ANNOTATIONS:
        key = max(annotations, key=lambda k: len(k.encode()) + len(annotations[k].encode()))
        out.append(
            f"spec.scheduling.podAnnotations.{key}: the pods' annotations come to {used} bytes with the operator's, "
            f"over the API server's {MAX_ANNOTATIONS}"
        )
    for i, var in enumerate(spec.env):
        if var.value is not None and len(var.name) + len(var.value.encode()) + 2 > MAX_ENV_STRING:
            out.append(
                f"spec.env.{i}.value: {len(var.value.encode())} bytes, over what one env var can hold "
                f"({MAX_ENV_STRING} bytes with its name, Linux' MAX_ARG_STRLEN)"
            )
    return out


def _as_run(spec: RLTRunSpec, name: str, namespace: str | None) -> RLTRun:
    from rlt.contract.api import GROUP_VERSION, KIND

    return RLTRun(apiVersion=GROUP_VERSION, kind=KIND, metadata=Metadata(name=name, namespace=namespace), spec=spec)


def consumer_problems(
    spec: RLTRunSpec, name: str | None, namespace: str | None = None, local_files: bool = True
) -> list[str]:
    """Every problem above, one line each."""
    out = hub_id_problems(spec, local_files) + wandb_key_problems(spec) + output_volume_problems(spec, name)
    if name is not None:
        out += size_problems(spec, name, namespace)
    return out
