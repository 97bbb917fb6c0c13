"""The CUDA images' locks (images/*/requirements-cuda.txt, hack/cuda_pins.py) hold one CUDA major across torch,
vLLM, DeepSpeed and every nvidia-* wheel, one CUDA minor (the runtime's) across the wheels that tell theirs, the same vLLM and torch in the trainer and the generator, and every pin of
their .in files. Offline in seconds; one test re-resolves the committed locks against PyPI's metadata (no wheel is
downloaded; about 10 s) and is skipped, saying so, where PyPI or uv is not reachable."""

from __future__ import annotations

import importlib.util
import re
import socket
import subprocess

import pytest
from suite_helpers import ROOT

_spec = importlib.util.spec_from_file_location("rlt_cuda_pins", ROOT / "hack" / "cuda_pins.py")
pins = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pins)


def test_committed_locks_hold_one_cuda_major_and_one_vllm():
    assert pins.check(pins.committed_locks()) == []
    locks = {name: pins.parse_lock(text) for name, text in pins.committed_locks().items()}
    majors = {name: pins.image_majors({name: text}) for name, text in pins.committed_locks().items()}
    assert majors == {"trainer": {13}, "generator": {13}}, majors
    # the weight-sync client (TRL's, in the trainer) speaks to the generator's server: one vLLM
    assert locks["trainer"]["vllm"][0] == locks["generator"]["vllm"][0]
    for left_out in pins.LEFT_OUT:
        assert all(left_out not in pkgs for pkgs in locks.values())


def test_another_cuda_major_in_a_lock_is_named():
    trainer = pins.committed_locks()["trainer"]
    assert "nvidia-nccl-cu13==" in trainer
    broken = {**pins.committed_locks(), "trainer": trainer.replace("nvidia-nccl-cu13==", "nvidia-nccl-cu12==")}
    problems = pins.check(broken)
    assert any("more than one CUDA major" in p and "nvidia-nccl-cu12" in p for p in problems), problems
    # a torch from PyTorch's CUDA 12.8 index in the generator only: two majors, and torch differs between images
    gen = pins.committed_locks()["generator"]
    broken = {**pins.committed_locks(), "generator": re.sub(r"^torch==\S+", "torch==2.13.0+cu128", gen, flags=re.M)}
    problems = pins.check(broken)
    assert any("CUDA 12: generator:torch==2.13.0+cu128" in p for p in problems), problems
    assert any(p.startswith("torch differs") for p in problems), problems
    # an nvidia wheel nothing tells the CUDA of
    broken = {**pins.committed_locks(), "generator": gen + "nvidia-mystery==1.0\n    # via vllm\n"}
    assert any(p.startswith("generator: nvidia-mystery") for p in pins.check(broken))


def test_every_cuda_wheel_is_of_the_runtimes_minor():
    """One CUDA release, not only one major: nvcc, nvvm, nvJitLink... at the runtime's 13.0, bar the listed ones."""
    for name, text in pins.committed_locks().items():
        pkgs = pins.parse_lock(text)
        minors = pins.cuda_minors(pkgs)
        # the compiler and JIT wheels, and the libraries torch's cuda-toolkit pins (cuBLAS's own version is 13.1)
        for wheel in ("nvidia-cuda-nvcc", "nvidia-nvvm", "nvidia-cuda-crt", "nvidia-nvjitlink", "nvidia-cublas"):
            assert minors[wheel] == "13.0", (name, wheel, pkgs[wheel][0])
        other = {n: m for n, m in minors.items() if m != "13.0"}
        assert set(other) <= set(pins.OTHER_MINOR_ALLOWED), (name, other)
    assert pins.release(pins.committed_locks()) == ["13.0"]


def test_another_cuda_minor_in_a_lock_is_named():
    """The issue's case: a 13.5 nvJitLink (pulled unpinned) beside the 13.0 runtime."""
    trainer = pins.committed_locks()["trainer"]
    assert "nvidia-nvjitlink==13.0.88" in trainer
    broken = {
        **pins.committed_locks(),
        "trainer": trainer.replace("nvidia-nvjitlink==13.0.88", "nvidia-nvjitlink==13.5.37"),
    }
    problems = pins.check(broken)
    assert [p for p in problems if "minor" in p] == [
        "trainer: more than one CUDA minor: the runtime is 13.0 (nvidia-cuda-runtime==13.0.96), but "
        "nvidia-nvjitlink==13.5.37 (CUDA 13.5); pin them in images/cuda-release.txt and re-lock"
    ], problems
    # a torch from PyTorch's cu132 index, and a cuda-toolkit of another release (its cuBLAS follows it)
    gen = pins.committed_locks()["generator"]
    broken = {**pins.committed_locks(), "generator": re.sub(r"^torch==\S+", "torch==2.13.0+cu132", gen, flags=re.M)}
    assert any(
        "generator: more than one CUDA minor" in p and "torch==2.13.0+cu132 (CUDA 13.2)" in p
        for p in pins.check(broken)
    )
    broken = {**pins.committed_locks(), "generator": gen.replace("cuda-toolkit==13.0.3.0", "cuda-toolkit==13.2.1")}
    line = next(p for p in pins.check(broken) if "generator: more than one CUDA minor" in p)
    assert "cuda-toolkit==13.2.1 (CUDA 13.2)" in line and "nvidia-cublas==13.1.1.3 (CUDA 13.2)" in line, line


