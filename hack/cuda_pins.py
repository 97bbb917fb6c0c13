#!/usr/bin/env python3
"""The CUDA images' locks: resolved from each image's requirements-cuda.in against PyPI's metadata, checked for one
CUDA major.

    python hack/cuda_pins.py lock            # re-resolve images/*/requirements-cuda.in -> requirements-cuda.txt
    python hack/cuda_pins.py check           # the committed locks: one CUDA major, one vLLM and torch in both images

The .in files name what the images need (a handful of pins); uv resolves them for the images' platform (CPython
3.11 on x86_64 glibc 2.36, Debian bookworm) from PyPI's metadata alone (PEP 658: no wheel is downloaded; DeepSpeed,
an sdist, has its metadata built) and writes every package with its version and who requires it (`# via`). The
images install the lock with `--no-deps`, so what the check reads is exactly what the images hold.

The CUDA major of a package is read, never chosen: a `-cuNN` name suffix (nvidia-nccl-cu13), a `+cuNNN` local
version (torch from PyTorch's index), the major of cuda-toolkit and of the wheels whose version is the CUDA
release they come from (nvidia-cuda-runtime 13.0.96, cuda-bindings 13.4.4), and for the suffix-less CUDA libraries
whose version is the library's own (nvidia-cufft 12.0 is CUDA 13's cuFFT), the cuda-toolkit that requires them.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CUDA_IMAGES = ("trainer", "generator")
INDEX = "https://pypi.org/simple"
UV_VERSION = "0.13.9"  # the resolver here and the installer in the Containerfiles (pyproject's test extra pins it)
# The images' Python and platform: the local Debian bookworm base (python3.11, glibc 2.36) and python:3.11-slim.
PYTHON_VERSION = "3.11"
PLATFORM = "x86_64-manylinux_2_36"
# vLLM requires these, but PyPI's torchaudio is built for another torch (2.11) and a text-only image imports none
# of them (video and audio inputs); a mismatched torchvision breaks `import transformers` (operator
# torchvision::nms does not exist). PyNvVideoCodec (NVDEC video decoding, 66 MB) is never imported by rlt's stages or
# vLLM's text server (tests/images/test_cuda_images.py imports both).
LEFT_OUT = ("torchvision", "torchaudio", "torchcodec", "pynvvideocodec")
# Wheels whose version is the CUDA release they belong to.
CUDA_VERSIONED = re.compile(
    r"^(cuda-toolkit|cuda-bindings|cuda-python|nvidia-cuda-[a-z-]+|nvidia-nvjitlink|nvidia-nvvm|nvidia-nvtx|nvidia-cublas)$"
)
# nvidia-* wheels with no CUDA major of their own, each with the reason (anything else must have one).
CUDA_AGNOSTIC = {
    "nvidia-ml-py": "Python bindings of NVML, the driver's library; no CUDA runtime",
    "nvidia-cudnn-frontend": "header-only C++ API of cuDNN with Python bindings; loads the cuDNN torch brings",
    "nvidia-cutlass-dsl": "Python DSL; its compiled libraries are the -libs-cuNN wheels",
    "nvidia-cutlass-dsl-libs-base": "the DSL's CUDA-independent part",
    "nvidia-cutlass-dsl-libs-core": "the DSL's CUDA-independent part",
}
# Wheels whose version is the CUDA release they belong to down to the minor (cuBLAS's is its own: 13.1.1.3 is CUDA
# 13.0 Update 3's); the other CUDA libraries take the minor of the cuda-toolkit that pins them, and -cuNN wheels
# (NCCL, cuDNN, NVSHMEM) are built for a whole major.
RELEASE_VERSIONED = re.compile(
    r"^(cuda-toolkit|cuda-bindings|cuda-python|nvidia-cuda-[a-z-]+|nvidia-nvjitlink|nvidia-nvvm|nvidia-nvtx)$"
)
# A wheel of another CUDA minor than the runtime's, with the reason it may stay (nothing it writes is loaded by
# the driver or linked into a CUDA extension).
OTHER_MINOR_ALLOWED = {
    "nvidia-cuda-nvdisasm": (
        "the cutlass DSL requires it unpinned and PyPI has no 13.0 wheel (the first is 13.2.51); a disassembler "
        "(cubin to SASS text) the DSL runs when asked to dump SASS: it produces no code the driver loads"
    ),
}
# A wheel of another CUDA major that a package of ours requires unconditionally, with the reason it may stay.
OTHER_MAJOR_ALLOWED = {
    "nvidia-cutlass-dsl-libs-cu12": (
        "nvidia-cutlass-dsl 4.7.1 requires it whatever the extra; its [cu13] extra adds -libs-cu13, which the DSL "
        "loads when the CUDA runtime is 13 (its ldd resolves inside the image: make images-test-cuda)"
    ),
}


def in_file(name: str) -> Path:
    return ROOT / "images" / name / "requirements-cuda.in"


def lock_file(name: str) -> Path:
    return ROOT / "images" / name / "requirements-cuda.txt"


def release_file() -> Path:
    """The CUDA release's component pins, a constraint of every image's lock."""
    return ROOT / "images" / "cuda-release.txt"


def overrides_file(name: str) -> Path | None:
    p = ROOT / "images" / name / "overrides-cuda.txt"
    return p if p.exists() else None


def uv() -> str | None:
    return shutil.which("uv") or next((str(p) for p in [Path(sys.executable).parent / "uv"] if p.exists()), None)


def compile_cmd(name: str, out: Path) -> list[str]:
    """uv's resolution of one image's .in for the images' platform (the command is also the lock's header)."""
    return [
        "uv",
        "pip",
        "compile",
        "--quiet",
        "--no-config",
        "--python-version",
        PYTHON_VERSION,
        "--python-platform",
        PLATFORM,
        "--index-url",
        INDEX,
        "--custom-compile-command",
        "python hack/cuda_pins.py lock",
        *(a for p in LEFT_OUT for a in ("--no-emit-package", p)),
        "--constraint",
        str(release_file().relative_to(ROOT)),
        *(["--override", str(overrides_file(name).relative_to(ROOT))] if overrides_file(name) else []),
        str(in_file(name).relative_to(ROOT)),
        "-o",
        str(out),
    ]


def uv_env() -> dict[str, str]:
    """uv verifies TLS with the system's CA bundle (where a proxy's CA is installed), not only its own roots."""
    env = {**os.environ, "UV_NO_CONFIG": "1"}
    if Path("/etc/ssl/certs/ca-certificates.crt").exists():
        env.setdefault("SSL_CERT_FILE", "/etc/ssl/certs/ca-certificates.crt")
    return env


def resolve(name: str, out: Path) -> None:
    """Resolve `name`'s .in into `out` (raises CalledProcessError with uv's message when it cannot)."""
    exe = uv()
    if exe is None:
        raise SystemExit(f"uv is not installed (pip install uv=={UV_VERSION})")
    cmd = [exe, *compile_cmd(name, out)[1:]]
    subprocess.run(cmd, cwd=ROOT, env=uv_env(), check=True, capture_output=True, text=True)


# --------------------------------------------------------------------------- reading a lock


def parse_lock(text: str) -> dict[str, tuple[str, set[str]]]:
    """{name: (version, {who requires it})} of a uv-compiled requirements file (names normalised)."""
    pkgs: dict[str, tuple[str, set[str]]] = {}
    current = None
    for line in text.splitlines():
        if m := re.match(r"^([A-Za-z0-9_.-]+)==(\S+)", line):
            current = normalise(m.group(1))
            pkgs[current] = (m.group(2), set())
        elif (
            current
            and (m := re.match(r"^\s+#\s+(?:via\s+)?(?:-r |-c |--override )?(\S+)\s*$", line))
            and m.group(1) != "via"
        ):
            pkgs[current][1].add(normalise(m.group(1)))
    return pkgs


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def cuda_majors(pkgs: dict[str, tuple[str, set[str]]]) -> tuple[dict[str, int], list[str]]:
    """({package: CUDA major} for every CUDA-specific package, [problems]) of one lock."""
    majors: dict[str, int] = {}
    problems: list[str] = []
    for name, (ver, _) in pkgs.items():
        if (m := re.search(r"-cu(\d+)$", name)) or (m := re.search(r"\+cu(\d+?)\d$", ver)):
            majors[name] = int(m.group(1))
        elif CUDA_VERSIONED.match(name):
            majors[name] = int(ver.split(".")[0])
    toolkit = majors.get("cuda-toolkit")
    for name, (_, via) in pkgs.items():
        if name in majors or name in CUDA_AGNOSTIC or not (name.startswith("nvidia-") or name.startswith("cuda-")):
            continue
        if toolkit is not None and "cuda-toolkit" in via:
            majors[name] = toolkit  # a library versioned on its own (cufft 12.x), pinned by the toolkit
        elif name.startswith("cuda-") and not name.startswith("cuda-toolkit"):
            continue  # cuda-core, cuda-pathfinder, cuda-tile: Python layers over whichever cuda-bindings
        else:
            problems.append(
                f"{name}: cannot tell its CUDA major (no -cuNN suffix, not pinned by cuda-toolkit); "
                "add it to CUDA_AGNOSTIC with the reason, or pin what brings it"
            )
    return majors, problems


def image_majors(locks: dict[str, str]) -> set[int]:
    """The CUDA majors of the locks' packages, bar OTHER_MAJOR_ALLOWED."""
    return {
        m
        for text in locks.values()
        for name, m in cuda_majors(parse_lock(text))[0].items()
        if name not in OTHER_MAJOR_ALLOWED
    }


