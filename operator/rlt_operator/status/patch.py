"""Reading the server's status into the typed model and writing it back: a merge patch of the fields that
changed, and progress-only changes written on a slower cadence."""

from __future__ import annotations

import datetime as dt
from typing import Any

from rlt.contract.layout import parse_time
from rlt_operator.status import model as status_model
from rlt_operator.status.model import ConditionType, RLTRunStatus


def previous_status(prev: dict[str, Any]) -> RLTRunStatus:
    """The typed status of what the server (or our last write) holds: fields the model does not know, and condition
    types no longer in use (an older operator's), are dropped rather than failing every reconcile."""
    known = {k: v for k, v in prev.items() if k in OWN_STATUS_FIELDS}
    conds = known.get("conditions") or []
    known["conditions"] = [dict(c) for c in conds if c.get("type") in set(ConditionType)]
    return RLTRunStatus.model_validate(known)


OWN_STATUS_FIELDS = tuple(f.alias or name for name, f in status_model.RLTRunStatus.model_fields.items())


# Progress fields that change at every read (its time, the token rate): alone, written at most every
# PROGRESS_WRITE_SECONDS, so that a watch (`kubectl get rlt -w`) gets a line when something visible changed.
QUIET_PROGRESS = ("updateTime", "tokensPerSecond")
PROGRESS_WRITE_SECONDS = 120.0


def status_patch(prev: dict[str, Any], new: dict[str, Any], now: dt.datetime) -> dict[str, Any]:
    """The status write from `prev` (the server's) to `new`: merge_patch, or nothing while only the progress's read
    time or token rate changed and the server's progress is younger than PROGRESS_WRITE_SECONDS."""
    patch = merge_patch(prev, new)
    if set(patch) != {"progress"}:
        return patch
    before, after = prev.get("progress") or {}, new.get("progress") or {}
    written = parse_time(before.get("updateTime"))

    def loud(p: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in p.items() if k not in QUIET_PROGRESS}

    if loud(before) == loud(after) and written and (now - written).total_seconds() < PROGRESS_WRITE_SECONDS:
        return {}
    return patch


def merge_patch(prev: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """The JSON merge patch from `prev` to `new` at the top level (None removes one of our fields)."""
    patch = {k: v for k, v in new.items() if prev.get(k) != v}
    for k, v in patch.items():  # a merge patch merges maps: a key gone from a map of ours is removed explicitly
        if isinstance(v, dict) and isinstance(prev.get(k), dict):
            patch[k] = {**{gone: None for gone in prev[k] if gone not in v}, **v}
    for k in prev:
        if k not in new and k in OWN_STATUS_FIELDS:
            patch[k] = None
    return patch
