"""The operator, the emulated API and the kubelet emulator together: rendered pods run as real local processes.

The trainer image is stood in for by this interpreter's venv (same entry points: rlt, accelerate, torchrun) with
this checkout first on PYTHONPATH; nothing of the rendered command line or env is changed for the tests.
"""

from __future__ import annotations

import contextlib
import json
import re
import sys
from pathlib import Path
from typing import Any

from op_harness import poll_until
from suite_helpers import ROOT as REPO

from rlt_sandbox.kubelet_emulator import LocalKubelet
from rlt_sandbox.kubelet_model import ImageEnv

WORLD_LINE = re.compile(r"^rlt-world stage=(\w+) rank=(\d+) world_size=(\d+) backend=(\w+) node_rank=(\d+)", re.M)


def trainer_image() -> ImageEnv:
    from rlt_sandbox.sandbox_pods import baked_caches

    return ImageEnv(
        str(Path(sys.executable).parent),
        {
            "PYTHONPATH": f"{REPO / 'training'}:{REPO / 'operator'}",
            "PYTHONUNBUFFERED": "1",
            "TOKENIZERS_PARALLELISM": "false",
            **baked_caches(),
        },
    )


@contextlib.asynccontextmanager
async def running_pods(harness, workdir: Path, **kwargs: Any):
    # A gang restart's SIGTERMed ranks get at most 5 s, not the trainer's 600 s grace period: a rank that waits
    # for a killed peer would hold the test for minutes (the kubelet emulator's own tests check the real period).
    kwargs.setdefault("grace_seconds", 5.0)
    kubelet = LocalKubelet(harness.url, workdir, default_image=trainer_image(), poll_seconds=0.2, **kwargs)
    await kubelet.start()
    try:
        yield kubelet
    finally:
        await kubelet.stop()


def pod_logs(kubelet: LocalKubelet, prefix: str, namespace: str = "default") -> dict[str, str]:
    """Container logs of every pod whose name starts with `prefix`, deleted pods included (their files stay)."""
    return {
        p.parent.name: p.read_text(errors="replace")
        for p in sorted((kubelet.workdir / "pods" / namespace).glob(f"{prefix}*/container.log"))
    }


def world_lines(text: str) -> list[dict[str, Any]]:
    return [
        {"stage": m[0], "rank": int(m[1]), "world": int(m[2]), "backend": m[3], "node": int(m[4])}
        for m in WORLD_LINE.findall(text)
    ]


def metrics_rows(claim: Path, run: str) -> list[dict[str, Any]]:
    path = claim / run / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def log_tails(logs: dict[str, str], chars: int = 3000) -> str:
    """The end of each pod's log, under its name: what a failure message can hold."""
    return "\n".join(f"--- {name}\n{text[-chars:]}" for name, text in logs.items())


async def wait_for(predicate, what: str, timeout: float, kubelet: LocalKubelet | None = None) -> Any:
    """poll_until, every 0.2 s, with every pod's log tail in the failure."""

    def logs() -> str:
        return "" if kubelet is None else log_tails(pod_logs(kubelet, ""))

    return await poll_until(predicate, what, timeout, every=0.2, detail=logs)
