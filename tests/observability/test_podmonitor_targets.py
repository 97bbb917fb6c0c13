"""Which pods of a run the chart's PodMonitor makes targets, decided by a real Prometheus from the chart's rules.

The pods are the operator's own: a two-node trainer Job and the generator StatefulSet built by the
builders, instantiated as their controllers do (an Indexed Job's pod carries its completion index as an annotation,
a StatefulSet's its ordinal in its name), and handed to Prometheus as Kubernetes discovery would (file_sd with the
`__meta_kubernetes_pod_*` labels, tests/monitor_scrape.py). Prometheus' /api/v1/targets then lists what it keeps and
what its relabelings dropped; nothing needs to answer a scrape for that."""

from __future__ import annotations

import json
import subprocess
import urllib.parse

import pytest
import yaml
from monitor_scrape import only, pod_targets, podmonitor_scrape_configs, render_chart
from obs_helpers import http_get, tool, wait_until
from suite_helpers import free_port, tiny_doc

from rlt.spec.loading import parse_run
from rlt_operator import builders as b

pytestmark = pytest.mark.timeout(120)
REF = b.RunRef(name="gang", namespace="research", uid="uid-1")


def pods_of(owner: dict, count: int, job: bool) -> list[dict]:
    """The pods a Job (indexed) or a StatefulSet (ordinals) controller would create from `owner`'s template."""
    template, name = owner["spec"]["template"], owner["metadata"]["name"]
    pods = []
    for i in range(count):
        meta = template.get("metadata") or {}
        annotations = {**(meta.get("annotations") or {}), **({b.JOB_INDEX_ANNOTATION: str(i)} if job else {})}
        pods.append(
            {
                "metadata": {
                    "name": f"{name}-{i}-abcde" if job else f"{name}-{i}",
                    "namespace": REF.namespace,
                    "labels": dict(meta.get("labels") or {}),
                    "annotations": annotations,
                },
                "spec": template["spec"],
                "status": {"phase": "Running", "podIP": f"127.0.{1 if job else 2}.{i + 1}"},
            }
        )
    return pods


def test_the_trainer_gangs_first_pod_and_the_generator_are_targets_and_no_other_trainer_pod(tmp_path, procs):
    doc = tiny_doc()
    doc["spec"]["resources"]["trainer"]["nodes"] = 2
    doc["spec"]["stages"]["sft"]["perDeviceBatchSize"] = 2
    doc["spec"]["stages"]["rl"]["generation"] = {"mode": "server"}
    spec = parse_run(doc).spec
    job = b.trainer_job(REF, spec, "rl", 0)
    sts = b.generator_statefulset(REF, spec, "rl", 0)
    assert job["spec"]["completionMode"] == "Indexed" and job["spec"]["completions"] == 2
    pods = pods_of(job, 2, job=True) + pods_of(sts, sts["spec"]["replicas"], job=False)
    sd_file = tmp_path / "pods.json"
    sd_file.write_text(json.dumps(pod_targets(pods)))
    pm = only(render_chart(), "PodMonitor")
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump({"scrape_configs": podmonitor_scrape_configs(pm, sd_file)}, sort_keys=False))
    subprocess.run([tool("promtool"), "check", "config", str(config)], check=True, capture_output=True)
    port = free_port()
    prom = procs.start(
        "prometheus",
        [
            tool("prometheus"),
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
    )

    def targets() -> dict | None:
        query = urllib.parse.urlencode({"state": "any"})
        data = json.loads(http_get(f"http://127.0.0.1:{port}/api/v1/targets?{query}"))["data"]
        return data if data["activeTargets"] else None

    data = wait_until(targets, 60, "Prometheus' targets", [prom])
    active = sorted((t["labels"]["role"], t["labels"]["pod"]) for t in data["activeTargets"])
    job_name, sts_name = job["metadata"]["name"], sts["metadata"]["name"]
    assert active == [("generator", f"{sts_name}-0"), ("trainer", f"{job_name}-0-abcde")], active
    # The second trainer pod's metrics port was discovered and dropped by the trainer endpoint's rules.
    dropped = [t["discoveredLabels"] for t in data["droppedTargets"]]
    assert any(
        d["__meta_kubernetes_pod_name"] == f"{job_name}-1-abcde"
        and d["__meta_kubernetes_pod_container_port_name"] == pm["spec"]["podMetricsEndpoints"][0]["port"]
        for d in dropped
    ), dropped
