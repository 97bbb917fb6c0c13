"""The ground floor every other part reads, the operator's pod included: the API identity and phases, the stage
table, the run's layout on the volume, exit codes, the metric catalogue and where a stage's outputs go. It imports
nothing else of rlt."""
