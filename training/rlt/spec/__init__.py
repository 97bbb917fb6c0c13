"""The RLTRun resource: its model (split by part: inputs, stages, resources, tracking and outputs, the run), the
stage table, loading and error messages, and the validation every entry point runs."""
