"""The CUDA flavour of the trainer and generator images, checked without a GPU (`make images-test-cuda`, several GB
each, run by hand): what imports, what links, which CUDA, the tiny example's sft and rl stages on CPU (a CUDA torch
runs on CPU) as the operator renders them, the preflight's peak memory against its limit, the driver check
against a simulated old driver, `pip check`, and DeepSpeed's op builder compiling a CUDA op with the image's nvcc. Built by `hack/images.py build --flavour cuda` (cached by its inputs)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from image_helpers import ROOT, images, pins
from test_trainer_generator_images import chown_for, mounts, pod_env, pod_mounts, rendered

from rlt.contract.exitcodes import ExitCode
from rlt.contract.layout import RunLayout
from rlt_operator import builders as b

pytestmark = [pytest.mark.timeout(3600), pytest.mark.image_build_cuda]

# Libraries the node's driver brings into the container (the NVIDIA container toolkit mounts them from the host):
# no image has them, and ldd of a library that links one says `not found` here.
DRIVER_LIBRARIES = {"libcuda.so.1"}  # the CUDA driver API (NVML's libnvidia-ml.so.1 is dlopened, not linked)
# Optional plugins that link what neither the image nor the driver has, each loaded only when configured to be.
OPTIONAL_PLUGINS = {
    # NVSHMEM's bootstraps and transports for MPI, OpenSHMEM, PMIx, UCX and libfabric (NVSHMEM_BOOTSTRAP,
    # NVSHMEM_REMOTE_TRANSPORT); vLLM and torch use its default ones
    r"nvidia/nvshmem/lib/nvshmem_(bootstrap|transport)_(mpi|shmem|pmix|ucx|libfabric)\.so\.\d+",
    # Triton's example and test plugins (TRITON_PLUGIN_PATHS), which link libtriton.so by name
    r"triton/plugins/lib\w+\.so[\w.]*",
}


@pytest.fixture(scope="module")
def trainer_image():
    return images.rootfs("trainer", "cuda")


@pytest.fixture(scope="module")
def generator_image():
    return images.rootfs("generator", "cuda")


def run_in(image: Path, argv: list[str], *, timeout: float = 900, **kw) -> subprocess.CompletedProcess:
    proc = images.run_rootfs(image, argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)
    out = proc.communicate(timeout=timeout)[0]
    return subprocess.CompletedProcess(argv, proc.returncode, out)


def python_in(image: Path, code: str, **kw) -> subprocess.CompletedProcess:
    return run_in(image, ["python3", "-W", "ignore", "-c", code], **kw)


NO_GPU = {"VLLM_TARGET_DEVICE": "cpu"}


def test_trainer_imports_grpo_deepspeed_and_vllm(trainer_image):
    out = python_in(trainer_image, "from trl import GRPOTrainer; import deepspeed, vllm, transformers; print('ok')")
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stdout[-4000:]


def test_generator_entrypoint_answers_help(generator_image, tiny_run, tmp_path):
    config = json.loads((generator_image / "config.json").read_text())
    assert tuple(config["Entrypoint"]) == b.GENERATOR_ENTRYPOINT
    pod, c = rendered(tiny_run, "generator", "rl")
    log = tmp_path / "help.log"
    # VLLM_TARGET_DEVICE=cpu: with no GPU, vLLM's CUDA platform is not detected and its argument parser cannot
    # infer a device; on a GPU node NVML finds the GPU and the variable is not needed
    rc = run_rendered(generator_image, pod, c, [*config["Entrypoint"], "--help"], {}, log, timeout=900, env=NO_GPU)
    assert rc == 0 and "--weight-transfer-config" in log.read_text(), log.read_text()[-4000:]


# Every shared library under these site-packages folders, checked with ldd. LD_LIBRARY_PATH is torch/lib and
# nvidia/cu13/lib, what `import torch` loads into the process first (torch._load_global_deps): vLLM's extensions link
# libtorch, libcudart and libnvrtc without a RUNPATH to them; everything else must resolve by its own RUNPATH or the
# system's paths.
LDD_SCRIPT = r"""
set -u
sp=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
export LD_LIBRARY_PATH="$sp/torch/lib:$(ls -d "$sp"/nvidia/cu[0-9]*/lib | tr '\n' :)"
n=0
for d in "$@"; do
  [ -d "$sp/$d" ] || { echo "MISSING-PACKAGE $d"; continue; }
  while IFS= read -r -d '' so; do
    n=$((n+1))
    ldd "$so" 2>&1 | grep 'not found' | sed "s|^|NOTFOUND ${so#$sp/} |"
  done < <(find "$sp/$d" -name '*.so*' -type f -print0)
