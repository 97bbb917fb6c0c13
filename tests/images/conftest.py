"""Trainer and generator images (CPU flavour), run the way the operator's pods run them. Each image is several GB
and takes minutes to build on 2 cores, so these run under `make images-test` (RLT_IMAGES_TEST=1), not in every
`make test`; the operator image's smoke test is in tests/operator/test_operator_image.py and runs in `make test`."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
import yaml
from suite_helpers import ROOT

_spec = importlib.util.spec_from_file_location("rlt_images", ROOT / "hack" / "images.py")
images = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(images)


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).parent
    reasons = []
    if os.environ.get("RLT_IMAGES_TEST") != "1":
        reasons.append("multi-GB image builds: run by `make images-test`")
    elif missing := images.tools_missing():
        reasons.append(f"needs {', '.join(missing)} (apt-get install buildah mmdebstrap)")
    elif os.geteuid() != 0:
        reasons.append("mounting an image's rootfs needs root")
    if reasons:
        for item in items:
            if here in Path(item.fspath).parents:
                item.add_marker(pytest.mark.skip(reason="; ".join(reasons)))


@pytest.fixture(scope="session")
def tiny_run():
    """The tiny example with server-mode rl (so a generator is rendered) and a small vLLM KV cache (user env)."""
    from rlt.spec import parse_run

    doc = yaml.safe_load((ROOT / "manifests" / "examples" / "rltrun-tiny.yaml").read_text())
    doc["metadata"]["namespace"] = "default"
    doc["spec"]["stages"]["rl"].setdefault("generation", {})["mode"] = "server"
    doc["spec"]["resources"] = {"generator": {"replicas": 1, "gpus": 1}, "trainer": {"nodes": 1, "gpus": 1}}
    doc["spec"]["env"] = [{"name": "VLLM_CPU_KVCACHE_SPACE", "value": "1"}]
    return parse_run(doc)
