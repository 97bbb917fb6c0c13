"""rlt.checks.driver: the node's NVIDIA driver against the image's CUDA. No GPU here: the driver is simulated by a
stand-in `nvidia-smi` on PATH (NVML finds no libnvidia-ml.so.1 on this machine and falls back to it), the image's
CUDA by a stand-in nvidia-cuda-runtime distribution (its metadata only) on sys.path."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from rlt.checks import driver
from rlt.contract.exitcodes import ExitCode


def test_a_driver_older_than_the_cudas_floor_is_one_line_naming_both():
    line = driver.driver_problem("570.86.15", "13.0.96")
    assert line and line.startswith(driver.DRIVER_PREFIX) and "\n" not in line
    assert "580.65.06" in line and "570.86.15" in line and "CUDA 13.0.96" in line
    assert driver.driver_problem("580.65.06", "13.0.96") is None
    assert driver.driver_problem("580.95.05", "13.0.96") is None
    assert driver.driver_problem("590.44.01", "13.0.96") is None
    # CUDA 12 runs on R525
    assert driver.driver_problem("535.183.01", "12.8.90") is None
    assert "525.60.13" in driver.driver_problem("470.256.02", "12.8.90")
    # a CUDA newer than the table: at least the newest floor known
    assert "580.65.06" in driver.driver_problem("575.57.08", "14.0.1")
    # nothing to check: no driver visible (a CPU pod) or no CUDA runtime in the image (the CPU flavour)
    assert driver.driver_problem(None, "13.0.96") is None
    assert driver.driver_problem("570.86.15", None) is None


def test_an_older_driver_branch_is_refused_saying_no_forward_compatibility_is_shipped():
    """R535 and R570 (managed pools that lag): the images carry no cuda-compat libraries, so the line says so."""
    for old in ("535.247.01", "570.172.08"):
        line = driver.driver_problem(old, "13.0.96", "13.0", {"nvidia-cuda-nvcc": "13.0.88"})
        assert line and "forward-compatibility" in line and "R580" in line and old in line, line


def test_jit_wheels_of_a_newer_minor_than_the_drivers_cuda_are_refused():
    """The issue's image: a 13.0 runtime with 13.5 nvcc/nvJitLink on R580 (CUDA 13.0), whose PTX cannot load."""
    mixed = {"nvidia-cuda-nvcc": "13.5.37", "nvidia-cuda-nvrtc": "13.0.88", "nvidia-nvjitlink": "13.5.37"}
    line = driver.driver_problem("580.95.05", "13.0.96", "13.0", mixed)
    assert line == (
        "driver: this image's nvidia-cuda-nvcc 13.5.37, nvidia-nvjitlink 13.5.37 write PTX for CUDA 13.5, which "
        "the node's driver 580.95.05 (CUDA 13.0) cannot load: upgrade the node's driver to one for CUDA 13.5, or "
        "use an image whose CUDA wheels are all of its runtime's minor (hack/cuda_pins.py check)"
    )
    # the images' own wheels (all 13.0) on R580; the mixed ones on a driver for CUDA 13.5
    one = {"nvidia-cuda-nvcc": "13.0.88", "nvidia-cuda-nvrtc": "13.0.88", "nvidia-nvjitlink": "13.0.88"}
    assert driver.driver_problem("580.95.05", "13.0.96", "13.0", one) is None
    assert driver.driver_problem("600.10.01", "13.0.96", "13.5", mixed) is None
    # the driver's CUDA unknown (neither NVML nor nvidia-smi told it): only the branch floor is checked
    assert driver.driver_problem("580.95.05", "13.0.96", None, mixed) is None