done
echo "CHECKED $n"
"""


def ldd_missing(image: Path, packages: list[str]) -> tuple[int, dict[str, set[str]]]:
    """(how many libraries ldd read, {library not found: {the .so files that link it}}) bar OPTIONAL_PLUGINS."""
    out = run_in(image, ["bash", "-c", LDD_SCRIPT, "ldd", *packages], timeout=1800)
    assert out.returncode == 0, out.stdout[-4000:]
    assert "MISSING-PACKAGE" not in out.stdout, out.stdout[-2000:]
    missing: dict[str, set[str]] = {}
    for line in out.stdout.splitlines():
        if line.startswith("NOTFOUND "):
            _, so, lib = line.split(None, 3)[:3]
            if not any(re.fullmatch(pattern, so) for pattern in OPTIONAL_PLUGINS):
                missing.setdefault(lib, set()).add(so)
    checked = int(re.search(r"CHECKED (\d+)", out.stdout).group(1))
    return checked, missing


@pytest.mark.parametrize(
    "image,packages",
    [
        ("trainer", ["torch", "vllm", "deepspeed", "triton", "nvidia", "flashinfer", "cuda"]),
        ("generator", ["torch", "vllm", "triton", "nvidia", "flashinfer", "cuda"]),
    ],
)
def test_every_shared_library_resolves_but_the_drivers(image, packages, request):
    image_dir = request.getfixturevalue(f"{image}_image")
    checked, missing = ldd_missing(image_dir, packages)
    print(f"{image}: ldd over {checked} shared libraries; not found: {sorted(missing)}")
    assert checked > 100
    assert set(missing) <= DRIVER_LIBRARIES, {lib: sorted(sos)[:5] for lib, sos in missing.items()}


# vLLM's compiled extensions (vllm/*.so): the CUDA runtime each links, resolved where `import torch` loads it from.
CUDA_OF = r"""
import glob, importlib.metadata as m, subprocess, sysconfig, os, re, torch, vllm
sp = sysconfig.get_paths()["purelib"]
libs = sp + "/torch/lib:" + ":".join(glob.glob(sp + "/nvidia/cu*/lib"))
cudart = set()
for so in sorted(glob.glob(sp + "/vllm/*.so")):
    ldd = subprocess.run(["ldd", so], capture_output=True, text=True, env={"LD_LIBRARY_PATH": libs}).stdout
    cudart |= {(m, os.path.realpath(p)) for m, p in re.findall(r"libcudart\.so\.(\d+) => (\S+)", ldd)}
print(json.dumps({
    "torch": torch.__version__, "torch_cuda": torch.version.cuda, "vllm": vllm.__version__,
    "vllm_cudart": sorted(cudart), "cuda_runtime_wheel": m.version("nvidia-cuda-runtime"),
}))
"""


def cuda_of(image: Path) -> dict:
    out = python_in(image, "import json\n" + CUDA_OF)
    assert out.returncode == 0, out.stdout[-4000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_torch_cuda_is_the_cuda_vllm_links_and_one_vllm_in_both_images(trainer_image, generator_image):
    trainer, generator = cuda_of(trainer_image), cuda_of(generator_image)
    print(f"trainer: {trainer}\ngenerator: {generator}")
    for found in (trainer, generator):
        major = found["torch_cuda"].split(".")[0]
        # vLLM's _C links the CUDA runtime of torch's CUDA major, from the image's own CUDA runtime wheel
        assert [m for m, _ in found["vllm_cudart"]] == [major], found
        assert "/nvidia/" in found["vllm_cudart"][0][1], found
        # the runtime wheel is the CUDA release torch was built with (13.0.x for torch's 13.0)
        assert found["cuda_runtime_wheel"].startswith(found["torch_cuda"] + "."), found
    # the trainer's weight-sync client (TRL's VLLMClient, vLLM's NCCL helpers) speaks to this generator's server
    assert trainer["vllm"] == generator["vllm"]
    assert trainer["torch"] == generator["torch"]


@pytest.mark.parametrize("image", ["trainer", "generator"])
def test_pip_check_names_only_the_known_exceptions(image, request):
    """Every installed distribution's requirements hold but for hack/cuda_pins.py's pip_check_exceptions: what the
    lock leaves out (LEFT_OUT) and what the image overrides (images/<image>/overrides-cuda.txt)."""
    out = run_in(request.getfixturevalue(f"{image}_image"), ["python3", "-m", "pip", "check"], timeout=600)
    print(f"{image}: pip check: exit {out.returncode}\n{out.stdout}")
    assert pins.pip_check_unexpected(image, out.stdout) == [], out.stdout[-4000:]


# nvcc on the image's PATH and under CUDA_HOME is the release torch was built with (DeepSpeed's op builder refuses
# another minor: CUDAMismatchException), and the linker finds the runtime by its unversioned name.
NVCC = r"""
import os, re, shutil, subprocess, torch
from torch.utils import cpp_extension
nvcc = shutil.which("nvcc")
release = re.search(r"release (\d+\.\d+)", subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout)
print(json.dumps({"nvcc": nvcc, "release": release and release.group(1), "torch_cuda": torch.version.cuda,
                  "cuda_home": cpp_extension.CUDA_HOME, "env": os.environ.get("CUDA_HOME"),
                  "libcudart": os.path.exists(os.path.join(cpp_extension.CUDA_HOME, "lib64", "libcudart.so"))}))
