"""The sft stage's plan terms: a Trainer stage on spec.teacher, rows of maxLength, dealt across the ranks by tokens
(rlt.stages.sft_balance), as TrainerTerms plans every sft-like stage."""

from __future__ import annotations

from dataclasses import dataclass

from rlt.checks.stage_terms.trainer import TrainerTerms


@dataclass(frozen=True)
class SftTerms(TrainerTerms):
    pass


TERMS = SftTerms("sft")
