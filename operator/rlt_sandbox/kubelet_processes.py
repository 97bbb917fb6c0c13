"""The emulated containers' processes as the kernel sees them: found by the tag in their environment (the stand-in
for a cgroup), killed together, and the free ports a run gets here."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
from pathlib import Path

from rlt_sandbox.kubelet_model import PodRun

TAG_VAR = "KUBELET_EMULATOR_CONTAINER"  # inherited by every process a container starts (launchers start sessions)


def tagged_processes(tag: str) -> list[int]:
    """Live processes of one emulated container, found by the tag in their environment."""
    if not tag:
        return []
    needle = f"{TAG_VAR}={tag}".encode()
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
                if state != "Z":
                    out.append(int(entry.name))
        except OSError:
            continue
    return out


def port_free(port: int) -> bool:
    """Whether `port` can be bound on all addresses now (the programs bind 0.0.0.0)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers bind: a TIME_WAIT is no owner
        try:
            sock.bind(("0.0.0.0", port))  # noqa: S104 - a probe, closed at once
        except OSError:
            return False
    return True


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("0.0.0.0", 0))  # noqa: S104
        return int(sock.getsockname()[1])


def kill_all(tag: str) -> None:
    for pid in tagged_processes(tag):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def process_env(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


def rank_processes(pod: PodRun) -> dict[int, int]:
    """{RANK: pid} of the training workers inside a pod (the launcher's children that carry a RANK)."""
    if pod.proc is None:
        return {}
    out = {}
    for pid in tagged_processes(pod.tag):
        env = process_env(pid)
        if "RANK" in env and "LOCAL_RANK" in env and pid != pod.proc.pid:
            out[int(env["RANK"])] = pid
    return out
