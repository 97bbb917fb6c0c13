"""Where a run's results go besides its volume: experiment tracking and output copies."""

from __future__ import annotations

import posixpath
import re
from typing import Literal

from pydantic import Field, model_validator

from rlt.contract.api import (
    Strict,
)
from rlt.spec.resources import (
    SecretEnvVar,
    SecretKeyRef,
)


class WandbSpec(Strict):
    """Weights & Biases through transformers' WandbCallback (plus the rlt_* figures)."""

    project: str = Field(min_length=1, max_length=128, description="W&B project (WANDB_PROJECT; none of / \\ # ? % :).")
    entity: str | None = Field(None, min_length=1, description="W&B entity (team or user).")
    mode: Literal["online", "offline"] = Field(
        "online", description="offline: write runs under the run's folder (tracking/wandb) for `wandb sync` later."
    )
    api_key_secret: SecretKeyRef | None = Field(
        None,
        description="Secret key holding WANDB_API_KEY: required in online mode unless spec.env sets WANDB_API_KEY "
        "from a Secret.",
    )

    @model_validator(mode="after")
    def _project_name(self) -> WandbSpec:
        # wandb's own Settings.validate_project (tests/unit/test_door_round4.py holds the two equal)
        bad = sorted({c for c in self.project if c in _WANDB_PROJECT_FORBIDDEN})
        if bad:
            raise ValueError(f"project: {self.project!r} holds {' '.join(bad)}, which W&B refuses in a project name")
        return self


class MlflowSpec(Strict):
    """MLflow through transformers' MLflowCallback (plus the rlt_* figures)."""

    tracking_uri: str | None = Field(
        None,
        description="MLflow tracking server URL (no credentials in it) or file store path; default: a file "
        "store in the run's folder (tracking/mlruns).",
    )
    experiment: str | None = Field(None, description="Experiment name (default: the run's name).")
    credentials: list[SecretEnvVar] = Field(
        default_factory=list,
        description="Environment from Secrets, e.g. MLFLOW_TRACKING_TOKEN or MLFLOW_TRACKING_USERNAME/PASSWORD.",
    )

    @model_validator(mode="after")
    def _no_inline_credentials(self) -> MlflowSpec:
        if self.tracking_uri:
            problem = tracking_uri_problem(self.tracking_uri)
            if problem:
                raise ValueError(f"trackingUri: {problem}")
        return self


_WANDB_PROJECT_FORBIDDEN = frozenset("/\\#?%:")
# The tracking stores mlflow-skinny (the trainer image's MLflow) registers: a path or file:, a tracking server over
# HTTP(S), Databricks. Database stores (sqlite:, postgresql:, ...) need the full mlflow and SQLAlchemy.
MLFLOW_SCHEMES = ("", "file", "http", "https", "databricks", "databricks-uc", "uc")
_SECRET_WORDS = re.compile(r"token|passw|pwd|secret|key|auth|credential|signature|session", re.IGNORECASE)


def tracking_uri_problem(uri: str) -> str | None:
    """Why MLflow cannot use `uri` from a pod, or why it must not be written into the run's ConfigMap."""
    from urllib.parse import parse_qsl, urlsplit

    try:
        parts = urlsplit(uri)
    except ValueError as err:
        return f"{uri[:60]!r} is not a URL ({err})"
    if parts.scheme.lower() not in MLFLOW_SCHEMES:
        return (
            f"scheme {parts.scheme!r} is not a tracking store MLflow (mlflow-skinny) serves; use one of "
            + ", ".join(f"{s}:" for s in MLFLOW_SCHEMES if s)
            + " or a path"
        )
    fix = "it would land in the run's ConfigMap; use a Secret (credentials: MLFLOW_TRACKING_TOKEN, ...)"
    if "@" in parts.netloc:
        return f"the URL carries a user or password; {fix}"
    secret = [k for k, _ in parse_qsl(parts.query, keep_blank_values=True) if _SECRET_WORDS.search(k)]
    if secret:
        return f"the URL's query holds a credential ({', '.join(secret)}); {fix}"
    return None


class TrackingSpec(Strict):
    """Experiment tracking: the trainers' own report_to integrations; every rlt_* figure is logged there too,
    under its Prometheus metric name (labelled ones as name/label-value)."""

    tensorboard: bool = Field(
        False, description="TensorBoard event files under the run's folder (tracking/tensorboard/<stage>)."
    )
    wandb: WandbSpec | None = Field(None, description="Weights & Biases.")
    mlflow: MlflowSpec | None = Field(None, description="MLflow.")

    def report_to(self) -> list[str]:
        """transformers' report_to names, in a fixed order."""
        return [
            name
            for name, on in (
                ("tensorboard", self.tensorboard),
                ("wandb", self.wandb is not None),
                ("mlflow", self.mlflow is not None),
            )
            if on
        ]


_OUTPUT_URI = re.compile(r"^(s3|gs|gcs|file|memory|hf)://\S+$")


