"""`rlt sandbox --run-pods`: the sandbox's pods run as local processes through the kubelet emulator.

Each container image is stood in for by a local bin folder (`--image NAME=BINDIR`); by default every image is this
Python environment (where `rlt`, `accelerate` and `torchrun` are installed). Pod log files are printed as the pods
start; the trainer's rank 0 serves its /metrics on 127.0.0.1:9400 as rendered, and the operator reads progress there.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from rlt_operator import builders as b
from rlt_sandbox.kubelet_emulator import ImageEnv, LocalKubelet


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
    from rlt.run.models import cache_root

    # torch's default build folder for this interpreter (with the variable set, torch adds no py3XX_cpu level)
    default = home / ".cache" / "torch_extensions" / f"py{sys.version_info.major}{sys.version_info.minor}_cpu"
    return {
        "TORCH_EXTENSIONS_DIR": os.environ.get("TORCH_EXTENSIONS_DIR", str(default)),
        "RLT_CACHE": str(cache_root()),
    }


def _python_env() -> dict[str, str]:
    # A checkout run with PYTHONPATH (not installed) must reach the pods too: it is part of this "image".
    return {k: os.environ[k] for k in ("PYTHONPATH",) if os.environ.get(k)} | {"PYTHONUNBUFFERED": "1"} | baked_caches()


def default_image() -> ImageEnv:
    return ImageEnv(str(Path(sys.executable).parent), _python_env())


def local_progress_url() -> str:
    """The operator reads progress from rank 0 of the trainer: on this machine that is loopback."""
    return f"http://127.0.0.1:{b.METRICS_PORT}/metrics"


async def start(url: str, workdir: Path, namespaces: list[str], images: list[str]) -> LocalKubelet:
    kubelet = LocalKubelet(
        url, workdir, images=parse_images(images), default_image=default_image(), namespaces=namespaces
    )
    await kubelet.start()
    asyncio.get_running_loop().create_task(_announce(kubelet))
    return kubelet


async def _announce(kubelet: LocalKubelet) -> None:
    """One line per pod as it starts (where its log is) and as it ends (its phase and exit code)."""
    said: dict[str, str] = {}
    while True:
        for (ns, name), pod in list(kubelet.pods.items()):
            state = pod.phase if pod.phase in ("Succeeded", "Failed") else "started"
            if said.get(name) != state:
                said[name] = state
                extra = f" (exit {pod.exit_code})" if pod.exit_code is not None else ""
                print(f"pod {ns}/{name}: {state}{extra}  log: {pod.log_path}", flush=True)
        await asyncio.sleep(0.5)
