"""`rlt run`: the stages of an RLTRun, in-process, into results/<run>/ — the same stage functions the pods run."""

from __future__ import annotations

import logging
import os
import statistics
import time
from pathlib import Path
from typing import Any

from rlt.layout import RunLayout, atomic_write_json, atomic_write_text
from rlt.metrics import TrainerMetrics
from rlt.plots import make_plots, read_metrics
from rlt.spec import RLTRun, dump_run
from rlt.stages import stage_function
from rlt.stages.common import StageContext, leave_process_group

log = logging.getLogger(__name__)


def summarize(layout: RunLayout, stage_info: dict[str, Any], wall: float, plots: list[Path]) -> dict[str, Any]:
    rows = read_metrics(layout.metrics_file)
    rl = {r["step"]: r for r in rows if r["stage"] == "rl"}
    rl_rows = [rl[k] for k in sorted(rl)]
    summary: dict[str, Any] = {"wallSeconds": round(wall, 1), "stages": stage_info, "plots": [str(p) for p in plots]}
    if rl_rows:
        summary["rl"] = {
            "steps": len(rl_rows),
            "rewardPerStep": [round(r.get("reward", float("nan")), 4) for r in rl_rows],
            "rewardFirst": rl_rows[0].get("reward"), "rewardLast": rl_rows[-1].get("reward"),
            "meanStepSeconds": statistics.mean(r.get("step_seconds", 0.0) for r in rl_rows),
        }
    if layout.distill_dataset.exists():
        import json

        data = [json.loads(line) for line in layout.distill_dataset.read_text().splitlines() if line.strip()]
        summary["distill"] = {
            "rows": len(data), "path": str(layout.distill_dataset),
            "meanReward": statistics.mean(d["reward"] for d in data) if data else None,
            "closedFraction": sum(d["closed"] for d in data) / len(data) if data else None,
        }
    return summary


def quiet_libraries() -> None:
    """Our progress bars tell the story; silence per-file loading bars and known deprecation noise."""
    import warnings

    import transformers

    import datasets

    datasets.disable_progress_bars()
    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"transformers\..*")
    warnings.filterwarnings("ignore", message=".*rollout_func.*")


def run_local(run: RLTRun, output: str | Path = "results", metrics_port: int | None = 9400, linger: float = 0.0,
              only: list[str] | None = None, device: str | None = None, show_progress: bool = True) -> dict[str, Any]:
    quiet_libraries()
    layout = RunLayout.for_run(output, run.name)
    layout.root.mkdir(parents=True, exist_ok=True)
    atomic_write_text(layout.root / "run.yaml", dump_run(run))
    metrics = TrainerMetrics(run.name, namespace=run.metadata.namespace or "local", method=run.spec.method)
    if metrics_port is not None:
        port = metrics.serve(metrics_port)
        print(f"metrics: http://127.0.0.1:{port}/metrics", flush=True)
    ctx = StageContext(run, layout, metrics, device, show_progress)
    stages = only or run.spec.stages.enabled()
    info: dict[str, Any] = {}
    started = time.perf_counter()
    try:
        for name in stages:
            if layout.stage_done(name).exists():
                print(f"[{name}] already done ({layout.stage_done(name)}): skipped", flush=True)
                info[name] = {"skipped": True}
                continue
            print(f"[{name}] starting", flush=True)
            t0 = time.perf_counter()
            output_path = stage_function(name, run.spec.method)(ctx)
            info[name] = {"seconds": round(time.perf_counter() - t0, 1), "output": output_path}
            print(f"[{name}] done in {info[name]['seconds']} s -> {output_path}", flush=True)
        plots = make_plots(layout.metrics_file, layout.plots_dir)
        summary = summarize(layout, info, time.perf_counter() - started, plots)
        atomic_write_json(layout.summary_file, summary)
        print_summary(layout, summary)
        if linger > 0:
            print(f"serving metrics for {linger:.0f} s more", flush=True)
            time.sleep(linger)
        return summary
    finally:
        metrics.shutdown()


def print_summary(layout: RunLayout, summary: dict[str, Any]) -> None:
    print(f"\nrun finished in {summary['wallSeconds']} s -> {layout.root}")
    for name, st in summary["stages"].items():
        print(f"  {name:8s} {'skipped (done before)' if st.get('skipped') else str(st['seconds']) + ' s'}")
    if "rl" in summary:
        rewards = ", ".join(f"{r:.3f}" for r in summary["rl"]["rewardPerStep"])
        print(f"  reward per RL step: {rewards}")
    if "distill" in summary:
        d = summary["distill"]
        print(f"  distillation dataset: {d['rows']} rows, mean reward {d['meanReward']:.3f} -> {d['path']}")
    for p in summary["plots"]:
        print(f"  plot: {p}")


def run_stage_in_pod(run: RLTRun, stage: str, root: str | Path, metrics_port: int) -> str:
    """`rlt stage`: one stage inside a pod; rank 0 exports metrics on all interfaces."""
    layout = RunLayout.for_run(root, run.name)
    ctx = StageContext(run, layout, None, None, show_progress=False)
    if layout.stage_done(stage).exists():
        print(f"[{stage}] already done: nothing to do", flush=True)
        return str(layout.stage_dir(stage))
    if ctx.is_main:
        ctx.metrics = TrainerMetrics(run.name, namespace=os.environ.get("RLT_NAMESPACE", run.metadata.namespace or "default"),
                                     method=run.spec.method)
        ctx.metrics.serve(metrics_port, addr="0.0.0.0")
    out = stage_function(stage, run.spec.method)(ctx)
    leave_process_group()  # on success only: a barrier after a failed rank would wait forever
    return out
