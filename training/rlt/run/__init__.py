"""A run on disk and its bookkeeping: the runner, the run layout, fingerprints, outputs, tracking, metrics, plots,
models, comparison reports, exit codes."""
