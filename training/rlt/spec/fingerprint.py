"""What a finished stage remembers of the spec it finished under, and what a re-run does when the spec changed.

A stage's output depends on the run-wide fields (models, data, format, seed, method) and on its own and every earlier
stage's settings; it does not depend on how fast or where it ran (checkpoint cadence, ZeRO stage, micro-batching, the
generation backend) nor on what it logged (loggingSteps: recorded, never compared). `stage_fields` flattens the fields
that matter to `path: value` so that a change can be named; `stage_fingerprint` hashes them (distill's parts folder is
named by `compared_fingerprint`, the compared fields only). `changed_fields` compares two records (the operator's
status too). `plan_stages` decides per stage: run, skip (done under this spec), continue (more RL steps resume from the
last checkpoint), start over (an earlier stage was redone, or the user asked), or refuse with one line naming the
changed fields and the flag that starts the stage over.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from rlt.contract.layout import STAMP_FORMAT, RunLayout, atomic_write_json, atomic_write_text, format_time
from rlt.contract.method_registry import method_info
from rlt.contract.stage_registry import STAGE_ORDER, STAGES, stages_before
from rlt.spec.run import RLTRunSpec

RUN_WIDE = ("method", "teacher", "student", "dataset", "format", "seed")
# Settings of a stage that change speed, memory or placement but not what the stage produces.
NOT_AFFECTING = {
    "gradientCheckpointing",
    "uncheckpointedLayers",
    "saveSteps",
    "saveTotalLimit",
    "deepspeedZeroStage",
    "generation",
    "perDeviceBatchSize",
    "reward.batchSize",
    "reward.sharePrefix",
    "reward.maxBatchTokens",
}
# Without a Trainer, batchSize is how many rows are generated together: speed, not output.
NOT_AFFECTING_BY_STAGE = {s.name: {"batchSize"} for s in STAGES if not s.trainer}
# Changes a finished stage can absorb by training on (rlt.contract.stage_registry says which and why).
EXTENDABLE = {s.name: f"stages.{s.name}.{s.extendable}" for s in STAGES if s.extendable}
# Inside a block left out above, the settings that do change the output: rl's generation overlap and importance
# sampling change how off-policy its training rows are and how the loss weighs them.
AFFECTING_INSIDE = {"generation.overlap", "generation.importanceSampling", "generation.importanceSamplingCap"}
# Settings of a disabled stage that later stages still read (distill ranks and records its explanations by rl's
# reward, at rl's temperature, whether or not rl ran): the stage table says which.
READ_WHEN_DISABLED = {s.name: s.read_when_disabled for s in STAGES if s.read_when_disabled}
# What stage_fields counts, by version, written with each record: 2 added AFFECTING_INSIDE and READ_WHEN_DISABLED. A
# record of an earlier version is read as if it had the current value of each field counted since (it was not
# counted then, so nothing about it can have changed for that record).
COUNTED = 2
# Settings recorded with a stage that are no cause of its output: what it logged. They stay in the records (the
# fingerprint, and what an earlier rlt reads after a rollback, are those of before) but are never compared: an edit
# of one is no edit of a finished stage, nor of a stopped one.
NOT_COMPARED = ("loggingSteps",)
# Fields added after stages recorded their fingerprints, at the value that reproduces what those stages did: left out
# of the fields at that value, so a stage finished before the field existed is still current.
ADDED_AT_DEFAULT = {
    "stages.rl.lossType": "grpo",
    "stages.rl.generation.overlap": "none",
    "stages.rl.generation.importanceSampling": "off",
    "stages.rl.generation.importanceSamplingCap": 3.0,
}


class StaleStageError(ValueError):
    """A stage finished under a different spec and cannot simply continue; the message is one line. `stage` and
    `changes` (the changed fields, described) let a caller say what to do in its own terms (the pods' preflight)."""

    def __init__(self, message: str, stage: str = "", changes: str = ""):
        super().__init__(message)
        self.stage, self.changes = stage, changes


def _flatten(value: Any, prefix: str, out: dict[str, Any]) -> None:
    if isinstance(value, dict) and value:
        for key in sorted(value):
            _flatten(value[key], f"{prefix}.{key}" if prefix else key, out)
    else:
        out[prefix] = value


def flat_spec(spec: RLTRunSpec) -> dict[str, Any]:
    """Every field of the spec, flattened to camelCase paths (to name what an edit changed)."""
    out: dict[str, Any] = {}
    _flatten(spec.model_dump(mode="json", by_alias=True), "", out)
    return out


def _stage_settings(doc: dict[str, Any], stage: str, own: bool) -> dict[str, Any]:
    flat: dict[str, Any] = {}
    _flatten(doc["stages"][stage], "", flat)
    skip = NOT_AFFECTING | NOT_AFFECTING_BY_STAGE.get(stage, set())
    kept = {
        k: v for k, v in flat.items() if k in AFFECTING_INSIDE or not any(k == s or k.startswith(s + ".") for s in skip)
    }
    if own:
        kept.pop("enabled", None)  # it runs, so it is enabled
    elif not kept.get("enabled"):
        # a disabled earlier stage contributes that fact and the settings later stages read, where they are not the
        # defaults (a stage recorded before they were counted, at the defaults, stays current)
        read = READ_WHEN_DISABLED.get(stage, ())
        default = _default_flat(stage)
        kept = {"enabled": False} | {
            k: v
            for k, v in kept.items()
            if any(k == r or k.startswith(r + ".") for r in read) and v != default.get(k, "<unset>")
        }
    return {f"stages.{stage}.{k}": v for k, v in kept.items()}


@cache  # the defaults never change (callers only read the dict)
def _default_flat(stage: str) -> dict[str, Any]:
    """A stage's default settings, flattened as _stage_settings flattens them."""
    from rlt.spec.stages import Stages

    flat: dict[str, Any] = {}
    _flatten(Stages().model_dump(mode="json", by_alias=True)[stage], "", flat)
    return flat


def stage_fields(spec: RLTRunSpec, stage: str) -> dict[str, Any]:
    """The fields stage `stage`'s output depends on, flattened to camelCase paths ('stages.rl.steps': 3)."""
    doc = spec.model_dump(mode="json", by_alias=True)
    out: dict[str, Any] = {}
    settings = method_info(spec.method).settings  # the method's own settings (spec.rcl) shape every stage
    for key in RUN_WIDE + ((settings,) if settings else ()):
        _flatten(doc[key], key, out)
    for earlier in stages_before(stage):
        out.update(_stage_settings(doc, earlier, own=False))
    out.update(_stage_settings(doc, stage, own=True))
    return {k: v for k, v in out.items() if k not in ADDED_AT_DEFAULT or ADDED_AT_DEFAULT[k] != v}


def fingerprint_of(fields: object) -> str:  # any JSON value: a stage's fields, a list of questions
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]