def cuda_minors(pkgs: dict[str, tuple[str, set[str]]]) -> dict[str, str]:
    """{package: CUDA major.minor} for every package whose CUDA minor the lock tells: its own version (the release's
    wheels), a +cuNNN local version, or the cuda-toolkit that pins it."""
    minors: dict[str, str] = {}
    for name, (ver, _) in pkgs.items():
        if m := re.search(r"\+cu(\d+?)(\d)$", ver):
            minors[name] = f"{m.group(1)}.{m.group(2)}"
        elif RELEASE_VERSIONED.match(name):
            minors[name] = ".".join(ver.split(".")[:2])
    toolkit = minors.get("cuda-toolkit")
    for name, (_, via) in pkgs.items():
        if name not in minors and toolkit is not None and "cuda-toolkit" in via:
            minors[name] = toolkit  # cuBLAS, cuFFT, cuSPARSE...: the release that pins them
    return minors


def minor_problems(image: str, pkgs: dict[str, tuple[str, set[str]]]) -> list[str]:
    """One line when a CUDA wheel of the lock (bar OTHER_MINOR_ALLOWED) is of another minor than the runtime's."""
    runtime = pkgs.get("nvidia-cuda-runtime")
    if runtime is None:
        return [f"{image}: the lock has no nvidia-cuda-runtime (the CUDA runtime every extension links)"]
    want = ".".join(runtime[0].split(".")[:2])
    other = sorted(
        f"{name}=={pkgs[name][0]} (CUDA {minor})"
        for name, minor in cuda_minors(pkgs).items()
        if minor != want and name not in OTHER_MINOR_ALLOWED
    )
    if not other:
        return []
    return [
        f"{image}: more than one CUDA minor: the runtime is {want} (nvidia-cuda-runtime=={runtime[0]}), "
        f"but {', '.join(other)}; pin them in {release_file().relative_to(ROOT)} and re-lock"
    ]


