"""The RLTRun API identity (group, version, kind) and the base every spec model shares."""

from __future__ import annotations

from enum import Enum

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

API_GROUP = "rlt.dev"
API_VERSION = "v1alpha1"
GROUP_VERSION = f"{API_GROUP}/{API_VERSION}"  # an RLTRun's apiVersion
KIND = "RLTRun"
PLURAL = "rltruns"
SHORT_NAME = "rlt"


class StrEnum(str, Enum):
    """enum.StrEnum (Python 3.11) for 3.10 too: a member is its value wherever a string is expected."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


class Phase(StrEnum):
    """status.phase of an RLTRun (the operator's status, its CRD and the rlt_run_phase metric read this one list)."""

    PENDING = "Pending"
    RUNNING = "Running"
    SUSPENDED = "Suspended"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


TERMINAL_PHASES = frozenset({Phase.SUCCEEDED, Phase.FAILED})

# Keys the distill stage writes itself (spec.dataset.keepColumns may not reuse them).
DISTILL_ROW_KEYS = frozenset(
    {
        "question",
        "reasoning_trace",
        "solution",
        "reward",
        "closed",
        "candidate_rewards",
        "source_row",
        "messages",
        "candidates",
    }
)


class Strict(BaseModel):
    """Base: camelCase aliases, unknown fields rejected, assignments validated, and types as strict as the API
    server's for the CRD's integer, number and boolean fields: no quoted numbers or booleans, no infinity or NaN."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        validate_assignment=True,
        strict=True,
        allow_inf_nan=False,
    )


# --------------------------------------------------------------------------- models and data
