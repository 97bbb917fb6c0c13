"""Scale of the operator: N RLTRuns against the sandbox's emulated API, the operator as its own process.

Reports (JSON on stdout): p50/p95/max seconds from an RLTRun's create to all of its first-stage
children present (ConfigMap, PVC, the sft Job and its headless Service), the operator process's peak
RSS, and the API requests the operator made per run (by verb) over that window.

The API is kmock with rlt_sandbox.kmock_glue: an in-memory stand-in, far faster than a real
apiserver and without its rate limits, so the times are the operator's own cost, not a cluster's.

    .venv/bin/python benchmarks/operator_scale.py [--runs 200]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import kmock
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "operator"), str(ROOT / "training")]

from rlt_operator.config.kinds import RUN  # noqa: E402
from rlt_sandbox.sandbox import serve, write_kubeconfig  # noqa: E402

NS = "default"
OPERATOR_AGENTS = ("kopf", "OpenAPI-Generator")  # Kopf's own client, and the handlers' kubernetes client


def first_stage_keys(run: str) -> list[tuple]:
    return [
        (kmock.resource("v1/configmaps"), NS, f"{run}-config"),
        (kmock.resource("v1/persistentvolumeclaims"), NS, f"{run}-data"),
        (kmock.resource("batch/v1/jobs"), NS, f"{run}-sft"),
        (kmock.resource("v1/services"), NS, f"{run}-sft"),
    ]


def present(cluster, key) -> bool:
    return key in cluster.objects and not cluster.objects[key].deleted


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024, 1)
    raise RuntimeError("no VmHWM in /proc status")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return round((int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), 2)


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, max(0, round(q * (len(values) - 1))))]


async def main(runs: int, timeout: float) -> dict:
    template = yaml.safe_load((ROOT / "manifests/examples/rltrun-tiny.yaml").read_text())
    workdir = Path(tempfile.mkdtemp(prefix="rlt-bench-"))
    async with serve() as (cluster, url), aiohttp.ClientSession() as session:
        kubeconfig = write_kubeconfig(workdir / "kubeconfig", url)
        env = {
            **os.environ,
            "KUBECONFIG": str(kubeconfig),
            "RLT_OPERATOR_METRICS_PORT": "-1",
            "RLT_OPERATOR_HEALTH_PORT": "0",
            "PYTHONPATH": os.pathsep.join([str(ROOT / "operator"), str(ROOT / "training")]),
        }
        log = (workdir / "operator.log").open("w")  # noqa: SIM115 - the operator process writes it until it stops
        proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "from rlt.cli import main; raise SystemExit(main())",
                "operator",
                "--all-namespaces",
                "--quiet",
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 60
            while sum(1 for r in cluster._requests if r.params.get("watch") == "true") < 8:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"operator did not start; see {workdir / 'operator.log'}")
                await asyncio.sleep(0.1)
            first_request = len(cluster._requests)

            created: dict[str, float] = {}
            ready: dict[str, float] = {}
            t_start = time.monotonic()
            for i in range(runs):
                doc = copy.deepcopy(template)
                name = f"bench-{i:03d}"
                doc["metadata"] = {"name": name}
                async with session.post(f"{url}{RUN.collection_path(NS)}", json=doc) as r:
                    if r.status != 201:
                        raise RuntimeError(f"create {name}: HTTP {r.status} {await r.text()}")
                created[name] = time.monotonic()
                await asyncio.sleep(0)  # let the server stream the watch event
            deadline = time.monotonic() + timeout
            while len(ready) < runs and time.monotonic() < deadline:
                now = time.monotonic()
                for name in created:
                    if name not in ready and all(present(cluster, k) for k in first_stage_keys(name)):
                        ready[name] = now
                await asyncio.sleep(0.02)
            t_all = time.monotonic() - t_start
            rss = peak_rss_mb(proc.pid)
            op_cpu = cpu_seconds(proc.pid)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            log.close()

        by_verb: collections.Counter = collections.Counter()
        for r in cluster._requests[first_request:]:
            if r.headers.get("User-Agent", "").startswith(OPERATOR_AGENTS):
                path = r.url.path
                if "/events" in path:
                    by_verb["POST events"] += 1
                elif path.endswith("/status"):
                    by_verb[f"{r.method.value} status"] += 1
                else:
                    by_verb[
                        f"{r.method.value} {path.rstrip('/').split('/')[-1 if r.method.value == 'POST' else -2]}"
                    ] += 1
        total = sum(by_verb.values())
        latencies = [ready[n] - created[n] for n in ready]
        return {
            "runs": runs,
            "runs_with_all_first_stage_children": len(ready),
            "create_to_children_seconds": {
                "p50": round(percentile(latencies, 0.50), 3) if latencies else None,
                "p95": round(percentile(latencies, 0.95), 3) if latencies else None,
                "max": round(max(latencies), 3) if latencies else None,
                "mean": round(statistics.fmean(latencies), 3) if latencies else None,
            },
            "wall_seconds_all_runs": round(t_all, 2),
            "operator_peak_rss_mb": rss,
            "operator_cpu_seconds": op_cpu,
            "emulator_and_client_cpu_seconds": round(time.process_time(), 2),
            "operator_api_requests_per_run": round(total / runs, 2),
            "operator_api_requests_by_kind": dict(sorted(by_verb.items())),
            "api": "kmock + rlt_sandbox.kmock_glue (in-memory emulator, not a real apiserver)",
            "cpu_cores": os.cpu_count(),
        }


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--timeout", type=float, default=300, help="seconds to wait for all children")
    args = ap.parse_args()
    print(json.dumps(asyncio.run(main(args.runs, args.timeout)), indent=2))