def stage_fingerprint(spec: RLTRunSpec, stage: str) -> str:
    """A short hash of `stage_fields`: equal hashes, same stage output (for the operator's status)."""
    return fingerprint_of(stage_fields(spec, stage))


def is_compared(field: str) -> bool:
    return not (field.startswith("stages.") and field.rsplit(".", maxsplit=1)[-1] in NOT_COMPARED)


def compared_fingerprint(spec: RLTRunSpec, stage: str) -> str:
    """A short hash of the stage's compared fields: what names its work in progress (distill's part files), so an
    edit that leaves a finished stage current (loggingSteps) also keeps what an unfinished one has done."""
    return fingerprint_of({k: v for k, v in stage_fields(spec, stage).items() if is_compared(k)})


def changed_fields(old: dict[str, Any], new: dict[str, Any], compare_all: bool = False) -> list[str]:
    """The fields whose values differ, but those NOT_COMPARED (a finished stage is still current after their edit);
    `compare_all` names those too (a running gang does not apply them until it restarts)."""
    keys = (k for k in old.keys() | new.keys() if compare_all or is_compared(k))
    return sorted(k for k in keys if old.get(k, "<unset>") != new.get(k, "<unset>"))


def describe_changes(old: dict[str, Any], new: dict[str, Any], limit: int = 4, compare_all: bool = False) -> str:
    def show(v: Any) -> str:
        s = "<unset>" if v is None else json.dumps(v) if not isinstance(v, str) else v
        return s if len(s) <= 30 else s[:27] + "..."

    names = changed_fields(old, new, compare_all)
    parts = [f"{k} {show(old.get(k))} -> {show(new.get(k))}" for k in names[:limit]]
    if len(names) > limit:
        parts.append(f"and {len(names) - limit} more")
    return ", ".join(parts)


# --------------------------------------------------------------------------- what a finished stage recorded


def fingerprint_path(layout: RunLayout, stage: str) -> Path:
    return layout.stage_fingerprint(stage)


def record(layout: RunLayout, spec: RLTRunSpec, stage: str) -> None:
    """Written just before the stage's DONE marker."""
    fields = stage_fields(spec, stage)
    doc = {"fingerprint": fingerprint_of(fields), "fields": fields, "counted": COUNTED}
    atomic_write_json(fingerprint_path(layout, stage), doc)


def record_start(layout: RunLayout, spec: RLTRunSpec, stage: str) -> None:
    """Written as `rlt run` starts or resumes the stage: the fields its checkpoints are trained under."""
    path = layout.stage_started_spec(stage)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, {"fields": stage_fields(spec, stage), "counted": COUNTED})


