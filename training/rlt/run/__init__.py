"""The laptop's top floor: `rlt run` (runner; it also holds the pod's stage entry), comparison reports, plots and
the run-folder lock."""
