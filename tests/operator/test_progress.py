"""Pure progress parsing: the trainer's real exporter output → status.progress."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from suite_helpers import ROOT

from rlt.contract.metrics import TrainerMetrics
from rlt_operator.config.settings import OperatorSettings
from rlt_operator.status import progress as prog

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
    assert prog.public(first) == {
        "stage": "rl",
        "updateTime": "2026-01-01T00:00:00Z",
        "step": 30,
        "totalSteps": 125,
        "rewardMean": 0.25,
        "lastCheckpoint": "/data/r/rl/checkpoints/checkpoint-25",
    }
    later = T + dt.timedelta(seconds=10)
    second = prog.progress("r", "rl", prog.parse(exported("rl", 31, 3000), "rl"), first, later)
    assert second["tokensPerSecond"] == 200.0 and second["step"] == 31


def test_reward_is_kept_to_three_decimals_for_the_reward_column():
    """`kubectl get rlt` prints status.progress.rewardMean as stored (the REWARD column): -0.931, not -0.931234."""
    sample = {"step": 3.0, "rewardMean": -0.931234567}
    assert prog.progress("r", "rl", sample, None, T)["rewardMean"] == -0.931


def test_url_template_comes_from_the_settings_read_once_at_start_up():
    default = OperatorSettings.from_env({})
    assert prog.url_for(default.progress_url, "r", "ns", "rl") == "http://r-rl-0.r-rl.ns.svc:9400/metrics"
    custom = OperatorSettings.from_env({"RLT_PROGRESS_URL": "http://{job}.example:{port}/m"})
    assert prog.url_for(custom.progress_url, "r", "ns", "rl") == "http://r-rl.example:9400/m"


def test_settings_parse_every_variable_and_name_a_bad_one():
    env = {
        "RLT_RESYNC_SECONDS": "2",
        "RLT_PROGRESS_INTERVAL": "0.5",
        "RLT_DEBOUNCE_SECONDS": "",
        "RLT_WATCH_SERVER_TIMEOUT": "60",
        "RLT_OPERATOR_METRICS_PORT": "-1",
        "RLT_OPERATOR_METRICS_ADDR": "127.0.0.1",
        "RLT_OPERATOR_HEALTH_PORT": "0",
        "RLT_PROGRESS_URL": "http://x/{job}",
        "RLT_PROMETHEUS_NAMESPACES": " monitoring, ,mon-b",
        "POD_ID": "rlt-operator-7d9f-x2",
        "POD_NAMESPACE": "rlt-system",
    }
    got = OperatorSettings.from_env(env)
    assert got.scrapers == ("monitoring", "mon-b")
    assert (got.pod_id, got.pod_namespace) == ("rlt-operator-7d9f-x2", "rlt-system")
    assert (got.resync_seconds, got.progress_interval, got.debounce_seconds, got.watch_server_timeout) == (
        2.0,
        0.5,
        0.1,
        60.0,
    )
    assert (got.metrics_port, got.metrics_addr, got.health_port, got.progress_url) == (
        -1,
        "127.0.0.1",
        0,
        "http://x/{job}",
    )
    assert set(OperatorSettings.ENV.values()) == set(env), "every field has its variable"
    documented = (ROOT / "docs" / "operator.md").read_text()
    assert [v for v in env if f"| `{v}` |" not in documented] == [], "docs/operator.md lists every variable"
    with pytest.raises(ValueError, match=r"RLT_OPERATOR_HEALTH_PORT='80.5': expected an integer"):
        OperatorSettings.from_env({"RLT_OPERATOR_HEALTH_PORT": "80.5"})
    with pytest.raises(ValueError, match=r"RLT_RESYNC_SECONDS='soon': expected a number of seconds"):
        OperatorSettings.from_env({"RLT_RESYNC_SECONDS": "soon"})


def test_operator_modules_read_no_environment_variables_but_the_settings():
    import ast

    import rlt_operator

    readers = []
    for path in Path(rlt_operator.__file__).parent.rglob("*.py"):
        # sandbox.py sets KUBECONFIG for the clients it starts; the kubelet emulator stands for a node and reads that
        # node's environment (HOME, PYTHONPATH, caches) for the pods it starts, not the operator's settings.
        if path.name in ("settings.py", "sandbox.py", "sandbox_pods.py", "kubelet_emulator.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv"):
                readers.append(f"{path.name}:{node.lineno}")
    assert not readers