def _counted_since(key: str, version: int) -> bool:
    """Is `key` a field stage_fields counts now but did not at `version`?"""
    if version >= COUNTED:
        return False
    read = tuple(f"stages.{s}.{r}" for s, names in READ_WHEN_DISABLED.items() for r in names)
    inside = key.split(".", 2)[2] if key.startswith("stages.") and key.count(".") >= 2 else ""
    return inside in AFFECTING_INSIDE or any(key == r or key.startswith(r + ".") for r in read)


def _read_fields(path: Path, current: dict[str, Any] | None) -> dict[str, Any] | None:
    if not path.exists():
        return None
    doc = json.loads(path.read_text())
    fields: dict[str, Any] = doc["fields"]
    version = int(doc.get("counted", 1))
    if current is None:
        return fields
    return fields | {k: v for k, v in current.items() if k not in fields and _counted_since(k, version)}


def started_fields(layout: RunLayout, stage: str, current: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The fields an unfinished stage was last started under; None when rlt run did not record them. With
    `current` (the fields now), a field counted since the record was written reads as its current value."""
    return _read_fields(layout.stage_started_spec(stage), current)


def recorded_fields(layout: RunLayout, stage: str, current: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The fields a finished stage ran under; None when it finished before rlt recorded them. With `current`, as
    started_fields."""
    return _read_fields(fingerprint_path(layout, stage), current)


# --------------------------------------------------------------------------- the plan of a (re-)run


@dataclass(frozen=True)
class StagePlan:
    stage: str
    action: str  # run | skip | continue | start_over
    note: str = ""


def _is_current(layout: RunLayout, spec: RLTRunSpec, stage: str) -> bool:
    if not layout.stage_done(stage).exists():
        return False
    new = stage_fields(spec, stage)
    old = recorded_fields(layout, stage, new)
    return old is None or not changed_fields(old, new)


def plan_stages(
    layout: RunLayout,
    spec: RLTRunSpec,
    stages: list[str],
    restart: set[str] | None = None,
    restart_flag: str = "--from-stage {stage}",
    has_checkpoint: Callable[[str], bool] | None = None,
    restart_hint: str | None = None,
    check_resumes: bool = False,
    check_inputs: bool = False,
) -> list[StagePlan]:
    """What to do with each of `stages` (in run order); raises StaleStageError for the first that must refuse.

    `restart`: stages the user asked to start over. `restart_flag` is how the refusal names that option.
    `has_checkpoint(stage)`: whether a checkpoint to continue from exists (RL's extension needs one).
    `restart_hint`: the refusal's advice when the caller has no restart flag (it replaces the flag's sentence).
    `check_resumes`: an unfinished stage with a checkpoint, started under other fields (record_start), follows the
    finished stages' rules: a grown extendable field continues, a changed input starts it over, anything else
    refuses (`rlt run`; the operator's pods resume a gang under the spec it was created with).
    `check_inputs`: a stage run now (or started over) whose earlier stage, not run now, finished under another spec
    refuses, naming that stage (`rlt run --stage`; the operator's later stages run on the old outputs, as reported)."""
    restart = restart or set()
    fresh: set[str] = set()  # stages whose output is (or will be, in this invocation) from the current spec
    stale: list[str] = []  # finished stages not run now whose output is of another spec
    plans: list[StagePlan] = []
    for stage in STAGE_ORDER:
        if stage not in stages:
            if _is_current(layout, spec, stage):
                fresh.add(stage)
            elif layout.stage_done(stage).exists():
                stale.append(stage)
            continue
        done = layout.stage_done(stage).exists()
        if (
            check_inputs and stale and (stage in restart or not done)
        ):  # it would train on an earlier stage's output of another spec
            _refuse_stale_input(layout, spec, stale[0], stage, restart_flag, restart_hint)
        if stage in restart:
            plans.append(
                StagePlan(stage, "start_over" if layout.stage_dir(stage).exists() else "run", "started over as asked")
            )
        elif not done:
            new = stage_fields(spec, stage)
            started = started_fields(layout, stage, new) if check_resumes else None
            resumes = has_checkpoint is not None and has_checkpoint(stage)
            if started is not None and resumes and changed_fields(started, new):
                plans.append(
                    _stale(layout, stage, started, new, fresh, restart_flag, has_checkpoint, restart_hint, "stopped")
                )
            else:
                plans.append(StagePlan(stage, "run"))
        else:
            new = stage_fields(spec, stage)
            old = recorded_fields(layout, stage, new)
            if old is None or not changed_fields(old, new):
                plans.append(
                    StagePlan(
                        stage,
                        "skip",
                        "" if old is not None else "finished before rlt recorded stage specs; assumed unchanged",
                    )
                )
            else:
                plans.append(_stale(layout, stage, old, new, fresh, restart_flag, has_checkpoint, restart_hint))
        fresh.add(stage)
    return plans


def _stale(
    layout: RunLayout,
    stage: str,
    old: dict[str, Any],
    new: dict[str, Any],
    fresh: set[str],
    restart_flag: str,
    has_checkpoint: Callable[[str], bool] | None,
    restart_hint: str | None = None,
    ended: str = "finished",
) -> StagePlan:
    names = changed_fields(old, new)
    upstream = {n.split(".")[1] for n in names if n.startswith("stages.") and n.split(".")[1] != stage}
    own_or_run_wide = [n for n in names if not n.startswith("stages.") or n.split(".")[1] == stage]
    if not own_or_run_wide and upstream <= fresh:
        return StagePlan(stage, "start_over", f"its input changed ({', '.join(names)}): done again from the start")
    # an earlier stage whose output is of another spec is the one to train again (its later stages follow)
    redo = min(upstream - fresh, key=STAGE_ORDER.index) if upstream - fresh else stage
    extend = EXTENDABLE.get(stage) if redo == stage else None
    grown = extend is not None and names == [extend] and isinstance(old.get(extend), int) and new[extend] > old[extend]
    flat = _flat_schedule(old, stage)
    if extend is not None and grown and flat and (has_checkpoint is None or has_checkpoint(stage)):
        return StagePlan(
            stage, "continue", f"{extend} {old[extend]} -> {new[extend]}: continuing from the last checkpoint"
        )
    flag = restart_flag.format(stage=redo)
    changes = describe_changes(old, new)
    if grown and not flat:
        changes += (
            f"; its learning-rate schedule ({old.get(f'stages.{stage}.lrScheduler')}, warmupRatio "
            f"{old.get(f'stages.{stage}.warmupRatio')}) depends on the total steps, so more steps are not one longer run"
        )
    advice = restart_hint or f"re-run with {flag} to train it again (its old outputs move to {layout.replaced_dir}/)"
    raise StaleStageError(
        f"[{stage}] {ended} under a different spec ({changes}); not "
        f"{'reusing' if ended == 'finished' else 'resuming'} it. Restore the old values, or {advice}",
        stage,
        changes,
    )


def _refuse_stale_input(
    layout: RunLayout, spec: RLTRunSpec, earlier: str, stage: str, restart_flag: str, restart_hint: str | None
) -> None:
    new = stage_fields(spec, earlier)
    old = recorded_fields(layout, earlier, new) or {}
    advice = restart_hint or f"re-run with {restart_flag.format(stage=earlier)} to train it again too"
    raise StaleStageError(
        f"[{earlier}] finished under a different spec ({describe_changes(old, new)}) and stage {stage} would train "
        f"on its output; not running {stage}. Restore the old values, or {advice}",
        earlier,
        describe_changes(old, new),
    )


def _flat_schedule(fields: dict[str, Any], stage: str) -> bool:
    """Is the stage's learning rate the same at every step whatever the total (constant, no warmup)? Only then do
    steps 1..n and n+1..m from the checkpoint equal one run of m steps."""
    return fields.get(f"stages.{stage}.lrScheduler") == "constant" and not fields.get(f"stages.{stage}.warmupRatio")


def start_over(layout: RunLayout, stage: str) -> Path | None:
    """Move a stage's folder aside (never delete outputs) so the stage runs from scratch; returns where it went."""
    src = layout.stage_dir(stage)
    if not src.exists():
        return None
    stamp = format_time(fmt=STAMP_FORMAT)
    dest = layout.replaced_dir / f"{src.name}-{stamp}"
    n = 1
    while dest.exists():
        n += 1
        dest = layout.replaced_dir / f"{src.name}-{stamp}-{n}"
    dest.parent.mkdir(parents=True, exist_ok=True)
    src.rename(dest)
    _move_metric_rows(layout.metrics_file, stage, dest / layout.metrics_file.name)
    return dest


def _move_metric_rows(metrics: Path, stage: str, dest: Path) -> None:
    """The run's metrics.jsonl rows of a stage started over go with its old outputs: the summary and the plots then
    show the new run of the stage, not both merged step by step."""
    if not metrics.exists():
        return
    kept: list[str] = []
    moved: list[str] = []
    for line in metrics.read_text(encoding="utf-8").splitlines(keepends=True):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:  # a torn last line or a blank one: left for the readers that skip it
            row = None
        (moved if isinstance(row, dict) and row.get("stage") == stage else kept).append(line)
    if moved:
        dest.write_text("".join(moved), encoding="utf-8")
        atomic_write_text(metrics, "".join(kept))


def reopen(layout: RunLayout, stage: str) -> None:
    """Before continuing a finished stage: drop its DONE marker and fingerprint (its checkpoints stay)."""
    layout.stage_done(stage).unlink(missing_ok=True)
    fingerprint_path(layout, stage).unlink(missing_ok=True)
