"""Pure progress parsing: the trainer's real exporter output → status.progress."""

from __future__ import annotations

import datetime as dt

from prometheus_client import generate_latest

from rlt.metrics import TrainerMetrics
from rlt_operator import progress as prog

T = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)


def exported(stage: str, step: int, tokens: float) -> str:
    m = TrainerMetrics(run="r", namespace="ns")
    m.stage = "sft"
    m.set("rlt_step", 99)  # another stage's series must be ignored
    m.stage = stage
    m.set("rlt_step", step)
    m.set("rlt_total_steps", 125)
    m.set("rlt_reward_mean", 0.25)
    m.set("rlt_checkpoint_step", 25)
    m.inc("rlt_generated_tokens_total", tokens)
    return generate_latest(m.registry).decode()


def test_parse_and_rate():
    first = prog.progress("r", "rl", prog.parse(exported("rl", 30, 1000), "rl"), None, T)
    assert prog.public(first) == {"stage": "rl", "updateTime": "2026-01-01T00:00:00Z", "step": 30,
                                  "totalSteps": 125, "rewardMean": 0.25,
                                  "lastCheckpoint": "/data/r/rl/checkpoints/checkpoint-25"}
    later = T + dt.timedelta(seconds=10)
    second = prog.progress("r", "rl", prog.parse(exported("rl", 31, 3000), "rl"), first, later)
    assert second["tokensPerSecond"] == 200.0 and second["step"] == 31


def test_url_template(monkeypatch):
    monkeypatch.delenv("RLT_PROGRESS_URL", raising=False)
    assert prog.url_for("r", "ns", "rl") == "http://r-rl-0.r-rl.ns.svc:9400/metrics"
    monkeypatch.setenv("RLT_PROGRESS_URL", "http://{job}.example:{port}/m")
    assert prog.url_for("r", "ns", "rl") == "http://r-rl.example:9400/m"
