"""`rlt sandbox --run-pods`: the sandbox's pods run as local processes through the kubelet emulator.

Each container image is stood in for by a local bin folder (`--image NAME=BINDIR`); by default every image is this
Python environment (where `rlt`, `accelerate` and `torchrun` are installed). Pod log files are printed as the pods
start. Each run gets its own ports here (a cluster gives each pod its own IP; see rlt_sandbox.kubelet_emulator): the
first run keeps the rendered ones (the trainer's /metrics on 127.0.0.1:9400) while free, a run applied beside it gets
free ones, printed with its pods; the operator reads progress through the emulator's proxy, which knows them all.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

from rlt.contract.env import CACHE
from rlt_sandbox.kubelet_emulator import LocalKubelet
from rlt_sandbox.kubelet_model import ImageEnv, PodRun


def parse_images(specs: list[str]) -> dict[str, ImageEnv]:
    out = {}
    for spec in specs:
        name, sep, bin_dir = spec.rpartition("=")
        if not sep or not name or not Path(bin_dir).is_dir():
            raise SystemExit(f"--image {spec!r}: expected IMAGE=BINDIR with an existing folder")
        out[name] = ImageEnv(str(Path(bin_dir).absolute()), _python_env())
    return out


def baked_caches() -> dict[str, str]:
    """What an image would bake in, from this machine's caches: DeepSpeed's compiled CPU ops (minutes to compile)
    and the built-in models. The pods' own HOME is their /tmp emptyDir, as rendered."""
    home = Path(os.environ.get("HOME", str(Path.home())))
    from rlt.data.models import cache_root

    # torch's default build folder for this interpreter (with the variable set, torch adds no py3XX_cpu level)
    default = home / ".cache" / "torch_extensions" / f"py{sys.version_info.major}{sys.version_info.minor}_cpu"
    return {
        "TORCH_EXTENSIONS_DIR": os.environ.get("TORCH_EXTENSIONS_DIR", str(default)),
        CACHE.name: str(cache_root()),
    }


def _python_env() -> dict[str, str]:
    # A checkout run with PYTHONPATH (not installed) must reach the pods too: it is part of this "image".
    return {k: os.environ[k] for k in ("PYTHONPATH",) if os.environ.get(k)} | {"PYTHONUNBUFFERED": "1"} | baked_caches()


def default_image() -> ImageEnv:
    return ImageEnv(str(Path(sys.executable).parent), _python_env())


def local_progress_url(kubelet: LocalKubelet) -> str:
    """The operator reads progress from rank 0 of the trainer: here through the emulator's proxy, which maps the
    rendered metrics port to the one this run's pods got (RLT_PROGRESS_URL's {namespace} {run} {port})."""
    return f"{kubelet.proxy_url()}/metrics"


async def start(
    url: str,
    workdir: Path,
    images: list[str],
    node_labels: dict[str, str] | None = None,
    missing_images: list[str] | None = None,
) -> LocalKubelet:
    """Pods of every namespace run, also of one created after the start (`kubectl create namespace`)."""
    kubelet = LocalKubelet(
        url,
        workdir,
        images=parse_images(images),
        default_image=default_image(),
        follow_namespaces=True,
        node_labels=node_labels,
        missing_images=missing_images,
    )
    await kubelet.start()
    asyncio.get_running_loop().create_task(_announce(kubelet))
    return kubelet


async def _announce(kubelet: LocalKubelet) -> None:
    """One line per pod as it starts (where its log is), as it ends (its phase and exit code), and why it has not
    started when it cannot (an ImagePullBackOff pod is never announced as started)."""
    said: dict[str, str] = {}
    # Pods are kept here after the emulator forgets them: a Job deleted right after its pod ended (a run's cleanup)
    # takes the pod from `kubelet.pods` within one pass, and its end must still be said.
    known: dict[tuple[str, str], PodRun] = {}
    while True:
        known.update(kubelet.pods)
        for (ns, name), pod in list(known.items()):
            state = pod_state(pod)
            if state is not None and said.get(name) != state:
                said[name] = state
                extra = f" (exit {pod.exit_code})" if pod.exit_code is not None else ""
                moved = {r: p for r, p in pod.ports.items() if r != p and r in _declared(pod.container)}
                if moved and state == "started":
                    extra += " ports " + ", ".join(f"{r}->127.0.0.1:{p}" for r, p in sorted(moved.items()))
                where = "" if state.startswith("not started") else f"  log: {pod.log_path}"
                print(f"pod {ns}/{name}: {state}{extra}{where}", flush=True)
        for key in [k for k in known if k not in kubelet.pods]:
            del known[key]  # said once more after it left the emulator, now forgotten
        await asyncio.sleep(0.5)


def pod_state(pod: PodRun) -> str | None:
    """What the sandbox says of a pod: its end, "started" once a container of it runs, or why it has not started
    (a pull that fails, a claim that does not exist); None while it is being created."""
    if pod.phase in ("Succeeded", "Failed"):
        return pod.phase
    why = pod.waiting
    if why is not None and why.reason in ("ErrImagePull", "ImagePullBackOff"):  # alternating with each retry: one line
        return f"not started, ErrImagePull/ImagePullBackOff: image {pod.current.get('image')!r} cannot be pulled"
    if why is not None:
        return f"not started, {why.reason}: {why.message}"
    return "started" if pod.proc is not None else None


def _declared(container: dict[str, Any]) -> set[int]:
    return {int(p["containerPort"]) for p in container.get("ports") or []}
