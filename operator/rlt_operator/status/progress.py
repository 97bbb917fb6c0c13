"""Training progress for `status.progress`, read from the trainer's rlt_* metrics endpoint (rank 0).

The operator cannot mount the run's volume, so it reads the same numbers the trainer exports to
Prometheus. The handlers call `fetch` at most once per interval per run; parsing is pure.
"""

from __future__ import annotations

import datetime as dt
import urllib.request
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from rlt.contract.layout import format_time
from rlt.contract.metrics import PROGRESS_FIELDS
from rlt_operator import builders


def url_for(template: str, run: str, namespace: str, stage: str) -> str:
    """Rank 0's /metrics URL from OperatorSettings.progress_url (DEFAULT_PROGRESS_URL: pod 0 of the Job)."""
    job = builders.trainer_name(run, stage)
    return template.format(job=job, run=run, namespace=namespace, stage=stage, port=builders.METRICS_PORT)


def fetch(url: str, timeout: float = 3.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 - cluster-internal URL
        return str(resp.read().decode())


def parse(text: str, stage: str) -> dict[str, float]:
    """The stage's samples: step, totalSteps, rewardMean, checkpointStep, generatedTokens."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = PROGRESS_FIELDS.get(sample.name)
            if key and sample.labels.get("stage", stage) == stage:
                out[key] = sample.value
    return out


def progress(
    run: str, stage: str, sample: dict[str, float], previous: dict[str, Any] | None, now: dt.datetime
) -> dict[str, Any]:
    """status.progress from one scrape; tokens/s from the counter's change since the previous scrape."""
    out: dict[str, Any] = {"stage": stage, "updateTime": format_time(now)}
    if "step" in sample:
        out["step"] = int(sample["step"])
    if "totalSteps" in sample:
        out["totalSteps"] = int(sample["totalSteps"])
    if "rewardMean" in sample:
        out["rewardMean"] = round(float(sample["rewardMean"]), 3)  # kubectl prints it as is (REWARD)
    if sample.get("checkpointStep"):
        out["lastCheckpoint"] = str(builders.layout(run).checkpoint_dir(stage, int(sample["checkpointStep"])))
    tokens = sample.get("generatedTokens")
    if tokens is not None and previous and previous.get("stage") == stage and "_tokens" in previous:
        seconds = (now - previous["_time"]).total_seconds()
        if seconds > 0 and tokens >= previous["_tokens"]:
            out["tokensPerSecond"] = round((tokens - previous["_tokens"]) / seconds, 3)
    elif previous and previous.get("stage") == stage and "tokensPerSecond" in previous:
        out["tokensPerSecond"] = previous["tokensPerSecond"]
    # Kept in memory only (stripped before the status is written): the counter's last reading.
    if tokens is not None:
        out["_tokens"], out["_time"] = tokens, now
    return out


def public(p: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in p.items() if not k.startswith("_")}
