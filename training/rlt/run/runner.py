"""`rlt run`: the stages of an RLTRun, in-process, into results/<run>/ — the same stage functions the pods run."""

from __future__ import annotations

import errno
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from rlt.contract.env import NAMESPACE
from rlt.contract.layout import RunLayout, atomic_write_json, atomic_write_text, newest_complete_checkpoint
from rlt.contract.metrics import TRAINER_METRICS_PORT, TrainerMetrics
from rlt.contract.outputs import push_stage_outputs
from rlt.contract.stage_registry import STAGE_ORDER, stage_function, stage_info
from rlt.data.models import name_the_accelerator, quiet_libraries
from rlt.run.lock import lock_run_folder
from rlt.run.plots import make_plots, read_metrics
from rlt.run.summaries import stage_summary
from rlt.spec import fingerprint
from rlt.spec.loading import dump_run
from rlt.spec.run import RLTRun, reads_run_dataset
from rlt.stages.context import StageContext
from rlt.stages.preemption import LATE_SIGNALS, Stopped, report_stop
from rlt.stages.ranks import leave_process_group

log = logging.getLogger(__name__)


def summarize(layout: RunLayout, stage_info: dict[str, Any], wall: float, plots: list[Path]) -> dict[str, Any]:
    rows = read_metrics(layout.metrics_file)
    summary: dict[str, Any] = {"wallSeconds": round(wall, 1), "stages": stage_info, "plots": [str(p) for p in plots]}
    for name in STAGE_ORDER:  # each stage says its part (rlt.run.summaries)
        found = stage_summary(name)
        part = found.summarize(layout, rows) if found is not None else None
        if part is not None:
            summary[name] = part
    return summary


class MetricsPortError(ValueError):
    """The asked-for metrics port is taken; the message is one line."""


def serve_metrics(metrics: TrainerMetrics, port: int, fallback: bool, addr: str = "127.0.0.1") -> int:
    """Bind the /metrics port. With `fallback` (the default port, not one the user chose) a taken port is replaced
    by a free one, said on stdout; otherwise a taken port is a one-line error."""
    try:
        return metrics.serve(port, addr=addr)
    except OSError as err:
        if err.errno != errno.EADDRINUSE:  # not allowed (a port below 1024), no such address: one line
            raise MetricsPortError(f"--metrics-port {port}: cannot serve on {addr}:{port}: {err.strerror}") from None
    if not fallback:
        raise MetricsPortError(
            f"--metrics-port {port}: {addr}:{port} is already in use (another rlt run?); "
            "pick another port, 0 for any free one, or -1 for no metrics"
        )
    bound = metrics.serve(0, addr=addr)
    print(f"metrics: port {port} is in use (another rlt run?); serving on {bound} instead", flush=True)
    return bound


def check_run_data(run: RLTRun, stages: list[str]) -> dict[str, Any] | None:
    """Check the run's dataset once, before any model loads (DataError names the first bad line); the counts go
    into summary.json. None when no stage reads spec.dataset or it is a hub dataset (read by the stages)."""
    from rlt.data.dataset import check_data, is_reachable

    spec = run.spec
    if not any(reads_run_dataset(spec, s) for s in stages) or not is_reachable(spec.dataset):
        return None
    from rlt.method.prompts import resolve_format  # both methods read rows with spec.format's tags

    data = check_data(spec.dataset, resolve_format(spec.format))
    if data.skipped:
        print(
            f"data: skipping {len(data.skipped)} of {data.read} rows (badRows: skip); first: {data.skipped[0]}",
            flush=True,
        )
    return {
        "source": spec.dataset.source,
        "rowsRead": data.read,
        "rowsUsed": data.read - len(data.skipped),
        "skippedRows": len(data.skipped),
        "skipped": data.skipped[:50],
        "numbersUsedAsText": len(data.numbers),
    }


