"""Where a run's results go besides its volume: experiment tracking and output copies."""

from __future__ import annotations

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

    project: str = Field(min_length=1, description="W&B project (WANDB_PROJECT).")
    entity: str | None = Field(None, description="W&B entity (team or user).")
    mode: Literal["online", "offline"] = Field(
        "online", description="offline: write runs under the run's folder (tracking/wandb) for `wandb sync` later."
    )
    api_key_secret: SecretKeyRef | None = Field(None, description="Secret key holding WANDB_API_KEY (online mode).")


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
        if self.tracking_uri and re.match(r"^[a-z+]+://[^/@]+@", self.tracking_uri):
            raise ValueError(
                "trackingUri: credentials in the URL would land in the ConfigMap; use credentials "
                "(Secret references) instead"
            )
        return self


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
            if uri.startswith("hf://"):
                parts = uri.removeprefix("hf://").strip("/").split("/")
                dataset = parts[0] == "datasets"
                if (field == "distill_dataset") != dataset or len(parts) != (3 if dataset else 2):
                    want = "hf://datasets/<org>/<name>" if field == "distill_dataset" else "hf://<org>/<name>"
                    raise ValueError(f"{alias}: {uri!r} must look like {want}")
        return self
