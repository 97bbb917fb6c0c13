"""The RLTRun API identity (group, version, kind) and the base every spec model shares."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

API_GROUP = "rlt.dev"
API_VERSION = "v1alpha1"
KIND = "RLTRun"
PLURAL = "rltruns"
SHORT_NAME = "rlt"

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
    """Base: camelCase aliases, unknown fields rejected, assignments validated."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        validate_assignment=True,
    )


# --------------------------------------------------------------------------- models and data
