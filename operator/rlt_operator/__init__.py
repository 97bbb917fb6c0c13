"""rlt_operator: the Kopf operator that reconciles RLTRun resources."""
