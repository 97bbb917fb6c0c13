"""Each stage's plan terms, one module per stage named after it (rlt.contract.stage_registry.STAGE_TERMS), each
with a TERMS following rlt.checks.plan_terms.StageTerms; `trainer` holds what the Trainer stages share."""
