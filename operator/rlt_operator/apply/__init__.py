"""The child-write path: which objects are the run's (`writes`), the server-side dry-run before any create
(`dry_run`, `admission`; `server_check` for `rlt validate --server`), the failure's evidence kept before a delete
(`evidence`), and sending a decision's writes (`send`). Above `cluster`; the reconcile loop and the handlers above it."""