def check_lengths(run: RLTRun, stages: list[str]) -> None:
    """Before any stage trains: every teacher prompt fits the limits of the sft and rl stages about to run, and the
    reward of rl and distill can score every solution within the student's context, or one DataError lists each
    limit, the file lines over it and the value that fits."""
    from rlt.data.errors import DataError

    if not {"sft", "rl", "distill"} & set(stages):
        return
    from rlt.stages.prompt_lengths import CONTEXT, REWARD, SCORED_BY, check_prompt_lengths

    problems, _ = check_prompt_lengths(run.spec, build=True)  # a built-in model is made now, not skipped unchecked
    # the data itself (a row holding the teacher's special tokens): refused whatever badRows says, as by rlt validate
    refused = [p for p in problems if p.startswith("spec.dataset:")]
    if refused:
        raise DataError("; ".join(refused))
    # the student's context against the explanations of the stages about to run: no row can be skipped to fit it
    whole = [p for p in problems if p.startswith(f"{CONTEXT}:") and any(f"spec.stages.{s}." in p for s in stages)]
    mine = [p for p in problems if any(p.startswith(f"spec.stages.{s}.") for s in stages)]
    if set(SCORED_BY) & set(stages):  # distill scores with rl's reward: its rows are distill's problem too
        mine += [p for p in problems if p.startswith(f"{REWARD}:") and p not in mine]
    if mine and run.spec.dataset.bad_rows == "reject":
        raise DataError("; ".join(whole + mine) + " (or set spec.dataset.badRows: skip to leave those rows out)")
    if whole:
        raise DataError("; ".join(whole))
    for p in mine:
        print(f"data: badRows: skip leaves out rows where {p}", flush=True)


def run_local(
    run: RLTRun,
    output: str | Path = "results",
    metrics_port: int | None = TRAINER_METRICS_PORT,
    linger: float = 0.0,
    only: list[str] | None = None,
    device: str | None = None,
    show_progress: bool = True,
    from_stage: str | None = None,
    port_fallback: bool = False,
    plots_wanted: bool = True,
) -> dict[str, Any]:
    name_the_accelerator()
    layout = RunLayout.for_run(output, run.name)
    stages = only or run.spec.stages.enabled()
    order = list(STAGE_ORDER)
    restart = {s for s in order if from_stage and order.index(s) >= order.index(from_stage)}
    # Refusals come before anything is written: run.yaml must keep describing what the outputs were made with.
    plans = fingerprint.plan_stages(
        layout,
        run.spec,
        stages,
        restart,
        "--from-stage {stage}",
        has_checkpoint=layout.has_complete_checkpoint,
        check_resumes=True,
        check_inputs=True,
    )
    data_summary = check_run_data(run, [p.stage for p in plans if p.action != "skip"])
    check_lengths(run, [p.stage for p in plans if p.action != "skip"])
    lock = lock_run_folder(layout.root, "rlt run")  # before the first write: a second run of this file is refused
    quiet_libraries()
    metrics = TrainerMetrics(run.name, namespace=run.metadata.namespace or "local", method=run.spec.method)
    try:
        if metrics_port is not None:  # a port it cannot serve on is a refusal: before run.yaml is written
            port = serve_metrics(metrics, metrics_port, port_fallback)
            print(f"metrics: http://127.0.0.1:{port}/metrics", flush=True)
        atomic_write_text(layout.run_file, dump_run(run))
    except BaseException:
        metrics.shutdown()
        lock.release()
        raise
    ctx = StageContext(run, layout, metrics, device, show_progress)
    info: dict[str, Any] = {}
    plots: list[Path] | None = None  # the last stage's plots are the run's (they read the whole metrics.jsonl)
    shown: set[Path] = set()  # plots already announced: a later stage redraws them, it does not make them new
    started = time.perf_counter()
    LATE_SIGNALS.clear()  # this run's, not an earlier one's in the same process
    try:
        for plan in plans:
            name = plan.stage
            if plan.action == "skip":
                print(
                    f"[{name}] already done ({layout.stage_done(name)}): skipped"
                    + (f" ({plan.note})" if plan.note else ""),
                    flush=True,
                )
                info[name] = {"skipped": True} | time_spent(layout, name)
                push_stage_outputs(ctx, name)  # a push that failed after the stage finished is retried
                continue
            begin_stage(layout, run, plan)
            info[name] = run_stage(ctx, name, from_stage)
            print(f"[{name}] done in {info[name]['seconds']} s -> {info[name]['output']}", flush=True)
            stop_if_signalled_late(
                name, [p.stage for p in plans[plans.index(plan) + 1 :] if p.action != "skip"], from_stage
            )
            # Each stage's plots as soon as it ends: a long run has something to look at before the last stage.
            # plots_wanted False: none (a box without matplotlib: benchmarks/gpu_teachers.py's units).
            plots = make_plots(layout.metrics_file, layout.plots_dir, run.name, run_caveat(run)) if plots_wanted else []
            for plot in plots:
                if plot not in shown:
                    print(f"[{name}] plot: {plot}", flush=True)
            shown.update(plots)
        if plots is None and plots_wanted:  # every stage was done before: the plots of what the folder holds
            plots = make_plots(layout.metrics_file, layout.plots_dir, run.name, run_caveat(run))
        summary = summarize(layout, info, time.perf_counter() - started, plots or [])
        if data_summary is not None:
            summary["data"] = data_summary
        caveat = run_caveat(run)
        if caveat:
            summary["note"] = caveat
        atomic_write_json(layout.summary_file, summary)
        print_summary(layout, summary)
        if linger > 0:
            _linger(linger)
        return summary
    finally:
        metrics.shutdown()
        lock.release()


