"""The node's NVIDIA driver against the CUDA of this image: a too-old driver stops a pod at its start with
CONFIG_ERROR (78) and one line naming the driver it needs, instead of a CUDA error that restarts the gang until
its backoff limit.

The image's CUDA major is read from its CUDA runtime wheel (nvidia-cuda-runtime 13.x, or nvidia-cuda-runtime-cuNN),
the one whose libcudart every CUDA extension of the image links; an image without one (the CPU flavour) checks
nothing. The driver's version comes from NVML (the nvidia-ml-py wheel, which vLLM's dependencies bring) or else
`nvidia-smi`; a pod that sees neither has no GPU and nothing to check. Standard library only besides NVML: it runs
in the trainer's preflight (rlt.checks.preflight) and, as a vLLM general plugin (pyproject's
`vllm.general_plugins` entry point, which vLLM loads in every process it starts, before any CUDA work), in the
generator; `python -m rlt.checks.driver` runs it alone.
"""

from __future__ import annotations

import importlib.metadata
import re
import shutil
import subprocess
import sys

from rlt.contract.exitcodes import ExitCode

# The oldest Linux driver each CUDA major runs on (NVIDIA's CUDA release notes, "CUDA Toolkit and Minimum Required
# Driver Version for CUDA Minor Version Compatibility": every 13.x runs on R580, every 12.x on R525).
MIN_DRIVER = {12: "525.60.13", 13: "580.65.06"}
RUNTIME_WHEELS = ("nvidia-cuda-runtime", "nvidia-cuda-runtime-cu13", "nvidia-cuda-runtime-cu12")
DRIVER_PREFIX = "driver:"  # the start of the CONFIG_ERROR line, as CAPACITY_PREFIX is the plan's


def image_cuda() -> str | None:
    """The CUDA runtime version this image's libraries are built for (e.g. 13.0.96), None without one."""
    for dist in RUNTIME_WHEELS:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def node_driver() -> str | None:
    """The NVIDIA driver's version (e.g. 580.95.05) from NVML, else nvidia-smi; None where the pod sees no driver."""
    try:
        import pynvml  # nvidia-ml-py

        pynvml.nvmlInit()
        try:
            version = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception:  # no wheel, or no libnvidia-ml.so.1 (no driver in this pod): try the CLI
        pass
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run(
            [smi, "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,  # a failing nvidia-smi is read as "unknown", below
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = out.stdout.split()
    return lines[0] if out.returncode == 0 and lines else None


def as_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version))


def driver_problem(driver: str | None, cuda: str | None) -> str | None:
    """One line when `driver` is older than what CUDA `cuda` needs; None when it is new enough or nothing to check."""
    if driver is None or cuda is None:
        return None
    major = as_tuple(cuda)[0]
    need = MIN_DRIVER.get(major)
    if need is None:
        # A CUDA this table does not know: newer than the table, so its floor is at least the newest one known.
        need = MIN_DRIVER[max(MIN_DRIVER)]
    if not as_tuple(driver) or as_tuple(driver) < as_tuple(need):
        return (
            f"{DRIVER_PREFIX} this image's CUDA {cuda} needs NVIDIA driver {need} or newer (R{need.split('.')[0]}); "
            f"the node has {driver}: upgrade the node's driver, or schedule the run on nodes that have it "
            "(spec.scheduling, docs/gpu-cluster.md)"
        )
    return None


def check() -> str | None:
    """The problem line for this pod's node and image, or None."""
    cuda = image_cuda()
    return driver_problem(node_driver(), cuda) if cuda else None


def exit_if_too_old() -> None:
    """Exit CONFIG_ERROR with the line on stderr when the driver is too old."""
    if problem := check():
        print(problem, file=sys.stderr, flush=True)
        raise SystemExit(int(ExitCode.CONFIG_ERROR))


def vllm_plugin() -> None:
    """vLLM's general plugin hook (entry point `vllm.general_plugins`): the generator's start."""
    exit_if_too_old()


def main() -> int:
    exit_if_too_old()
    print(f"driver: {node_driver() or 'none visible'}; image CUDA: {image_cuda() or 'none'}")
    return int(ExitCode.OK)


if __name__ == "__main__":
    raise SystemExit(main())