class OutputsSpec(Strict):
    """Copies of the run's results outside the volume, pushed after the stage that produces each: object storage
    through fsspec (s3://, gs://) or the Hugging Face Hub (hf://<org>/<model>, hf://datasets/<org>/<name>;
    token from spec.hfTokenSecret)."""

    distill_dataset: str | None = Field(
        None,
        description="Where the distillation dataset goes (a folder/prefix; "
        "dataset.jsonl is written under it) or a hub dataset repo.",
    )
    teacher: str | None = Field(None, description="Where the final teacher (merged when LoRA) goes.")
    student: str | None = Field(None, description="Where the distilled student goes.")
    credentials: list[SecretEnvVar] = Field(
        default_factory=list,
        description="Environment from Secrets for the storage, e.g. AWS_ACCESS_KEY_ID and "
        "AWS_SECRET_ACCESS_KEY (s3fs) or GOOGLE_APPLICATION_CREDENTIALS' JSON via GOOGLE_CREDENTIALS (gcsfs).",
    )

    @model_validator(mode="after")
    def _uris(self) -> OutputsSpec:
        for field, alias in (("distill_dataset", "distillDataset"), ("teacher", "teacher"), ("student", "student")):
            uri = getattr(self, field)
            if uri is None:
                continue
            if not _OUTPUT_URI.fullmatch(uri):  # `$` alone lets a final newline through
                raise ValueError(
                    f"{alias}: {uri!r} is not s3://, gs://, file://, memory:// or hf:// followed by a path"
                )
            bucket_problem = _bucket_problem(uri)
            if bucket_problem:
                raise ValueError(f"{alias}: {uri!r}: {bucket_problem}")
            if uri.startswith("hf://"):
                parts = uri.removeprefix("hf://").strip("/").split("/")
                dataset = parts[0] == "datasets"
                if (field == "distill_dataset") != dataset or len(parts) != (3 if dataset else 2):
                    want = "hf://datasets/<org>/<name>" if field == "distill_dataset" else "hf://<org>/<name>"
                    raise ValueError(f"{alias}: {uri!r} must look like {want}")
        given = [
            (alias, getattr(self, f))
            for f, alias in (("distill_dataset", "distillDataset"), ("teacher", "teacher"), ("student", "student"))
            if getattr(self, f)
        ]
        for i, (a, first) in enumerate(given):
            for b, second in given[i + 1 :]:
                x, y = output_place(first), output_place(second)
                if x.startswith(y) or y.startswith(x):  # one push would overwrite or nest in the other
                    raise ValueError(f"{b}: {second!r} is {a}'s place too ({a}: {first!r}); give each output its own")
        return self


def output_place(uri: str) -> str:
    """Where an output URI writes, spelled one way (ending in '/'), so that two spellings of one place compare equal:
    gcs:// is gs:// (gcsfs takes both), a file:// or memory:// path is normalised as the filesystem resolves it
    ('//', '.', '..'), and a Hub repo id is compared without case (the Hub's repo ids are case-insensitive)."""
    scheme, _, rest = uri.partition("://")
    scheme = "gs" if scheme == "gcs" else scheme
    if scheme in ("file", "memory"):
        rest = posixpath.normpath(("/" + rest.lstrip("/")) if rest.startswith("/") else rest)
    elif scheme == "hf":
        rest = rest.casefold()
    return f"{scheme}://{rest.rstrip('/')}/"


_S3_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_GCS_BUCKET = re.compile(r"^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$")
_IP_ADDRESS = re.compile(r"^\d+\.\d+\.\d+\.\d+$")


def _bucket_problem(uri: str) -> str | None:
    """The bucket of an s3:// or gs:// URI by the store's naming rules (AWS S3 "General purpose bucket naming
    rules"; Google Cloud Storage "Bucket names"), None when it follows them or the URI names no bucket."""
    scheme, _, rest = uri.partition("://")
    bucket = rest.split("/", 1)[0]
    if scheme == "s3":
        if not _S3_BUCKET.fullmatch(bucket) or ".." in bucket or _IP_ADDRESS.fullmatch(bucket):
            return (
                f"{bucket!r} is not an S3 bucket name (3-63 lowercase letters, digits, '.' and '-', a letter or digit "
                "at both ends, no '..', not an IP address)"
            )
        if bucket.startswith(("xn--", "sthree-", "amzn-s3-demo-")) or bucket.endswith(
            ("-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3")
        ):
            return f"{bucket!r} uses a prefix or suffix S3 reserves"
    if scheme in ("gs", "gcs"):
        parts = bucket.split(".")
        if (
            not _GCS_BUCKET.fullmatch(bucket)
            or any(not 0 < len(p) <= 63 for p in parts)
            or ("." not in bucket and len(bucket) > 63)
            or _IP_ADDRESS.fullmatch(bucket)
            or bucket.startswith("goog")
            or "google" in bucket
        ):
            return (
                f"{bucket!r} is not a Cloud Storage bucket name (3-63 lowercase letters, digits, '-', '_' and '.', "
                "up to 222 with dots, a letter or digit at both ends, not an IP address, no 'goog' prefix or 'google')"
            )
    return None
