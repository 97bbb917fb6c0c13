"""The typed RLTRun status: what the operator writes, and the source of the CRD's status schema.

A real API server prunes every status field its CRD schema does not list. Generating the schema from
this model, and checking every status `status.decide` returns against the model (unknown fields are
an error), keeps the two from drifting apart.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema, field_validator
from pydantic.alias_generators import to_camel

from rlt.contract.api import Phase, StrEnum

DATE_TIME: dict[str, Any] = {"format": "date-time"}  # a pydantic JsonDict


class ConditionType(StrEnum):
    """The run's condition types, one entry each in status.conditions (docs/operator.md says what each means)."""

    READY = "Ready"
    SPEC_VALID = "SpecValid"
    SPEC_APPLIED = "SpecApplied"
    CHILDREN_VALID = "ChildrenValid"
    CHILDREN_WRITTEN = "ChildrenWritten"
    CAPACITY_OK = "CapacityOK"
    VOLUME_READY = "VolumeReady"
    PODS_SCHEDULABLE = "PodsSchedulable"
    PODS_HEALTHY = "PodsHealthy"
    GENERATORS_READY = "GeneratorsReady"
    TRAINER_RUNNING = "TrainerRunning"
    STAGES_CURRENT = "StagesCurrent"
    SUSPENDED = "Suspended"
    COMPLETE = "Complete"
    FAILED = "Failed"


