"""The real-cluster suite: only with $KUBEBUILDER_ASSETS (a folder with kube-apiserver and etcd, optionally
kube-controller-manager; etcd may also come from PATH). Without it every test here is skipped with one line."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
from kube_env import ASSETS_VAR, ControlPlane

SKIP = (
    f"${ASSETS_VAR} is not set: the real-cluster suite needs a folder with kube-apiserver and etcd "
    "(optionally kube-controller-manager), e.g. KUBEBUILDER_ASSETS=/path/to/bin make test-real-cluster"
)


def skip_without_assets() -> None:
    """Called at the top of each test module here: one skip line per module, at collection (no fixture runs)."""
    if not os.environ.get(ASSETS_VAR):
        pytest.skip(SKIP, allow_module_level=True)


@pytest.fixture(scope="session")
def cluster():
    assets = Path(os.environ[ASSETS_VAR])
    if not (assets / "kube-apiserver").exists():
        pytest.fail(f"${ASSETS_VAR}={assets} has no kube-apiserver")
    plane = ControlPlane(assets=assets, workdir=Path(tempfile.mkdtemp(prefix="rlt-real-cluster-")))
    try:
        plane.start()
        print(f"\nreal cluster: {plane.kubectl('version', '-o', 'yaml').stdout}")
        yield plane
    finally:
        plane.stop()
        shutil.rmtree(plane.workdir, ignore_errors=True)
