"""`rlt monitor`: the chart's monitoring on a laptop. A real Prometheus (from `make tools`) scrapes a local run's
rank-0 exporter and, optionally, the sandbox's operator through the scrape config the chart's ServiceMonitor becomes,
evaluates the chart's alert rules, and the chart's dashboards are drawn as PNGs from the same queries (Grafana needs a
container runtime; where one exists, the provisioning files written here load the same dashboards into it).

With a run file it starts the run itself (`rlt run FILE --metrics-port P`) and stops when the run has finished and
the dashboards are drawn once more; without one it scrapes whatever serves on the given ports until Ctrl-C.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rlt_sandbox.dashboard_render import Drawn
from rlt_sandbox.prometheus_sd import service_targets, servicemonitor_scrape_configs

# A checkout's chart: the dashboards, alert rules and ServiceMonitor that the cluster install uses.
REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "rlt-operator"
TOOLS_BIN = REPO / ".tools" / "bin"
SCRAPE_INTERVAL = "5s"
RELEASE_NAMESPACE = "rlt-system"


def find_tool(name: str) -> str | None:
    """A binary from `make tools` (.tools/bin), this Python's bin folder or PATH."""
    where = [str(TOOLS_BIN), str(Path(sys.executable).parent), os.environ.get("PATH", "")]
    return shutil.which(name, path=os.pathsep.join(where))


def need_tool(name: str) -> str:
    found = find_tool(name)
    if found is None:
        raise SystemExit(f"rlt monitor: {name} not found: run `make tools` (it puts {name} in .tools/bin)")
    return found


def render_chart(
    helm: str, *sets: str, chart: Path = CHART, namespace: str = RELEASE_NAMESPACE
) -> list[dict[str, Any]]:
    """The chart rendered by the real helm with its monitoring objects on (ServiceMonitor, PodMonitor, rules)."""
    args = [helm, "template", "rel", str(chart), "--namespace", namespace]
    args += ["--set", "image.repository=registry.example.com/rlt/rlt-operator"]
    args += ["-f", str(chart / "ci" / "monitoring-values.yaml"), "--api-versions", "monitoring.coreos.com/v1"]
    for s in sets:
        args += ["--set", s]
    out = subprocess.run(args, capture_output=True, text=True, timeout=120, check=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def one_of_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [d for d in docs if d.get("kind") == kind]
    if len(found) != 1:
        raise ValueError(f"the chart rendered {len(found)} {kind} objects, expected one")
    return found[0]


def prometheus_config(
    work: Path, trainer: str | None, operator: str | None, helm: str | None, interval: str = SCRAPE_INTERVAL
) -> dict[str, Any]:
    """Prometheus' configuration: the trainer's exporter as a static target (honor_labels: its own run and namespace
    labels stand, as the chart's PodMonitor keeps them), the operator through the chart's ServiceMonitor (its Service
    as the discovered target), and the chart's alert rules."""
    scrape: list[dict[str, Any]] = []
    if trainer:
        scrape.append({"job_name": "rlt-trainer", "honor_labels": True, "static_configs": [{"targets": [trainer]}]})
    if operator:
        if helm is None:
            raise SystemExit(
                "rlt monitor: --operator needs helm to render the chart's ServiceMonitor: run `make tools`"
            )
        chart = render_chart(helm)
        sd_file = work / "operator-endpoints.json"
        service = one_of_kind(chart, "Service")
        sd_file.write_text(json.dumps(service_targets(service, operator, "rel-rlt-operator-0", "operator")))
        scrape += servicemonitor_scrape_configs(one_of_kind(chart, "ServiceMonitor"), sd_file, interval)
    rules = sorted(str(p) for p in (CHART / "files" / "alerts").glob("*.yaml"))
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "rule_files": rules,
        "scrape_configs": scrape,
    }


def grafana_provisioning(work: Path, prometheus_url: str) -> Path:
    """Provisioning files for Grafana's official image: the local Prometheus as the datasource, the chart's
    dashboards as a file provider. Returns the folder to mount at /etc/grafana/provisioning."""
    root = work / "grafana" / "provisioning"
    (root / "datasources").mkdir(parents=True, exist_ok=True)
    (root / "dashboards").mkdir(parents=True, exist_ok=True)
    datasource = {"name": "Prometheus", "type": "prometheus", "url": prometheus_url, "isDefault": True}
    (root / "datasources" / "rlt.yaml").write_text(yaml.safe_dump({"apiVersion": 1, "datasources": [datasource]}))
    provider = {"name": "rlt", "type": "file", "options": {"path": "/var/lib/grafana/dashboards/rlt"}}
    (root / "dashboards" / "rlt.yaml").write_text(yaml.safe_dump({"apiVersion": 1, "providers": [provider]}))
    return root


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:  # noqa: S310 - loopback only
            return bool(r.status == 200)
    except OSError:
        return False


