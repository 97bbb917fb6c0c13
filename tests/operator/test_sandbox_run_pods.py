"""`rlt sandbox --run-pods` with a real kubectl: the tiny example goes sft → rl → distill → Succeeded with its pods
running as local processes; `kubectl get rlt` shows step and reward; the trainer's /metrics answers while it runs."""

from __future__ import annotations

import json
import shlex
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from suite_helpers import find_tool, tiny_doc

KUBECTL = find_tool("kubectl")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(1200),  # a tiny run takes 2 min on an idle machine, 8+ under load 12 on 2 cores
    pytest.mark.skipif(KUBECTL is None, reason="kubectl not installed"),
]


def test_sandbox_runs_the_tiny_example_to_succeeded(start_sandbox, tmp_path):
    pods_dir = tmp_path / "pods"
    # RLT_PROGRESS_URL unset: the sandbox points it at the local trainer itself
    sandbox = start_sandbox("--run-pods", str(pods_dir), env={"RLT_PROGRESS_INTERVAL": "1", "RLT_PROGRESS_URL": None})
    kubectl, output = sandbox.kubectl, sandbox.output

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
    run = tiny_doc()
    run["spec"]["stages"]["rl"]["steps"] = 12
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(run))
    kubectl("apply", "--validate=false", "-f", str(tmp_path / "tiny.yaml"))
    tables = []
    phase = ""
    try:
        while time.monotonic() - started < 420 and phase not in ("Succeeded", "Failed"):
            table = kubectl("get", "rlt", "tiny")
            tables.append(table)
            phase = table.splitlines()[1].split()[1]
            time.sleep(1)
    finally:
        finished.set()
        scraper.join(5)
    seconds = time.monotonic() - started
    print(f"\nrlt sandbox --run-pods: tiny example {phase} in {seconds:.0f} s (machine shared, under load)")
    assert phase == "Succeeded", "".join(output[-60:]) + "\n".join(tables[-3:])
    # The standard condition a GitOps tool or a script waits on (issue 45): Ready once the run has succeeded.
    assert "condition met" in kubectl("wait", "--for=condition=Ready", "rlt/tiny", "--timeout=10s")
    header = tables[0].splitlines()[0].split()
    assert header[:7] == ["NAME", "PHASE", "STAGE", "TRAINER", "STEP", "REWARD", "RESTARTS"]
    rl_rows = [t.splitlines()[1].split() for t in tables if " rl " in t]
    # STEP is "step" or "step/total"
    assert any(len(r) >= 6 and r[4].split("/")[0].isdigit() and _is_number(r[5]) for r in rl_rows), "".join(tables)
    assert scraped, "the trainer's /metrics never answered"
    logs = [line for line in output if line.startswith("pod default/tiny-")]
    for stage in ("sft", "rl", "distill"):
        assert any(f"tiny-{stage}-0-" in line and "Succeeded (exit 0)" in line for line in logs), logs
    log_file = Path(logs[0].split("log: ")[1].strip())
    assert log_file.exists() and log_file.read_text()
    assert (pods_dir / "volumes" / "default" / "tiny-data" / "tiny" / "distill" / "dataset.jsonl").exists()