# `python -m pip check` (pip 23.2.1) in venvs holding each committed lock, installed as the Containerfiles install it
# (uv pip install --no-deps -r images/<image>/requirements-cuda.txt, CPython 3.11, 2026-11-27); the images' own run
# is tests/images/test_cuda_images.py::test_pip_check_names_only_the_known_exceptions.
PIP_CHECK = {
    "trainer": """vllm 0.31.0 requires pynvvideocodec, which is not installed.
vllm 0.31.0 requires torchaudio, which is not installed.
vllm 0.31.0 requires torchcodec, which is not installed.
vllm 0.31.0 requires torchvision, which is not installed.
vllm 0.31.0 has requirement transformers<5.18.0,>=5.10.4, but you have transformers 5.23.0.
""",
    "generator": """vllm 0.31.0 requires pynvvideocodec, which is not installed.
vllm 0.31.0 requires torchaudio, which is not installed.
vllm 0.31.0 requires torchcodec, which is not installed.
vllm 0.31.0 requires torchvision, which is not installed.
""",
}


def test_pip_check_names_only_what_the_lock_leaves_out_or_overrides():
    for name, output in PIP_CHECK.items():
        assert pins.pip_check_unexpected(name, output) == [], name
    # the trainer's transformers override is not the generator's
    conflict = PIP_CHECK["trainer"].splitlines()[-1]
    assert pins.pip_check_unexpected("generator", conflict) == [conflict]
    # a requirement the 13.0 pins would break, and a package missing that the lock should hold, are named
    newer = (
        "flashinfer-python 0.7.0.post1 has requirement nvidia-cuda-nvcc>=13.5, but you have nvidia-cuda-nvcc 13.0.88."
    )
    missing = "vllm 0.31.0 requires xgrammar, which is not installed."
    assert pins.pip_check_unexpected("trainer", f"{newer}\n{missing}\n") == [newer, missing]


@pytest.mark.parametrize("name", pins.CUDA_IMAGES)
def test_lock_holds_every_pin_of_its_in_file(name):
    """A pin changed in the .in and not re-locked (`python hack/cuda_pins.py lock`) fails here."""
    lock = pins.parse_lock(pins.lock_file(name).read_text())
    wanted = [
        line.split("#")[0].strip() for line in pins.in_file(name).read_text().splitlines() if line.split("#")[0].strip()
    ]
    assert wanted
    overrides = pins.overrides_file(name)
    release = pins.release_file().read_text().splitlines()
    for line in [*wanted, *release, *(overrides.read_text().splitlines() if overrides else [])]:
        req = line.split("#")[0].strip()
        if not req:
            continue
        pkg, version = req.split("==")
        assert lock.get(pins.normalise(pkg), ("absent",))[0] == version, f"{name}: {req} is not in its lock"


def pypi_reachable() -> bool:
    try:
        socket.create_connection(("pypi.org", 443), timeout=5).close()
        return True
    except OSError:
        return False


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", pins.CUDA_IMAGES)
def test_lock_resolves_against_pypis_metadata(name, tmp_path):
    """Every pin of the lock together is what PyPI's metadata allows on the images' platform, and nothing is
    missing: re-resolving the lock itself gives the lock."""
    if pins.uv() is None:
        pytest.skip("needs uv (pip install uv==0.13.9): it resolves without downloading wheels")
    if not pypi_reachable():
        pytest.skip("pypi.org is not reachable: the offline checks above still ran")
    src = tmp_path / "lock.in"
    src.write_text(re.sub(r"^\s+#.*\n", "", pins.lock_file(name).read_text(), flags=re.M))
    out = tmp_path / "out.txt"
    cmd = [pins.uv(), *pins.compile_cmd(name, out)[1:]]
    cmd[cmd.index(str(pins.in_file(name).relative_to(ROOT)))] = str(src)
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=pins.uv_env())
    if proc.returncode != 0 and "Failed to fetch" in proc.stderr:
        pytest.skip(f"PyPI did not answer: {proc.stderr.strip().splitlines()[-1]}")
    assert proc.returncode == 0, proc.stderr
    fresh = {k: v for k, (v, _) in pins.parse_lock(out.read_text()).items()}
    committed = {k: v for k, (v, _) in pins.parse_lock(pins.lock_file(name).read_text()).items()}
    assert fresh == committed
    assert pins.check({name: out.read_text()}) == []


def test_uv_is_what_the_images_install_with():
    """The Containerfiles install the lock with the uv the tests resolve with (one pin)."""
    for name in pins.CUDA_IMAGES:
        text = (ROOT / "images" / name / "Containerfile").read_text()
        assert f"uv=={pins.UV_VERSION}" in text, name
    assert f'"uv=={pins.UV_VERSION}"' in (ROOT / "pyproject.toml").read_text()