def run_stage(ctx: StageContext, name: str, from_stage: str | None) -> dict[str, Any]:
    """One stage of `rlt run` and its outputs' push: its seconds, output and the seconds of every run on it."""
    layout, t0 = ctx.layout, time.perf_counter()
    try:
        try:
            output_path = stage_function(name, ctx.run.spec.method)(ctx)
        except KeyboardInterrupt:
            raise Interrupted(name, layout, from_stage) from None
        except Stopped as stop:  # "the same command" would start the stage over again: say how to resume
            if from_stage:
                stop.args = (f"{stop}; {_without_from_stage(from_stage)}",)
            raise
        push_stage_outputs(ctx, name)
    finally:  # a stopped or failed run's seconds count too: the run that resumes it adds its own
        seconds = time.perf_counter() - t0  # once: the sum and this run's figure are of the same seconds
        spent = add_time_spent(layout, name, seconds)
    return {"seconds": round(seconds, 1), "output": output_path} | spent


def time_spent(layout: RunLayout, stage: str) -> dict[str, Any]:
    """secondsAllRuns and runs of the stage's present output; {} for a folder from before rlt recorded them."""
    path = layout.stage_time_spent(stage)
    return json.loads(path.read_text()) if path.exists() else {}


def add_time_spent(layout: RunLayout, stage: str, seconds: float) -> dict[str, Any]:
    spent = time_spent(layout, stage)
    spent = {
        "secondsAllRuns": round(spent.get("secondsAllRuns", 0.0) + seconds, 1),
        "runs": spent.get("runs", 0) + 1,
    }
    atomic_write_json(layout.stage_time_spent(stage), spent)
    return spent


def _linger(seconds: float) -> None:
    """Keep the metrics served after the run (--linger). Ctrl-C ends the wait: the run finished and is recorded, so
    that is no failure (exit 0, not an interrupted run's 130)."""
    try:  # the line inside: a Ctrl-C sent the moment it is read lands before the sleep starts
        print(f"serving metrics for {seconds:.0f} s more (Ctrl-C ends this; the run is done)", flush=True)
        time.sleep(seconds)
    except KeyboardInterrupt:
        print("stopped serving metrics", flush=True)


def begin_stage(layout: RunLayout, run: RLTRun, plan: fingerprint.StagePlan) -> None:
    """Before a stage runs: its old outputs moved aside (start over) or its DONE dropped (continue), said; the fields
    its checkpoints are trained under recorded."""
    name = plan.stage
    if plan.action == "start_over":
        moved = fingerprint.start_over(layout, name)
        print(f"[{name}] {plan.note}; previous outputs moved to {moved}", flush=True)
    elif plan.action == "continue":
        fingerprint.reopen(layout, name)
        print(f"[{name}] {plan.note}", flush=True)
    print(f"[{name}] starting", flush=True)
    fingerprint.record_start(layout, run.spec, name)


def _without_from_stage(from_stage: str) -> str:
    return (
        f"re-run without --from-stage {from_stage} to resume (with it, {from_stage} and every later stage start over)"
    )


def stop_if_signalled_late(stage: str, after: list[str], from_stage: str | None = None) -> None:
    """A SIGTERM the stage's handler took after its last stop point (the stage finished anyway): stop before the next
    stage to run, if any."""
    if LATE_SIGNALS and after:
        again = _without_from_stage(from_stage) if from_stage else "the same command starts there"
        raise Stopped(
            stage,
            0,
            None,
            message=f"SIGTERM during stage {stage} after its last stop point: {stage} finished, the run stopped "
            f"before {after[0]} ({again})",
        )


class Interrupted(KeyboardInterrupt):
    """Ctrl-C inside a stage of `rlt run`: where it stopped, and what a re-run of the same command does (with
    --from-stage, the same command would start over: the message says to drop it)."""

    def __init__(self, stage: str, layout: RunLayout, from_stage: str | None = None):
        steps = [r["step"] for r in read_metrics(layout.metrics_file) if r.get("stage") == stage and "step" in r]
        saved = newest_complete_checkpoint(layout.checkpoints_dir(stage))
        where = f"{stage} step {max(steps)}" if steps else f"the start of {stage}"
        resume = f"resumes {stage} from {saved.name}" if saved else f"starts {stage} again"
        if stage_info(stage).resumes_by_row:  # no checkpoints: each row is on disk once made
            where, resume = stage, f"resumes {stage} after the rows already written"
        again = (
            f"a re-run without --from-stage {from_stage} {resume} (with it, {from_stage} and every later stage start "
            "over)"
            if from_stage
            else f"a re-run of the same command {resume}"
        )
        super().__init__(f"stopped (Ctrl-C) at {where}; completed stages are kept and {again}")


