"""The Containerfiles under images/: hadolint-clean, pinned bases, non-root, labelled."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from chart_helpers import ROOT, tool

IMAGES = sorted((ROOT / "images").glob("*/Containerfile"))


def test_three_images():
    assert {p.parent.name for p in IMAGES} == {"operator", "trainer", "generator"}


def hadolint(path) -> subprocess.CompletedProcess:
    return subprocess.run([tool("hadolint"), "--no-color", str(path)], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("path", IMAGES, ids=lambda p: p.parent.name)
def test_hadolint_clean(path):
    proc = hadolint(path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_hadolint_catches_problems(tmp_path):
    bad = tmp_path / "Containerfile"
    bad.write_text("FROM python:latest\nRUN apt-get install curl\nRUN pip install requests\n")
    proc = hadolint(bad)
    assert proc.returncode != 0
    for code in ("DL3007", "DL3008", "DL3013"):
        assert code in proc.stdout


@pytest.mark.parametrize("path", IMAGES, ids=lambda p: p.parent.name)
def test_pinned_nonroot_labelled(path):
    text = path.read_text()
    bases = re.findall(r"^ARG \w+_IMAGE=(\S+)$", text, re.M)
    assert bases, "base image must be a pinned ARG"
    for base in bases:
        name, _, tag = base.rpartition(":")
        assert name and tag and tag != "latest" and re.search(r"\d", tag), base
    users = re.findall(r"^USER (\S+)$", text, re.M)
    assert users and users[-1].split(":")[0] not in ("root", "0"), users
    for label in ("title", "source", "version", "licenses"):
        assert f"org.opencontainers.image.{label}=" in text
    assert "ENTRYPOINT" in text


def test_makefile_builds_every_image():
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^images:", makefile, re.M)
    assert "IMAGES         ?= operator trainer generator" in makefile
    assert "images/$$img/Containerfile" in makefile


def test_containerignore_lets_only_the_sources_in(tmp_path):
    """A real buildah build of a context holding a venv, results, a secret and caches, filtered by .containerignore
    (the allow-list every image build uses): only pyproject.toml, README.md, the two packages and the CUDA images'
    locks get in."""
    buildah = shutil.which("buildah")
    if buildah is None:
        pytest.skip("buildah not installed (make test installs it)")
    ctx = tmp_path / "ctx"
    for rel in (
        "pyproject.toml",
        "README.md",
        "training/rlt/x.py",
        "operator/rlt_operator/y.py",
        "training/rlt/__pycache__/x.cpython-311.pyc",
        ".venv/bin/python",
        "results/tiny/model.bin",
        ".env",
        "secrets/token",
        "tests/t.py",
        ".git/config",
        "charts/c.yaml",
        "images/trainer/requirements-cuda.txt",
        "images/trainer/requirements-cuda.in",
        "images/generator/requirements-cuda.txt",
        "images/generator/Containerfile",
    ):
        (ctx / rel).parent.mkdir(parents=True, exist_ok=True)
        (ctx / rel).write_text("x")
    (ctx / "Containerfile").write_text("FROM scratch\nCOPY . /ctx/\n")
    store = ["--storage-driver", "vfs", "--root", str(tmp_path / "root"), "--runroot", str(tmp_path / "run")]
    tag = "localhost/rlt-ignore-probe:test"
    subprocess.run(
        [
            buildah,
            *store,
            "build",
            "--isolation",
            "chroot",
            "--ignorefile",
            str(ROOT / ".containerignore"),
            "-f",
            str(ctx / "Containerfile"),
            "-t",
            tag,
            str(ctx),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    c = subprocess.run([buildah, *store, "from", tag], check=True, capture_output=True, text=True).stdout.strip()
    mnt = Path(subprocess.run([buildah, *store, "mount", c], check=True, capture_output=True, text=True).stdout.strip())
    try:
        got = sorted(str(p.relative_to(mnt / "ctx")) for p in (mnt / "ctx").rglob("*") if p.is_file())
    finally:
        subprocess.run([buildah, *store, "umount", c], capture_output=True)
        subprocess.run([buildah, *store, "rm", c], capture_output=True)
        subprocess.run([buildah, *store, "rmi", "-a", "-f"], capture_output=True)
    assert got == [
        "README.md",
        "images/generator/requirements-cuda.txt",
        "images/trainer/requirements-cuda.txt",
        "operator/rlt_operator/y.py",
        "pyproject.toml",
        "training/rlt/x.py",
    ]
    assert (ROOT / ".dockerignore").resolve() == (ROOT / ".containerignore").resolve(), "docker reads the same list"
