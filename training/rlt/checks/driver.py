"""The node's NVIDIA driver against the CUDA of this image: a too-old driver stops a pod at its start with
CONFIG_ERROR (78) and one line naming the driver it needs, instead of a CUDA error that restarts the gang until
its backoff limit.

The image's CUDA major is read from its CUDA runtime wheel (nvidia-cuda-runtime 13.x, or nvidia-cuda-runtime-cuNN),
the one whose libcudart every CUDA extension of the image links; an image without one (the CPU flavour) checks
nothing. The image's JIT wheels (nvcc, NVRTC, nvJitLink) must be of a CUDA minor the driver supports (the driver's
CUDA version from NVML or nvidia-smi): PTX written for a newer minor does not load. The driver's version comes from NVML (the nvidia-ml-py wheel, which vLLM's dependencies bring) or else
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
# The wheels that write PTX at run time (nvcc: DeepSpeed's and FlashInfer's JIT ops; NVRTC: run-time kernels,
# cuBLAS) or link it (nvJitLink): a driver loads PTX only of the CUDA versions it supports, so the minor of each
# must be at most the driver's CUDA (R580: 13.0), whatever the runtime's. hack/cuda_pins.py pins them to the
# runtime's minor; this is the pod's own look at what its image really holds.
JIT_WHEELS = ("nvidia-cuda-nvcc", "nvidia-cuda-nvrtc", "nvidia-nvjitlink")
DRIVER_PREFIX = "driver:"  # the start of the CONFIG_ERROR line, as CAPACITY_PREFIX is the plan's


def image_cuda() -> str | None:
    """The CUDA runtime version this image's libraries are built for (e.g. 13.0.96), None without one."""
    for dist in RUNTIME_WHEELS:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def image_jit() -> dict[str, str]:
    """{wheel: version} of the image's JIT_WHEELS (none in the CPU flavour)."""
    found = {}
    for dist in JIT_WHEELS:
        try:
            found[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def nvml(query: str) -> object | None:
    """pynvml.<query>() between init and shutdown; None without the wheel or libnvidia-ml.so.1 (no driver here)."""
    try:
        import pynvml  # nvidia-ml-py

        pynvml.nvmlInit()
        try:
            answer: object = getattr(pynvml, query)()
            return answer
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no wheel, no library, or a driver without the call: the caller tries nvidia-smi
        return None


def smi(*args: str) -> str | None:
    """nvidia-smi's output, None where it is missing or fails."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, *args], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def node_driver() -> str | None:
    """The NVIDIA driver's version (e.g. 580.95.05) from NVML, else nvidia-smi; None where the pod sees no driver."""
    version = nvml("nvmlSystemGetDriverVersion")
    if version is not None:
        return version.decode() if isinstance(version, bytes) else str(version)
    lines = (smi("--query-gpu=driver_version", "--format=csv,noheader") or "").split()
    return lines[0] if lines else None


def node_cuda() -> str | None:
    """The newest CUDA the node's driver supports (e.g. 13.0: NVML's 13000), else nvidia-smi's `CUDA Version`."""
    version = nvml("nvmlSystemGetCudaDriverVersion")
    if isinstance(version, int) and version > 0:
        return f"{version // 1000}.{version % 1000 // 10}"
    m = re.search(r"CUDA Version:\s*(\d+\.\d+)", smi() or "")
    return m.group(1) if m else None


def as_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version))


def driver_problem(
    driver: str | None, cuda: str | None, driver_cuda: str | None = None, jit: dict[str, str] | None = None
) -> str | None:
    """One line when `driver` is older than what CUDA `cuda` needs, or when the image's JIT wheels (`jit`,
    {wheel: version}) are of a newer CUDA minor than the driver's (`driver_cuda`, e.g. 13.0); None when the driver
    is new enough or there is nothing to check."""
    if driver is None or cuda is None:
        return None
    return too_old(driver, cuda) or jit_too_new(driver, driver_cuda, jit or {})


def too_old(driver: str, cuda: str) -> str | None:
    """The driver below the CUDA major's floor. No forward-compatibility library (cuda-compat) is in the images,
    so an older branch (R535, R570) is refused, not rescued (docs/gpu-cluster.md says why)."""
    major = as_tuple(cuda)[0]
    need = MIN_DRIVER.get(major)
    if need is None:
        # A CUDA this table does not know: newer than the table, so its floor is at least the newest one known.
        need = MIN_DRIVER[max(MIN_DRIVER)]
    if not as_tuple(driver) or as_tuple(driver) < as_tuple(need):
        return (
            f"{DRIVER_PREFIX} this image's CUDA {cuda} needs NVIDIA driver {need} or newer (R{need.split('.')[0]}); "
            f"the node has {driver}, and the image carries no CUDA forward-compatibility libraries for older "
            "drivers: upgrade the node's driver, or schedule the run on nodes that have it "
            "(spec.scheduling, docs/gpu-cluster.md)"
        )
    return None


def jit_too_new(driver: str, driver_cuda: str | None, jit: dict[str, str]) -> str | None:
    """The JIT wheels whose minor is newer than the driver's CUDA: the PTX they write does not load."""
    if driver_cuda is None or not as_tuple(driver_cuda):
        return None
    newer = {d: v for d, v in jit.items() if as_tuple(v)[:2] > as_tuple(driver_cuda)[:2]}
    if not newer:
        return None
    wants = ".".join(str(p) for p in max(as_tuple(v)[:2] for v in newer.values()))
    return (
        f"{DRIVER_PREFIX} this image's {', '.join(f'{d} {v}' for d, v in sorted(newer.items()))} write PTX for "
        f"CUDA {wants}, which the node's driver {driver} (CUDA {driver_cuda}) cannot load: upgrade the node's driver "
        f"to one for CUDA {wants}, or use an image whose CUDA wheels are all of its runtime's minor "
        "(hack/cuda_pins.py check)"
    )


def check() -> str | None:
    """The problem line for this pod's node and image, or None."""
    cuda = image_cuda()
    if not cuda:
        return None
    driver = node_driver()
    return driver_problem(driver, cuda, node_cuda() if driver else None, image_jit())


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
    print(
        f"driver: {node_driver() or 'none visible'} (CUDA {node_cuda() or 'unknown'}); "
        f"image CUDA: {image_cuda() or 'none'}; JIT: {image_jit() or 'none'}"
    )
    return int(ExitCode.OK)


if __name__ == "__main__":
    raise SystemExit(main())