# Below this many RL steps a run's reward is not expected to trend (the paper trains 125 steps): the demo's 6 steps
# show that the pipeline runs.
FEW_RL_STEPS = 50


def run_caveat(run: RLTRun) -> str | None:
    """What a reader of this run's plots and texts must know before trusting them, or None.

    builtin:tiny-qwen2 is randomly initialised; a small model trained for a few RL steps writes explanations with
    wrong arithmetic, unclosed tags and stray markup, and its reward does not trend."""
    refs = {run.spec.teacher.model, run.spec.student.model}
    if "builtin:tiny-qwen2" in refs:
        return (
            "note: builtin:tiny-qwen2 is a random model: its rewards, plots and generated texts show that the "
            "pipeline runs, not that anything is learnt"
        )
    rl = run.spec.stages.rl
    if rl.enabled and rl.steps < FEW_RL_STEPS:
        return (
            f"note: {rl.steps} RL steps of {run.spec.teacher.model}: too few for the reward to trend, and its "
            "explanations are often wrong or unclosed; this shows that the pipeline runs, not what training reaches"
        )
    return None


def print_summary(layout: RunLayout, summary: dict[str, Any]) -> None:
    print(f"\nrun finished in {summary['wallSeconds']} s -> {layout.root}")
    for name, st in summary["stages"].items():
        print(f"  {name:8s} {stage_time_line(st)}")
    for name in STAGE_ORDER:
        found = stage_summary(name)
        for line in found.lines(summary[name]) if found is not None and name in summary else []:
            print(line)
    if summary.get("data", {}).get("skippedRows"):
        print(f"  data: {summary['data']['skippedRows']} of {summary['data']['rowsRead']} rows skipped (badRows: skip)")
    for p in summary["plots"]:
        print(f"  plot: {p}")
    if summary.get("note"):
        print(f"  {summary['note']}")


def stage_time_line(st: dict[str, Any]) -> str:
    """`12.3 s`, `12.3 s (40.1 s over 3 runs)`, `skipped (done before, in 40.1 s)` or `skipped (done before)`."""
    runs, total = st.get("runs", 0), st.get("secondsAllRuns")
    if st.get("skipped"):
        return f"skipped (done before, in {total} s)" if total is not None else "skipped (done before)"
    return f"{st['seconds']} s" + (f" ({total} s over {runs} runs)" if runs > 1 else "")


def run_stage_in_pod(run: RLTRun, stage: str, root: str | Path, metrics_port: int | None, restart: bool = False) -> str:
    """`rlt stage`: one stage inside a pod; rank 0 exports metrics on all interfaces (metrics_port None: none)."""
    layout = RunLayout.for_run(root, run.name)
    ctx = StageContext(run, layout, None, None, show_progress=False)
    [plan] = fingerprint.plan_stages(
        layout,
        run.spec,
        [stage],
        {stage} if restart else set(),
        "--restart",
        has_checkpoint=layout.has_complete_checkpoint,
    )
    if plan.action == "skip":
        print(f"[{stage}] already done: nothing to do", flush=True)
        push_stage_outputs(ctx, stage)  # a push that failed after the stage finished is retried
        return str(layout.stage_dir(stage))
    check_run_data(run, [stage])  # a data error ends the pod in one line before any model is loaded
    if ctx.is_main and plan.action == "start_over":
        print(f"[{stage}] {plan.note}; previous outputs moved to {fingerprint.start_over(layout, stage)}", flush=True)
    elif ctx.is_main and plan.action == "continue":
        fingerprint.reopen(layout, stage)
        print(f"[{stage}] {plan.note}", flush=True)
    if ctx.is_main:
        ctx.metrics = TrainerMetrics(
            run.name,
            namespace=os.environ.get(NAMESPACE.name, run.metadata.namespace or "default"),
            method=run.spec.method,
        )
        if metrics_port is not None:
            serve_metrics(ctx.metrics, metrics_port, fallback=False, addr="0.0.0.0")
    try:
        output_path = stage_function(stage, run.spec.method)(ctx)
    except Stopped as stopped:  # every rank agreed and saved: they all get here, so the barrier cannot hang
        report_stop(stopped)
        if stopped.gang_agreed:  # a rank that left on an error after the signal: its peers may never reach a barrier
            leave_process_group()
        raise
    push_stage_outputs(ctx, stage)
    leave_process_group()  # on success only: a barrier after a failed rank would wait forever
    return output_path