@dataclass
class Stack:
    """The processes `rlt monitor` started, stopped together."""

    work: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def start(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        log = (self.work / f"{name}.log").open("wb")
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(proc)
        return proc

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in reversed(self.procs):
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


def start_prometheus(stack: Stack, config: dict[str, Any], port: int) -> str:
    prometheus = need_tool("prometheus")
    path = stack.work / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    promtool = find_tool("promtool")
    if promtool:  # a config mistake is one line here, not a Prometheus that exits at once
        check = subprocess.run([promtool, "check", "config", str(path)], check=False, capture_output=True, text=True)
        if check.returncode != 0:
            raise SystemExit(f"rlt monitor: promtool refused {path}:\n{check.stdout}{check.stderr}")
    proc = stack.start(
        "prometheus",
        [
            prometheus,
            f"--config.file={path}",
            f"--storage.tsdb.path={stack.work / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(120):
        if ready(f"{url}/-/ready"):
            return url
        if proc.poll() is not None:
            break
        time.sleep(0.5)
    log = (stack.work / "prometheus.log").read_text()[-2000:]
    raise SystemExit(f"rlt monitor: Prometheus did not become ready on {url}:\n{log}")


def say_now(line: str) -> None:
    print(line, flush=True)


class Stopped(KeyboardInterrupt):
    """Ctrl-C or SIGTERM while `rlt monitor` watches."""


def stop_on_signals() -> list[bool]:
    """SIGINT and SIGTERM end the watch: a flag set, and KeyboardInterrupt raised at once. Set explicitly because a
    process started with SIGINT ignored (a launcher's, a test worker's) inherits that, and Python then installs no
    Ctrl-C handler of its own; the flag also ends the loop if a library catches the exception mid-drawing."""
    stopped = [False]

    def stop(signum: int, frame: object) -> None:
        stopped[0] = True
        raise Stopped(signal.Signals(signum).name)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stop)
    return stopped


def watch(
    run: subprocess.Popen[bytes] | None,
    draw: Callable[[], Drawn],
    every_s: float,
    say: Callable[[str], None] = say_now,
) -> int:
    """Draw the dashboards every `every_s` seconds until the run ends (then once more) or until Ctrl-C/SIGTERM."""
    next_draw = time.monotonic()
    stopped = stop_on_signals()
    try:
        while (run is None or run.poll() is None) and not stopped[0]:
            if time.monotonic() >= next_draw:
                say(summary(draw()))
                next_draw = time.monotonic() + every_s
            time.sleep(1)
    except KeyboardInterrupt:
        stopped[0] = True
    if stopped[0]:
        say("[monitor] stopped (Ctrl-C)")
        return 130
    time.sleep(2 * float(SCRAPE_INTERVAL.rstrip("s")))  # the run's last samples are scraped before the last draw
    say(summary(draw()))
    code = run.returncode if run is not None else 0
    say(f"[monitor] the run ended (exit {code}); the dashboards above are its last drawing")
    return code


def summary(drawn: Drawn) -> str:
    line = f"[monitor] {len(drawn.paths)} dashboards drawn, {drawn.panels - len(drawn.empty)} of {drawn.panels} panels"
    line += " with data"
    if drawn.empty:
        line += "; without: " + "; ".join(drawn.empty)
    return line


GRAFANA_IMAGE = "grafana/grafana:13.2.3"  # the release of the @grafana/schema the dashboards are typed against


def run_monitor(
    run_file: Path | None,
    run_name: str | None,
    trainer: str | None,
    operator: str | None,
    port: int,
    out_dir: Path | None,
    every_s: float,
    work: Path,
    say: Callable[[str], None] = say_now,
) -> int:
    """Prometheus on `port` scraping the run (started here from `run_file`, or already serving at `trainer`) and the
    operator, the dashboards drawn into `out_dir` every `every_s` seconds. Returns the run's exit code."""
    from rlt_sandbox.dashboard_render import draw_all

    if run_file is not None:
        trainer = trainer or f"127.0.0.1:{free_port()}"
    out_dir = out_dir or Path("results") / (run_name or "monitor") / "dashboards"
    work.mkdir(parents=True, exist_ok=True)
    stack = Stack(work)
    try:
        url = start_prometheus(stack, prometheus_config(work, trainer, operator, find_tool("helm")), port)
        say(
            f"[monitor] Prometheus {url} (graph: {url}/graph, alerts: {url}/alerts) scrapes "
            + ", ".join(
                f"{what} {where}" for what, where in (("the run", trainer), ("the operator", operator)) if where
            )
        )
        provisioning = grafana_provisioning(work, url)
        say(
            "[monitor] Grafana, where a container runtime exists: docker run --rm --network host "
            f"-v {provisioning}:/etc/grafana/provisioning -v {CHART / 'files' / 'dashboards'}:/var/lib/grafana/"
            f"dashboards/rlt {GRAFANA_IMAGE}  -> http://127.0.0.1:3000"
        )
        say(f"[monitor] the chart's dashboards as PNGs every {every_s:.0f} s -> {out_dir}")
        run = None
        if run_file is not None:
            metrics_port = trainer.rsplit(":", 1)[1] if trainer else "0"
            linger = str(3 * int(SCRAPE_INTERVAL.rstrip("s")))  # the last samples are scraped after the run ends
            args = [sys.executable, "-m", "rlt.cli", "run", str(run_file), "--metrics-port", metrics_port]
            run = subprocess.Popen([*args, "--linger", linger])
            say(f"[monitor] started: rlt run {run_file} --metrics-port {metrics_port}")

        def draw() -> Drawn:
            return draw_all(url, CHART / "files" / "dashboards", out_dir)

        return watch(run, draw, every_s, say)
    finally:
        stack.stop()
