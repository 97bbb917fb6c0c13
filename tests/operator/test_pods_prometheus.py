"""A real Prometheus scrapes the emulated run's pods through the chart's PodMonitor.

The chart is rendered by the real helm with monitoring on; its PodMonitor becomes the scrape config that
prometheus-operator would generate from it (selector → `keep` relabelings on the pod's labels, the endpoint's named
port → `keep` on the container port's name, its path, interval, honorLabels and relabelings). The Debian build of
Prometheus here has no Kubernetes service discovery, so the test stands in for it, and only for it: every container
port of every pod in the emulated API becomes a file_sd target with the `__meta_kubernetes_pod_*` labels that
discovery would give it. Which of those targets are scraped is decided by Prometheus, from the chart's rules: if the
operator's pods stop carrying the labels the PodMonitor selects, or their metrics port is renamed, no rlt_* series
arrives and the test fails.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
import urllib.parse
import urllib.request
from typing import Any

import pytest
import yaml
from monitor_scrape import only, pod_targets, podmonitor_scrape_configs, render_chart
from op_harness import example
from pods_harness import REPO, running_pods, wait_for
from suite_helpers import free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

TOOLS = REPO / ".tools" / "bin"
RUN = "prom"
RL_STEPS = 12


def render_podmonitor() -> dict[str, Any]:
    """The chart's PodMonitor, rendered with the CI monitoring values and a 1 s interval (for a short test)."""
    return only(render_chart("metrics.podMonitor.interval=1s", "metrics.podMonitor.scrapeTimeout=1s"), "PodMonitor")


def prom_get(base: str, path: str, **params: str) -> dict[str, Any]:
    url = f"{base}{path}" + ("?" + urllib.parse.urlencode(params) if params else "")
    with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 - loopback
        return json.loads(resp.read())


# ---------------------------------------------------------------------------------- the test


async def test_prometheus_scrapes_the_trainer_pod_through_the_charts_podmonitor(harness, tmp_path):
    prometheus = TOOLS / "prometheus"
    if not prometheus.exists():
        pytest.skip("prometheus not found: run `make tools`")
    pm = render_podmonitor()
    sd_file = tmp_path / "pods.json"
    sd_file.write_text("[]")
    config = tmp_path / "prometheus.yml"
    config.write_text(
        yaml.safe_dump(
            {"global": {"scrape_interval": "1s"}, "scrape_configs": podmonitor_scrape_configs(pm, sd_file)},
            sort_keys=False,
        )
    )
    subprocess.run([str(TOOLS / "promtool"), "check", "config", str(config)], check=True, capture_output=True)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    prom_log = (tmp_path / "prometheus.log").open("w")
    prom = subprocess.Popen(
        [
            str(prometheus),
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        stdout=prom_log,
        stderr=subprocess.STDOUT,
    )

    async def discover() -> None:
        """Keeps the file_sd file equal to what Kubernetes discovery would see in the emulated API."""
        while True:
            pods = (await harness.call("GET", "/api/v1/pods"))["items"]
            text = json.dumps(pod_targets(pods), sort_keys=True)
            if text != sd_file.read_text():
                tmp = sd_file.with_suffix(".new")
                tmp.write_text(text)
                tmp.replace(sd_file)
            await asyncio.sleep(0.3)

    doc = example("rltrun-tiny.yaml")
    doc["metadata"]["name"] = RUN
    st = doc["spec"]["stages"]
    st["sft"]["enabled"] = False
    st["distill"]["enabled"] = False
    st["rl"].update(steps=RL_STEPS, saveSteps=RL_STEPS)  # long enough for a few 1 s scrapes of the trainer
    discovery = asyncio.create_task(discover())
    started = time.monotonic()
    try:
        await wait_for(lambda: prom.poll() is None and _ready(base), "Prometheus ready", 30)
        await harness.start_operator()
        async with running_pods(harness, tmp_path / "pods") as kubelet:
            await harness.create_run(doc)
            query = f'rlt_step{{run="{RUN}", role="trainer"}}'

            async def scraped() -> tuple[list[dict[str, Any]], dict[str, Any]] | None:
                done = (await harness.run_status(RUN)).get("phase") in ("Succeeded", "Failed")
                # last_over_time: samples scraped before the trainer ended count too (its series then go stale).
                result = prom_get(base, "/api/v1/query", query=f"last_over_time({query}[10m])")["data"]["result"]
                if result:
                    return result, prom_get(base, "/api/v1/targets")["data"]
                assert not done, f"the run ended and Prometheus never got {query}"
                return None

            result, targets = await wait_for(scraped, f"{query} in Prometheus", 240, kubelet)
            trainer = kubelet.pod(f"{RUN}-rl-0-")
            final = await harness.wait_status(
                RUN, lambda s: s.get("phase") in ("Succeeded", "Failed"), "the run to finish", timeout=240
            )
            assert final["phase"] == "Succeeded", final
    finally:
        discovery.cancel()
        prom.terminate()
        prom.wait(10)
        prom_log.close()
    print(
        f"\nPrometheus scraped {query} through the chart's PodMonitor; run done in {time.monotonic() - started:.0f} s"
    )

    # The sample carries the pod's identity, which only the PodMonitor's relabelings of its labels can give it.
    sample = result[0]["metric"]
    assert sample["pod"] == trainer.name and sample["namespace"] == "default", sample
    assert sample["role"] == "trainer" and sample["run"] == RUN and sample["stage"] == "rl", sample
    assert sample["job"] == f"podMonitor/rlt-system/{pm['metadata']['name']}/0", sample
    assert 0 <= float(result[0]["value"][1]) <= RL_STEPS
    # Of the trainer pod's two container ports, only the one the PodMonitor names is scraped.
    active = [t for t in targets["activeTargets"] if t["labels"].get("pod") == trainer.name]
    assert [t["discoveredLabels"]["__meta_kubernetes_pod_container_port_name"] for t in active] == ["metrics"]
    assert active[0]["scrapeUrl"] == "http://127.0.0.1:9400/metrics"
    dropped = {t["discoveredLabels"]["__meta_kubernetes_pod_container_port_name"] for t in targets["droppedTargets"]}
    assert "rendezvous" in dropped


def _ready(base: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base}/-/ready", timeout=2) as resp:  # noqa: S310 - loopback
            return resp.status == 200
    except OSError:
        return False