def _is_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def test_a_failed_trainer_pods_error_line_is_on_the_run(start_sandbox, tmp_path):
    """A run whose dataset is a path on the researcher's laptop is held at the door with the way to get the file
    into the pod; one whose path is not on the run's volume: the trainer pod exits DATA_ERROR, and the cause (the
    pod's own one-line error) is in the RLTRun's condition, where `kubectl describe`/`get -o yaml` show it."""
    # as a user starts it: no RLT_PROGRESS_URL / RLT_PROGRESS_INTERVAL (the sandbox picks them for local pods)
    sandbox = start_sandbox("--run-pods", str(tmp_path / "pods"), env={"RLT_PROGRESS_URL": None})
    run = tiny_doc()
    run["metadata"]["name"] = "laptop-data"
    run["spec"]["dataset"] = {"source": "word.jsonl"}  # beside the run file on the researcher's laptop
    (tmp_path / "laptop.yaml").write_text(yaml.safe_dump(run))
    sandbox.kubectl("apply", "-f", str(tmp_path / "laptop.yaml"))
    reason = sandbox.kubectl_until("InvalidSpec", "get", "rlt", "laptop-data", "-o", "jsonpath={.status.reason}")
    assert reason == "InvalidSpec"
    said = sandbox.kubectl("get", "rlt", "laptop-data", "-o", "jsonpath={.status.message}")
    assert "spec.dataset.source: word.jsonl is a path on your machine" in said and "/data/" in said, said
    assert not sandbox.kubectl("get", "jobs", "-l", "rlt.dev/run=laptop-data", "-o", "name").strip()

    run["metadata"]["name"] = "own-data"
    run["spec"]["dataset"] = {"source": "/data/word.jsonl"}  # a path in the pod, but nothing put it on own-data-data
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(run))
    sandbox.kubectl("apply", "-f", str(tmp_path / "run.yaml"))
    phase = sandbox.kubectl_until("Failed", "get", "rlt", "own-data", "-o", "jsonpath={.status.phase}", seconds=240)
    assert phase == "Failed"
    # kubectl get rlt names the stage that failed (it was empty) and the reason.
    row = sandbox.kubectl("get", "rlt", "own-data").splitlines()[1].split()
    assert row[1:3] == ["Failed", "sft"] and "ConfigError" in row, row
    status = yaml.safe_load(sandbox.kubectl("get", "rlt", "own-data", "-o", "yaml"))["status"]
    messages = [c.get("message") or "" for c in status["conditions"]]
    failed = next(m for m in messages if "exited with DATA_ERROR (65)" in m)
    assert "spec.dataset.source: file " in failed and "word.jsonl does not exist" in failed, messages
    # What a user types next: the banner said pods run; `kubectl get pods` has a STATUS; `kubectl logs` is the log.
    # The data check is the trainer pod's init container `validate` (rlt preflight), as on a cluster: the pod is
    # Init:Error, the trainer never started, and the cause is in the init container's log.
    assert "each pod is a local process" in sandbox.banner and "nothing runs" not in sandbox.banner, sandbox.banner
    pod = failed.split("trainer pod ", 1)[1].split()[0]
    table = sandbox.kubectl("get", "pods", "-l", "rlt.dev/run=own-data").splitlines()
    assert table[0].split() == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"], table
    assert any(row.split()[:4] == [pod, "0/1", "Init:Error", "0"] for row in table[1:]), table
    log = sandbox.kubectl("logs", pod, "-c", "validate")
    assert "word.jsonl does not exist" in log and '"kind"' not in log, log
    not_started = sandbox.run("kubectl", "logs", pod, ok=False)
    assert f'container "trainer" in pod "{pod}" is waiting to start: PodInitializing' in not_started.stderr
    # The run's Failed Event says where the log is: that command, typed as given, prints the init container's error.
    events = json.loads(sandbox.kubectl("get", "events", "-o", "json"))["items"]
    said = [e["message"] for e in events if e["involvedObject"]["name"] == "own-data" and "its log: " in e["message"]]
    assert said, [e["message"] for e in events]
    hint = shlex.split(said[-1].split("its log: ", 1)[1].split(";", 1)[0])
    assert hint[:4] == ["kubectl", "-n", "default", "logs"] and hint[-2:] == ["-c", "validate"], hint
    assert "word.jsonl does not exist" in sandbox.run(*hint).stdout

    # The recipe of docs/gpu-cluster.md ("Your own dataset or model on the run's volume"): the file staged onto a
    # claim of one's own (under the sandbox, the claim's folder), named by its path under /data.
    staged = tmp_path / "pods" / "volumes" / "default" / "word-problems" / "datasets" / "word.jsonl"
    staged.parent.mkdir(parents=True)
    staged.write_text(
        "".join(
            json.dumps({"question": f"What is {i} + 2?", "reasoning_trace": f"{i} plus 2", "solution": str(i + 2)})
            + "\n"
            for i in range(12)
        )
    )
    run["metadata"]["name"] = "own-data-staged"
    run["spec"]["dataset"] = {"source": "/data/datasets/word.jsonl"}
    run["spec"]["storage"] = {"existingClaim": "word-problems"}
    claim = {  # the user's own claim, created first (without it the pods stay Pending, as on a cluster)
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "word-problems"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }
    (tmp_path / "claim.yaml").write_text(yaml.safe_dump(claim))
    sandbox.kubectl("apply", "--validate=false", "-f", str(tmp_path / "claim.yaml"))
    # rl long enough (several seconds) for the 2 s progress reads below to see it: the example's 3 steps can
    # finish between two reads on an idle machine
    run["spec"]["stages"]["rl"]["steps"] = 16
    (tmp_path / "staged.yaml").write_text(yaml.safe_dump(run))
    sandbox.kubectl("apply", "--validate=false", "-f", str(tmp_path / "staged.yaml"))
    done, tables = wait_for_phase(sandbox, "own-data-staged", 900)
    assert done == "Succeeded", sandbox.kubectl("get", "rlt", "own-data-staged", "-o", "yaml")
    assert (staged.parent.parent / "own-data-staged" / "distill" / "dataset.jsonl").exists()
    # The sandbox reads a --run-pods run's progress often enough (no RLT_PROGRESS_INTERVAL given here) for the
    # rl stage's STEP and REWARD (3 decimals) to show while it runs.
    rl_rows = [t.splitlines()[1].split() for t in tables if " rl " in t]
    # NAME PHASE STAGE TRAINER STEP REWARD ...: STEP and REWARD are the fifth and sixth columns
    shown = [r for r in rl_rows if len(r) >= 6 and r[4].split("/")[0].isdigit() and _is_number(r[5])]
    assert shown, "\n".join(tables)
    assert all(len(r[5].split(".")[-1]) <= 3 for r in shown), shown


