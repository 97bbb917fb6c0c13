"""Checks of a run that need more than its model: validation (data, formats, the rcl protocol), model shapes, the
capacity plan, and the pod's preflight."""
