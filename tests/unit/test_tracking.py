"""The Recorder's step figures in experiment tracking: names from the one list (metrics.STEP_KEYS), read back from
TensorBoard event files and an MLflow file store (no training: the figures a stage would record)."""

from __future__ import annotations

from suite_helpers import tiny_doc

from rlt.contract.layout import RunLayout
from rlt.contract.metrics import TrainerMetrics
from rlt.spec.loading import parse_run
from rlt.stages.context import StageContext
from rlt.stages.record import Recorder

STEP = {
    "reward": -1.25,
    "reward_std": 0.5,
    "kl": 0.01,
    "loss": 0.2,
    "r_ss": -1.0,
    "r_kl": 0.05,
    "format_penalty": 0.1,
    "seconds_generate": 1.5,
    "seconds_score": 0.5,
    "seconds_update": 0.25,
    "step_seconds": 2.25,
    "generated_tokens": 100,
    "tokens_per_second": 44.4,
}


def ctx_for(tmp_path, tracking) -> StageContext:
    doc = tiny_doc()
    doc["spec"]["tracking"] = tracking
    run = parse_run(doc)
    return StageContext(run, RunLayout.for_run(tmp_path, run.name), TrainerMetrics(run.name), show_progress=False)


def test_tensorboard_tags_are_the_metric_names(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ctx = ctx_for(tmp_path, {"tensorboard": True})
    rec = Recorder(ctx, "rl", 2)
    rec.record(1, STEP)
    rec.record(2, {**STEP, "reward": -0.75, "generated_tokens": 50})
    rec.done()
    acc = EventAccumulator(str(tmp_path / "tiny" / "tracking" / "tensorboard" / "rl"))
    acc.Reload()
    assert set(acc.Tags()["scalars"]) == {
        "rlt_reward_mean",
        "rlt_reward_std",
        "rlt_policy_kl",
        "rlt_loss",
        "rlt_reward_component/r_ss",
        "rlt_reward_component/r_kl",
        "rlt_reward_component/format_penalty",
        "rlt_step_phase_seconds/generate",
        "rlt_step_phase_seconds/score",
        "rlt_step_phase_seconds/update",
        "rlt_step_seconds",
        "rlt_generated_tokens_total",
    }
    assert [(e.step, e.value) for e in acc.Scalars("rlt_reward_mean")] == [(1, -1.25), (2, -0.75)]
    assert [e.value for e in acc.Scalars("rlt_generated_tokens_total")] == [100, 150]  # a counter: running total
    # and Prometheus got the same figures under the same names
    text = __import__("prometheus_client").generate_latest(ctx.metrics.registry).decode()
    assert 'rlt_reward_component{component="r_kl",method="rlt",namespace="local",run="tiny",stage="rl"} 0.05' in text


def test_eval_accuracy_is_labelled_by_model_in_mlflow(tmp_path):
    from mlflow.tracking import MlflowClient

    ctx = ctx_for(tmp_path, {"mlflow": {}})
    rec = Recorder(ctx, "evaluate", 4)
    rec.eval_model = "student"
    rec.record(2, {"accuracy": 0.5})
    rec.record(4, {"accuracy": 0.75})
    rec.done()
    client = MlflowClient(tracking_uri=(tmp_path / "tiny" / "tracking" / "mlruns").resolve().as_uri())
    (exp,) = [e for e in client.search_experiments() if e.name == "tiny"]
    (run,) = client.search_runs([exp.experiment_id])
    assert run.info.run_name == "tiny-evaluate" and run.info.status == "FINISHED"
    history = client.get_metric_history(run.info.run_id, "rlt_eval_accuracy/student")
    assert [(m.step, m.value) for m in history] == [(2, 0.5), (4, 0.75)]


def test_no_tracking_writes_nothing(tmp_path):
    ctx = ctx_for(tmp_path, {})
    rec = Recorder(ctx, "rl", 1)
    rec.record(1, STEP)
    rec.done()
    assert rec.tracker is None and not (tmp_path / "tiny" / "tracking").exists()
