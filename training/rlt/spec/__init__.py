"""The RLTRun resource: its model (split by part: inputs, stages, resources, tracking and outputs, the run), loading
and error messages, budgets, and the fingerprint of what each stage read. Checks that need data, formats or models
are in rlt.checks."""
