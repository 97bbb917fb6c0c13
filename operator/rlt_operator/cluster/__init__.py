"""The operator process and the API server: its client (`kube`, `api_session`), its Events (`events`), its
permissions (`rbac`), which replica acts (`leader`, `peering`, `peering_watch`), its own series
(`operator_metrics`) and what its handlers share (`state`). Imports `config`, `builders` and `status` below it."""
