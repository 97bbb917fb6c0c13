"""The Containerfiles under images/: hadolint-clean, pinned bases, non-root, labelled."""

from __future__ import annotations

import re
import subprocess

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
