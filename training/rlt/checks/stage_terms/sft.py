"""The sft stage's plan terms: a Trainer stage on spec.teacher, rows of maxLength (TrainerTerms as it is)."""

from __future__ import annotations

from rlt.checks.stage_terms.trainer import TrainerTerms

TERMS = TrainerTerms("sft")
