"""rlt_operator: the Kopf operator that reconciles RLTRun resources.

Floors, bottom up; a module imports its own floor and the ones below, never above (hack/import_graph.py):
`config` (kinds, settings), `builders` (spec → manifests, pure), `status` (children → status, pure), `crd`,
`cluster` (the process and the API server), `apply` (the child writes), then `reconcile`, `handlers` and `cli`."""