def check(locks: dict[str, str]) -> list[str]:
    """Problems of the images' locks ({image: lock text}): more than one CUDA major (bar OTHER_MAJOR_ALLOWED),
    a CUDA wheel of another minor than the runtime's (bar OTHER_MINOR_ALLOWED), a package of unknown CUDA major,
    or a vLLM/torch/CUDA that differs between the images."""
    problems: list[str] = []
    per_image: dict[str, dict[str, tuple[str, set[str]]]] = {}
    seen: dict[int, list[str]] = {}
    for image, text in locks.items():
        pkgs = per_image[image] = parse_lock(text)
        for p in ("torch", "vllm"):
            if p not in pkgs:
                problems.append(f"{image}: the lock has no {p}")
        majors, unknown = cuda_majors(pkgs)
        problems += [f"{image}: {u}" for u in unknown]
        for name, major in majors.items():
            if name not in OTHER_MAJOR_ALLOWED:
                seen.setdefault(major, []).append(f"{image}:{name}=={pkgs[name][0]}")
        if majors:
            problems += minor_problems(image, pkgs)
        if not majors and "torch" in pkgs:
            problems.append(f"{image}: no CUDA wheel in the lock (torch {pkgs['torch'][0]}: a CPU torch?)")
    if len(seen) > 1:
        problems.append(
            "more than one CUDA major: "
            + "; ".join(
                f"CUDA {m}: {', '.join(sorted(names)[:6])}{' …' if len(names) > 6 else ''}"
                for m, names in sorted(seen.items())
            )
        )
    if len(per_image) > 1:
        for p in ("torch", "vllm", "cuda-toolkit"):
            versions = {img: pkgs.get(p, ("absent",))[0] for img, pkgs in per_image.items()}
            if len(set(versions.values())) > 1:
                problems.append(f"{p} differs between the images: {versions}")
    return problems