class _Status(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


class Condition(_Status):
    """A condition of the run (metav1.Condition without observedGeneration)."""

    # Checked against the enum when the operator writes it; a plain string in the CRD (as in metav1.Condition),
    # so that a type added or dropped later never makes a stored status invalid.
    type: Annotated[ConditionType, WithJsonSchema({"type": "string"})] = Field(
        description=", ".join(ConditionType) + "."
    )
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str | None = Field(None, description="CamelCase reason.")
    message: str | None = Field(None, description="Human-readable detail.")
    last_transition_time: str | None = Field(None, description="When status last changed.", json_schema_extra=DATE_TIME)


class Progress(_Status):
    """Read from the trainer's metrics endpoint at a bounded rate."""

    step: int | None = Field(None, description="Optimizer step of the running stage.")
    total_steps: int | None = Field(None, description="Steps the running stage will take.")
    step_of_total: str | None = Field(None, description="step/totalSteps (the Step column of `kubectl get rlt`).")
    reward_mean: float | None = Field(None, description="Mean reward of the last step.")
    tokens_per_second: float | None = Field(None, description="Generated tokens per second between two reads.")
    last_checkpoint: str | None = Field(None, description="Path of the newest checkpoint on the run's volume.")
    update_time: str | None = Field(None, description="When progress was read.", json_schema_extra=DATE_TIME)
    step_time: str | None = Field(
        None,
        description="When the step last changed (the RLTRunStalled alert's clock; kept across operator restarts).",
        json_schema_extra=DATE_TIME,
    )


class Outputs(_Status):
    """Paths on the run's volume, listed once the stage that writes them has finished."""

    teacher_checkpoint: str | None = Field(None, description="Final teacher model on the run's volume.")
    distilled_dataset: str | None = Field(None, description="Distillation dataset (JSONL) on the run's volume.")
    student_checkpoint: str | None = Field(None, description="Distilled student model on the run's volume.")
    teacher_uri: str | None = Field(None, description="Where spec.outputs.teacher pushes the final teacher.")
    distilled_dataset_uri: str | None = Field(
        None, description="Where spec.outputs.distillDataset pushes the distillation dataset."
    )
    student_uri: str | None = Field(None, description="Where spec.outputs.student pushes the distilled student.")


class TrainerShape(_Status):
    """The trainer shape the running stage uses (frozen once the stage has a checkpoint)."""

    stage: str = Field(description="The stage this shape belongs to.")
    nodes: int = Field(description="Trainer pods (one per node).")
    gpus: int = Field(description="GPUs per trainer pod.")


class StageSpec(_Status):
    """The spec a finished stage ran under (recorded when its Job completed), to report later edits."""

    fingerprint: str = Field(description="rlt.spec.fingerprint.stage_fingerprint of the fields below.")
    # One JSON string, not a map: `kubectl describe rlt` prints a map one line per entry (~60 per stage).
    fields: str = Field(
        description="The fields the stage's output depends on, as one JSON object (dotted spec path -> value), so "
        "that an edit can be named."
    )

    @field_validator("fields", mode="before")
    @classmethod
    def _from_map(cls, value: Any) -> Any:
        """An older operator wrote a map of path -> value as JSON: read it as the one JSON object."""
        if isinstance(value, dict):
            return json.dumps({k: json.loads(v) for k, v in value.items()}, sort_keys=True)
        return value

    def values(self) -> dict[str, Any]:
        return dict(json.loads(self.fields))


class RLTRunStatus(_Status):
    """Written by the operator; recomputed from the run's children on every reconcile."""

    phase: Phase | None = Field(None, description=", ".join(Phase) + ".")
    stage: str | None = Field(
        None,
        description="Stage now running (sft, rl, distill, student, evaluate); for a Failed run, the stage that "
        "failed; empty when the run succeeded.",
    )
    reason: str | None = Field(
        None,
        description="Why the run is in its phase or held (e.g. InvalidSpec, "
        "Unschedulable, ConfigError, BackoffLimitExceeded, ReplacementLimitExceeded, "
        "DeadlineExceeded).",
    )
    message: str | None = Field(None, description="Detail for reason; names the field for an invalid spec.")
    last_failure: str | None = Field(None, description="The last failure that caused a gang restart.")
    last_failed_pod: str | None = Field(
        None,
        description="The last failed gang's failed trainer pod, kept for its logs (`kubectl logs <pod> -c <container>`, the container named in the Events and in "
        "<run>-last-failure): owned by "
        "the run, deleted with it or when a newer failed pod is kept (one per run).",
    )
    backoff_until: str | None = Field(
        None,
        description="After a failed gang, the next one is not created before this time (back-off: 10 s, doubling "
        "with each counted failure, at most 5 min; none after a disruption).",
        json_schema_extra=DATE_TIME,
    )
    observed_generation: int | None = Field(None, description="metadata.generation last reconciled.")
    restarts: int | None = Field(
        None,
        description="Gang restarts so far (those caused by neither disruptions nor re-placements are bounded by "
        "spec.backoffLimit).",
    )
    disruptions: int | None = Field(
        None,
        description="Gang restarts caused by disruptions (preemption, node "
        "drain, eviction); not counted against spec.backoffLimit.",
    )
    replacements: int | None = Field(
        None,
        description="Gang restarts that released a ReadWriteOnce gang to be placed again together (a trainer that "
        "could not join the generators' node); bounded by spec.replacementLimit, not counted against "
        "spec.backoffLimit.",
    )
    start_time: str | None = Field(None, description="When the run last started.", json_schema_extra=DATE_TIME)
    completion_time: str | None = Field(None, description="When it became terminal.", json_schema_extra=DATE_TIME)
    completed_stages: list[str] | None = Field(None, description="Stages whose Job completed.")
    stage_specs: dict[str, StageSpec] | None = Field(
        None,
        description="Per finished stage, the spec it finished under; a later edit of those fields is "
        "reported (condition StagesCurrent, Event FinishedStageEdited), not applied.",
    )
    progress: Progress | None = None
    trainer_shape: TrainerShape | None = Field(None, description="nodes x gpus of the running stage's trainer.")
    outputs: Outputs | None = None
    conditions: list[Condition] | None = Field(None, description="Current state, one entry per type.")


def check(status: dict[str, Any]) -> None:
    """Raise if `status` holds a field the CRD would prune (or a wrong type)."""
    RLTRunStatus.model_validate(status)