"""


@pytest.mark.parametrize("image", ["trainer", "generator"])
def test_nvcc_on_path_is_torchs_cuda_under_cuda_home(image, request):
    out = python_in(request.getfixturevalue(f"{image}_image"), "import json\n" + NVCC)
    assert out.returncode == 0, out.stdout[-4000:]
    found = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"{image}: {found}")
    assert found["env"] == found["cuda_home"] == "/opt/cuda" and found["nvcc"] == "/opt/cuda/bin/nvcc", found
    assert found["release"] == found["torch_cuda"], found
    assert found["libcudart"], found


# DeepSpeed's op builder as a trainer pod would run it (uid 1000, read-only root, /tmp a tmpfs): FusedAdam's CUDA
# kernel compiled by the image's nvcc for Hopper and loaded. No GPU here: DS_ACCELERATOR names CUDA's builders
# and TORCH_CUDA_ARCH_LIST the target (a GPU node detects both).
DS_OP = r"""
from deepspeed.ops.op_builder import FusedAdamBuilder
mod = FusedAdamBuilder().load(verbose=False)
print("BUILT", mod.__file__, hasattr(mod, "multi_tensor_adam"))
"""


def test_deepspeed_builds_a_cuda_op_with_the_images_nvcc(trainer_image):
    env = {"DS_ACCELERATOR": "cuda", "TORCH_CUDA_ARCH_LIST": "9.0", "TORCH_EXTENSIONS_DIR": "/tmp/torch_extensions"}
    out = run_in(trainer_image, ["python3", "-W", "ignore", "-c", DS_OP], uid=1000, gid=1000, env=env, timeout=1800)
    assert out.returncode == 0 and "BUILT /tmp/torch_extensions/fused_adam/fused_adam.so True" in out.stdout, (
        out.stdout[-4000:]
    )


@pytest.fixture(scope="module")
def tiny_cpu_run():
    """The tiny example as written (rl samples in process: server mode needs a GPU for its NCCL weight sync)."""
    from rlt.spec.loading import parse_run

    doc = yaml.safe_load((ROOT / "manifests" / "examples" / "rltrun-tiny.yaml").read_text())
    doc["metadata"]["namespace"] = "default"
    return parse_run(doc)


def run_rendered(
    image: Path,
    pod: dict,
    c: dict,
    argv: list[str],
    binds: dict,
    log: Path,
    timeout: float,
    env: dict[str, str] | None = None,
) -> int:
    """argv in the image as the rendered container runs: its env (and `env` on top), uid/gid, read-only root and
    emptyDirs, `binds` (host -> container)."""
    sc = pod["securityContext"]
    read_only, tmpfs = pod_mounts(pod, c)
    with log.open("w") as out:
        proc = images.run_rootfs(
            image,
            argv,
            env={**pod_env(c), **(env or {})},
            uid=sc["runAsUser"],
            gid=sc["runAsGroup"],
            binds=binds,
            read_only=read_only,
            tmpfs=tmpfs,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        return proc.wait(timeout=timeout)


def test_trainer_runs_the_tiny_sft_and_rl_stages_on_cpu(trainer_image, tiny_cpu_run, tmp_path):
    data, binds = mounts(tiny_cpu_run, tmp_path)
    run = RunLayout.for_run(data, tiny_cpu_run.metadata.name)
    for stage in ("sft", "rl"):
        pod, c = rendered(tiny_cpu_run, "trainer", stage)
        chown_for(pod, data)
        log = tmp_path / f"{stage}.log"
        rc = run_rendered(trainer_image, pod, c, c["command"], binds, log, timeout=1800)
        assert rc == 0, log.read_text()[-4000:]
        assert run.stage_done(stage).exists(), sorted(str(p) for p in data.rglob("*"))[:50]
        print(f"{stage}: {log.read_text().splitlines()[-1:]}")


# The preflight's peak RSS, measured inside its own process (the init container's command, run through runpy).
PEAK = (
    "import resource, runpy, sys\n"
    "sys.argv = sys.argv[1:]\n"
    "try:\n"
    "    runpy.run_module('rlt.checks.preflight', run_name='__main__')\n"
    "finally:\n"
    "    print('PEAK_KIB', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)\n"
)


def memory_mib(quantity: str) -> float:
    units = {"Ki": 1 / 1024, "Mi": 1, "Gi": 1024}
    return float(quantity[:-2]) * units[quantity[-2:]]


def test_preflight_peak_memory_in_the_cuda_trainer_is_below_its_limit(trainer_image, tiny_cpu_run, tmp_path):
    pod, _ = rendered(tiny_cpu_run, "trainer", "rl")
    init = pod["initContainers"][0]
    assert init["command"][:3] == ["python", "-m", "rlt.checks.preflight"]
    data, binds = mounts(tiny_cpu_run, tmp_path)
    chown_for(pod, data)
    log = tmp_path / "preflight.log"
    argv = ["python", "-c", PEAK, "preflight", *init["command"][3:]]
    rc = run_rendered(trainer_image, pod, init, argv, binds, log, timeout=600)
    text = log.read_text()
    assert rc == 0, text[-4000:]
    peak = int(re.search(r"PEAK_KIB (\d+)", text).group(1)) / 1024
    limit = memory_mib(init["resources"]["limits"]["memory"])
    print(f"preflight peak RSS in the CUDA trainer image: {peak:.0f} MiB of {limit:.0f} MiB")
    # builders.PREFLIGHT_RESOURCES is derived from this measurement: 1.5 x the peak, rounded up to 256 MiB
    assert peak * 1.5 <= limit <= peak * 1.5 + 256, (peak, limit)


def test_an_old_driver_stops_the_preflight_and_the_generator_with_one_line(
    trainer_image, generator_image, tiny_run, tmp_path
):
    """No GPU here: a stand-in `nvidia-smi` on PATH reports the driver (NVML finds no libnvidia-ml.so.1 on this
    machine, so the check falls back to it, as on a node without NVML). R570 under the images' CUDA 13 stops the
    trainer's init container and the generator's vLLM (rlt's general plugin) with exit 78 and one `driver:` line;
    R580 lets the preflight go on to its plan."""
    fake = tmp_path / "fakebin"
    fake.mkdir()
    smi = fake / "nvidia-smi"
    binds = {str(fake): "/opt/fake-driver"}
    path = {"PATH": "/opt/fake-driver:/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
    pod, _ = rendered(tiny_run, "trainer", "rl")
    init = pod["initContainers"][0]
    data, data_binds = mounts(tiny_run, tmp_path)
    chown_for(pod, data)
    gen_pod, gen = rendered(tiny_run, "generator", "rl")
    for version, code in (("570.86.15", ExitCode.CONFIG_ERROR), ("580.95.05", ExitCode.OK)):
        smi.write_text(f"#!/bin/sh\necho {version}\n")
        smi.chmod(0o755)
        log = tmp_path / f"preflight-{version}.log"
        rc = run_rendered(trainer_image, pod, init, init["command"], {**binds, **data_binds}, log, 600, env=path)
        text = log.read_text()
        assert rc == code, text[-3000:]
        print(f"preflight with driver {version}: exit {rc}: {text.strip().splitlines()[-1]}")
        if code == ExitCode.CONFIG_ERROR:
            line = text.strip().splitlines()[-1]
            assert line.startswith("driver:") and "580.65.06" in line and version in line, text[-3000:]
            # the generator, as rendered (its model need not exist: vLLM runs its plugins first)
            log = tmp_path / "generator.log"
            rc = run_rendered(generator_image, gen_pod, gen, gen["command"], binds, log, 600, env={**path, **NO_GPU})
            text = log.read_text()
            assert rc == ExitCode.CONFIG_ERROR, text[-4000:]
            assert any(ln.startswith("driver:") and "580.65.06" in ln for ln in text.splitlines()), text[-3000:]
            print(f"generator with driver {version}: exit {rc}")