def release(locks: dict[str, str]) -> list[str]:
    """The CUDA runtime minors of the locks (one, when check() is clean)."""
    return sorted(
        {
            minor
            for text in locks.values()
            for n, minor in cuda_minors(parse_lock(text)).items()
            if n == "nvidia-cuda-runtime"
        }
    )


# `pip check`'s two kinds of line (pip 23: src/pip/_internal/commands/check.py).
PIP_MISSING = re.compile(r"^(\S+) (\S+) requires (\S+), which is not installed\.$")
PIP_CONFLICT = re.compile(r"^(\S+) (\S+) has requirement (.+), but you have (\S+) (\S+)\.$")


def pip_check_exceptions(name: str) -> dict[str, str]:
    """{package: why} that `pip check` may name in `name`'s image: what the lock leaves out, what it overrides."""
    known = {p: "left out of the lock (LEFT_OUT: video/audio inputs only)" for p in LEFT_OUT}
    overrides = overrides_file(name)
    for line in overrides.read_text().splitlines() if overrides else []:
        if req := line.split("#")[0].strip():
            known[normalise(req.split("==")[0])] = f"overridden ({req}, {overrides.relative_to(ROOT)})"
    return known


def pip_check_unexpected(name: str, output: str) -> list[str]:
    """The lines of `pip check`'s output in `name`'s image that pip_check_exceptions does not explain."""
    known = pip_check_exceptions(name)
    unexpected = []
    for line in filter(None, (ln.strip() for ln in output.splitlines())):
        missing, conflict = PIP_MISSING.match(line), PIP_CONFLICT.match(line)
        if missing and normalise(missing.group(3)) in known:
            continue
        if conflict and normalise(conflict.group(4)) in known:
            continue
        unexpected.append(line)
    return unexpected


def committed_locks() -> dict[str, str]:
    return {name: lock_file(name).read_text() for name in CUDA_IMAGES}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("cmd", choices=["lock", "check"])
    args = p.parse_args(argv)
    if args.cmd == "lock":
        for name in CUDA_IMAGES:
            try:
                resolve(name, lock_file(name))
            except subprocess.CalledProcessError as err:
                raise SystemExit(f"{in_file(name).relative_to(ROOT)}: cannot resolve:\n{err.stderr.strip()}") from None
            print(f"wrote {lock_file(name).relative_to(ROOT)}")
    problems = check(committed_locks())
    for line in problems:
        print(line, file=sys.stderr)
    if not problems:
        print(f"one CUDA release across {', '.join(CUDA_IMAGES)}: {release(committed_locks())}")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
