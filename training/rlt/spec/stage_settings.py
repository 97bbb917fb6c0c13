"""What every stage's settings model answers about itself (StageSettings), and the CEL parts its rules are made of:
the code reading a spec asks the stage instead of naming it."""

from __future__ import annotations

from typing import Any, NamedTuple

from rlt.contract.api import Strict
from rlt.spec.resources import TrainerResources


class Rollout(NamedTuple):
    """One generation round of a stage: sequences it decodes, tokens each decodes at most, and how long it first
    waits for a generator server (0: it generates in process)."""

    sequences: int
    tokens: int
    server_wait: int


def stage_value(stage: str, field: str, default: Any) -> str:
    """A stage setting in CEL, or its default when the stage is absent (the apiserver defaults present objects only)."""
    return f"(has(self.stages) && has(self.stages.{stage}) ? self.stages.{stage}.{field} : {default!r})".replace(
        "True", "true"
    ).replace("False", "false")


# The trainer processes of a Trainer stage's gang: nodes × GPUs (one process on a CPU pod), as in CEL. Beyond
# WORLD_BOUND nodes or GPUs the rule stands aside (no int64 overflow in the API server; the model still checks).
WORLD_BOUND = 1_000_000


def trainer_value(field: str) -> str:
    default = TrainerResources.model_fields[field].default
    return f"(has(self.resources) && has(self.resources.trainer) ? self.resources.trainer.{field} : {default})"


CelRule = tuple[str, ...]  # (CEL rule, message[, field path]): rlt.spec.k8s.cel_rules


class StageSettings(Strict):
    """What every stage's settings model answers about itself, so that the code reading a spec asks the stage
    instead of naming it: its generation round (the collective timeouts, rlt.spec.budgets) and its rules across
    the run's other fields (RLTRunSpec's validation). `spec` is the RLTRunSpec (rlt.spec.run, a floor above)."""

    def rollout(self, spec: Any) -> Rollout | None:
        """The stage's generation round; None when it generates nothing."""
        return None

    def run_problems(self, name: str, spec: Any) -> list[str]:
        """What is wrong with stage `name`'s settings given the rest of `spec`, one line each naming the field."""
        return []

    @classmethod
    def run_cel_rules(cls, name: str) -> list[CelRule]:
        """The same rules as CEL on the run's spec (`self` is the spec), for the CRD (rlt.spec.k8s.cel_rules)."""
        return []

    def training_rows_problem(self, rows: int, source: str) -> str | None:
        """What is wrong with training on `rows` usable rows of spec.dataset (`source`); None when nothing is."""
        return None

    def named_models(self, name: str) -> list[tuple[str, Any]]:
        """The models stage `name`'s own settings name, as (spec field, rlt.spec.inputs.ModelRef); the run's list
        is RLTRunSpec.named_models."""
        return []

    def named_datasets(self, name: str) -> list[tuple[str, Any]]:
        """The datasets its own settings name, as (spec field, rlt.spec.inputs.DatasetSpec)."""
        return []