def stand_ins(
    tmp_path: Path, driver_version: str, cuda: str | None = "13.0.96", driver_cuda: str | None = None, jit=()
) -> tuple[str, Path]:
    """(PATH with a stand-in nvidia-smi first, a folder holding stand-in CUDA wheels' metadata: nvidia-cuda-runtime
    and `jit`'s (name, version))."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    header = f"| NVIDIA-SMI {driver_version}   Driver Version: {driver_version}   CUDA Version: {driver_cuda}  |"
    smi.write_text(
        f'#!/bin/sh\n[ "$1" = --query-gpu=driver_version ] && echo {driver_version} && exit 0\n'
        + (f"echo '{header}'\n" if driver_cuda else "")
    )
    smi.chmod(0o755)
    site = tmp_path / "site"
    for name, version in [*([("nvidia-cuda-runtime", cuda)] if cuda else []), *jit]:
        info = site / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir(parents=True, exist_ok=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return f"{bin_dir}:/usr/bin:/bin", site


def test_the_check_reads_the_image_cuda_and_the_nodes_driver(tmp_path, monkeypatch):
    path, site = stand_ins(tmp_path, "570.86.15")
    monkeypatch.setenv("PATH", path)
    monkeypatch.syspath_prepend(str(site))
    assert driver.image_cuda() == "13.0.96"
    assert driver.node_driver() == "570.86.15"
    with pytest.raises(SystemExit) as stop:
        driver.vllm_plugin()  # the generator's start (vLLM's general plugin)
    assert stop.value.code == ExitCode.CONFIG_ERROR
    path, _ = stand_ins(tmp_path, "580.95.05")
    monkeypatch.setenv("PATH", path)
    assert driver.check() is None
    driver.vllm_plugin()  # goes on


def test_the_check_reads_the_drivers_cuda_and_the_images_jit_wheels(tmp_path, monkeypatch):
    path, site = stand_ins(tmp_path, "580.95.05", driver_cuda="13.0", jit=[("nvidia-nvjitlink", "13.5.37")])
    monkeypatch.setenv("PATH", path)
    monkeypatch.syspath_prepend(str(site))
    if driver.image_jit() != {"nvidia-nvjitlink": "13.5.37"}:
        pytest.skip(f"this environment has CUDA JIT wheels of its own ({driver.image_jit()})")
    assert driver.node_cuda() == "13.0"
    with pytest.raises(SystemExit) as stop:
        driver.vllm_plugin()
    assert stop.value.code == ExitCode.CONFIG_ERROR


def test_nvmls_cuda_version_is_read_as_major_minor(monkeypatch):
    """A stand-in pynvml answering what NVML answered on an H200 with driver 580.159.04 (2026-11-27):
    nvmlSystemGetDriverVersion '580.159.04', nvmlSystemGetCudaDriverVersion 13000 (nvidia-smi: CUDA Version 13.0)."""
    import types

    calls = []
    stand_in = types.SimpleNamespace(
        nvmlInit=lambda: calls.append("init"),
        nvmlShutdown=lambda: calls.append("shutdown"),
        nvmlSystemGetDriverVersion=lambda: "580.159.04",
        nvmlSystemGetCudaDriverVersion=lambda: 13000,
    )
    monkeypatch.setitem(sys.modules, "pynvml", stand_in)
    assert driver.node_driver() == "580.159.04" and driver.node_cuda() == "13.0"
    assert calls == ["init", "shutdown"] * 2
    stand_in.nvmlSystemGetCudaDriverVersion = lambda: 12090
    assert driver.node_cuda() == "12.9"


def test_no_cuda_runtime_in_the_image_checks_nothing(tmp_path, monkeypatch):
    path, site = stand_ins(tmp_path, "470.256.02", cuda=None)
    monkeypatch.setenv("PATH", path)
    monkeypatch.syspath_prepend(str(site))
    if driver.image_cuda() is not None:
        pytest.skip(f"this environment has a CUDA runtime wheel ({driver.image_cuda()})")
    assert driver.check() is None


def test_vllm_finds_the_plugin_through_its_entry_point():
    """The generator image installs rlt (no dependencies), and vLLM loads the `vllm.general_plugins` group."""
    import tomllib

    root = Path(driver.__file__).resolve().parents[3]
    eps = tomllib.loads((root / "pyproject.toml").read_text())["project"]["entry-points"]["vllm.general_plugins"]
    module, _, func = next(iter(eps.values())).partition(":")
    assert sys.modules[module] is driver and getattr(driver, func) is driver.vllm_plugin
