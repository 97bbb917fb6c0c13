"""Trainer and generator images (CPU flavour), run the way the operator's pods run them. Each image is several GB
and takes minutes to build on 2 cores, so these run under `make images-test` (RLT_IMAGES_TEST=1), not in every
`make test` (tests marked `image_build`); their CUDA flavours (bigger still) under `make images-test-cuda`
(RLT_IMAGES_TEST_CUDA=1, tests marked `image_build_cuda`). The operator image's smoke test is in
tests/operator/test_operator_image.py and runs in `make test`, and so does the store-pruning test here (tiny images in
a private store)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from image_helpers import ROOT, images


def pytest_configure(config):
    config.addinivalue_line("markers", "image_build: builds the multi-GB trainer/generator images (make images-test)")
    config.addinivalue_line(
        "markers", "image_build_cuda: builds the CUDA trainer/generator images (make images-test-cuda)"
    )


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).parent
    reasons = []
    if missing := images.tools_missing():
        reasons.append(f"needs {', '.join(missing)} (apt-get install buildah mmdebstrap)")
    elif os.geteuid() != 0:
        reasons.append("mounting an image's rootfs needs root")
    for item in items:
        if here not in Path(item.fspath).parents:
            continue
        heavy = os.environ.get("RLT_IMAGES_TEST") != "1" and item.get_closest_marker("image_build")
        cuda = os.environ.get("RLT_IMAGES_TEST_CUDA") != "1" and item.get_closest_marker("image_build_cuda")
        why = [
            *reasons,
            *(["multi-GB image builds: run by `make images-test`"] if heavy else []),
            *(
                ["CUDA images of 10+ GB each, built from PyPI's CUDA wheels: run by `make images-test-cuda`"]
                if cuda
                else []
            ),
        ]
        if why:
            item.add_marker(pytest.mark.skip(reason="; ".join(why)))


@pytest.fixture(scope="session")
def tiny_run():
    """The tiny example with server-mode rl (so a generator is rendered) and a small vLLM KV cache (user env)."""
    from rlt.spec.loading import parse_run

    doc = yaml.safe_load((ROOT / "manifests" / "examples" / "rltrun-tiny.yaml").read_text())
    doc["metadata"]["namespace"] = "default"
    doc["spec"]["stages"]["rl"].setdefault("generation", {})["mode"] = "server"
    doc["spec"]["resources"] = {"generator": {"replicas": 1, "gpus": 1}, "trainer": {"nodes": 1, "gpus": 1}}
    doc["spec"]["env"] = [{"name": "VLLM_CPU_KVCACHE_SPACE", "value": "1"}]
    return parse_run(doc)