def wait_for_phase(sandbox, name: str, seconds: float) -> tuple[str, list[str]]:
    """The run's final phase, and every `kubectl get rlt NAME` table seen until then (one a second)."""
    deadline = time.monotonic() + seconds
    phase, tables = "", []
    while time.monotonic() < deadline and phase not in ("Succeeded", "Failed"):
        table = sandbox.kubectl("get", "rlt", name)
        tables.append(table)
        phase = table.splitlines()[1].split()[1]
        time.sleep(1)
    return phase, tables


def test_two_runs_applied_at_once_both_succeed(start_sandbox, tmp_path):
    """Two tiny runs applied together: on a cluster each trainer pod has its own IP, here they share loopback, so
    with the rendered ports both sft pods would bind 9400 (the second dies, the run fails as ConfigError). The
    emulator gives each run its own ports, and the operator still reads each run's progress through its proxy."""
    sandbox = start_sandbox("--run-pods", str(tmp_path / "pods"), env={"RLT_PROGRESS_URL": None})
    names = ("pair-a", "pair-b")
    docs = []
    for name in names:
        run = tiny_doc()
        run["metadata"]["name"] = name
        # sft only: the stage whose pods overlap; rl and distill would only lengthen the test (same ports)
        run["spec"]["stages"]["rl"] = {"enabled": False}
        run["spec"]["stages"]["distill"] = {"enabled": False}
        # long enough for the two sft pods to overlap; different totals tell whose progress the operator read
        run["spec"]["stages"]["sft"]["maxSteps"] = {"pair-a": 6, "pair-b": 8}[name]
        docs.append(yaml.safe_dump(run))
    (tmp_path / "pair.yaml").write_text("---\n".join(docs))
    sandbox.kubectl("apply", "--validate=false", "-f", str(tmp_path / "pair.yaml"))
    phases: dict[str, str] = {}
    totals: dict[str, set[str]] = {n: set() for n in names}
    deadline = time.monotonic() + 360
    while time.monotonic() < deadline:
        for n in names:
            out = sandbox.kubectl("get", "rlt", n, "-o", "jsonpath={.status.phase}/{.status.progress.totalSteps}")
            phases[n], total = out.split("/")
            totals[n] |= {total} - {"", "0"}  # 0: the trainer's exporter is up, its total not yet set
        if all(p in ("Succeeded", "Failed") for p in phases.values()):
            break
        time.sleep(0.5)
    detail = "".join(sandbox.output[-80:]) + sandbox.kubectl("get", "rlt", "-o", "yaml")
    assert phases == {n: "Succeeded" for n in names}, detail
    # the pods' end lines follow the phase by up to one announcer pass (0.5 s; longer on a loaded machine)
    ended = time.monotonic() + 15
    while time.monotonic() < ended and sum(": Succeeded" in line for line in sandbox.output) < 2:
        time.sleep(0.2)
    lines = [line for line in sandbox.output if line.startswith("pod default/pair-")]
    started = [line for line in lines if "-sft-0-" in line and ": started" in line]
    assert len(started) == 2, lines
    first_end = next(i for i, line in enumerate(lines) if "Succeeded" in line or "Failed" in line)
    assert all(lines.index(line) < first_end for line in started), lines
    # the two sft pods ran at the same time (else nothing was shared), on different metrics ports
    metrics = {
        line.split("ports 9400->127.0.0.1:")[1].split()[0] if "ports 9400->" in line else "9400" for line in started
    }
    assert len(metrics) == 2, started
    # the operator read each run's own trainer (through the emulator's proxy), not whichever holds 9400
    assert totals == {"pair-a": {"6"}, "pair-b": {"8"}}, totals
