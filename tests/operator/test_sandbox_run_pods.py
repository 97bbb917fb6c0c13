"""`rlt sandbox --run-pods` with a real kubectl: the tiny example goes sft → rl → distill → Succeeded with its pods
running as local processes; `kubectl get rlt` shows step and reward; the trainer's /metrics answers while it runs."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from test_sandbox import KUBECTL, ROOT, free_port

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(600),
    pytest.mark.skipif(KUBECTL is None, reason="kubectl not installed"),
]


def test_sandbox_runs_the_tiny_example_to_succeeded(tmp_path):
    port = free_port()
    kubeconfig = tmp_path / "kubeconfig"
    pods_dir = tmp_path / "pods"
    env = {**os.environ, "RLT_OPERATOR_METRICS_PORT": "-1", "RLT_RESYNC_SECONDS": "2", "RLT_PROGRESS_INTERVAL": "1"}
    env.pop("KUBECONFIG", None)
    env.pop("RLT_PROGRESS_URL", None)  # the sandbox points it at the local trainer itself
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from rlt.cli import main; raise SystemExit(main())",
            "sandbox",
            "--port",
            str(port),
            "--kubeconfig",
            str(kubeconfig),
            "--run-pods",
            str(pods_dir),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=ROOT,
    )
    output: list[str] = []
    reader = threading.Thread(target=lambda: output.extend(iter(proc.stdout.readline, "")), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 60
        while not any("Ctrl-C" in line for line in output) and time.monotonic() < deadline:
            time.sleep(0.2)

        def kubectl(*args: str) -> str:
            out = subprocess.run(
                [KUBECTL, f"--kubeconfig={kubeconfig}", f"--cache-dir={tmp_path / 'cache'}", *args],
                capture_output=True,
                text=True,
                timeout=30,
            )
            assert out.returncode == 0, out.stderr
            return out.stdout

        # Rank 0's /metrics, read as a Prometheus scrape would. The rl stage of the tiny example can be up for only a
        # few seconds on a fast machine, so a thread polls it often, apart from the slower kubectl loop.
        scraped: list = []
        finished = threading.Event()

        def scrape() -> None:
            while not finished.is_set():
                try:
                    text = urllib.request.urlopen("http://127.0.0.1:9400/metrics", timeout=2).read().decode()
                    families = text_string_to_metric_families(text)
                    scraped.extend(s for f in families for s in f.samples if s.name == "rlt_step")
                except OSError:
                    pass
                finished.wait(0.1)

        scraper = threading.Thread(target=scrape, daemon=True)
        scraper.start()
        started = time.monotonic()
        # The tiny example with more rl steps, so that its rl stage runs long enough to be read a few times.
        run = yaml.safe_load((ROOT / "manifests/examples/rltrun-tiny.yaml").read_text())
        run["spec"]["stages"]["rl"]["steps"] = 12
        (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(run))
        kubectl("apply", "--validate=false", "-f", str(tmp_path / "tiny.yaml"))
        tables = []
        phase = ""
        while time.monotonic() - started < 420 and phase not in ("Succeeded", "Failed"):
            table = kubectl("get", "rlt", "tiny")
            tables.append(table)
            phase = table.splitlines()[1].split()[1]
            time.sleep(1)
        finished.set()
        scraper.join(5)
        seconds = time.monotonic() - started
        print(f"\nrlt sandbox --run-pods: tiny example {phase} in {seconds:.0f} s (machine shared, under load)")
        assert phase == "Succeeded", "".join(output[-60:]) + "\n".join(tables[-3:])
        header = tables[0].splitlines()[0].split()
        assert header[:6] == ["NAME", "PHASE", "STAGE", "STEP", "REWARD", "RESTARTS"]
        rl_rows = [t.splitlines()[1].split() for t in tables if " rl " in t]
        # STEP is "step" or "step/total"
        assert any(len(r) >= 5 and r[3].split("/")[0].isdigit() and _is_number(r[4]) for r in rl_rows), "".join(tables)
        assert scraped, "the trainer's /metrics never answered"
        logs = [line for line in output if line.startswith("pod default/tiny-")]
        for stage in ("sft", "rl", "distill"):
            assert any(f"tiny-{stage}-0-" in line and "Succeeded (exit 0)" in line for line in logs), logs
        log_file = Path(logs[0].split("log: ")[1].strip())
        assert log_file.exists() and log_file.read_text()
        assert (pods_dir / "volumes" / "default" / "tiny-data" / "tiny" / "distill" / "dataset.jsonl").exists()
    finally:
        proc.terminate()
        proc.wait(30)


def _is_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False
