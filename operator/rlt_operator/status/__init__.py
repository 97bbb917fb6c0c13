"""Children → status, pure: what the operator sees of a run's children (`observed`, `progress`), the typed status
(`model`), and `decide.decide()`, which computes the new status, the child writes and the Events in named steps
(`conditions`, `decision`, `gang`, `gang_steps`, `records`, `events`, `patch`). No writes to the API server; imports
only `config` and `builders` of the operator."""
