"""The CPU flavour of the trainer and generator images runs the exact containers the operator renders: command,
env (the run's spec in RLT_RUN_YAML), uid/gid and a host folder as the PVC on /data. Built by hack/images.py
(cached by inputs); run under `make images-test`."""

from __future__ import annotations

import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from image_helpers import images
from suite_helpers import free_port

from rlt.contract.layout import PVC_MOUNT, RunLayout
from rlt_operator import builders as b

# a first build on 2 shared cores takes tens of minutes
pytestmark = [pytest.mark.timeout(3600), pytest.mark.image_build]


def rendered(tiny_run, kind: str, stage: str) -> tuple[dict, dict]:
    ref = b.RunRef(name=tiny_run.metadata.name, namespace="default", uid="u")
    obj = (b.trainer_job if kind == "trainer" else b.generator_statefulset)(ref, tiny_run.spec, stage, 0)
    pod = obj["spec"]["template"]["spec"]
    return pod, pod["containers"][0]


def pod_env(container: dict) -> dict[str, str]:
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    env["NODE_RANK"] = "0"  # downward API (the Job's completion index)
    # The one change to the pod: the host network is shared with other tests, so the pod's ports are remapped
    # to free ones, as a container runtime's port mapping would (the contract test checks the real ones).
    if "RLT_METRICS_PORT" in env:
        env["RLT_METRICS_PORT"] = str(free_port())
    return env


def pod_mounts(pod: dict, container: dict) -> tuple[bool, tuple[str, ...]]:
    """readOnlyRootFilesystem and the emptyDir mount paths (tmpfs here) of the rendered container."""
    empty = {v["name"] for v in pod["volumes"] if "emptyDir" in v}
    tmpfs = tuple(
        m["mountPath"]
        for m in container["volumeMounts"]
        if m["name"] in empty and not m["mountPath"].startswith("/dev/")
    )  # /dev/shm: the host's /dev is bound already
    return bool(container.get("securityContext", {}).get("readOnlyRootFilesystem")), tmpfs


def remap_port(command: list[str], port: int) -> list[str]:
    i = command.index("--port")
    return [*command[: i + 1], str(port), *command[i + 2 :]]


def mounts(tiny_run, tmp_path: Path) -> tuple[Path, dict[str, str]]:
    data = tmp_path / "data"  # the spec comes in the container's env (RLT_RUN_YAML), no ConfigMap volume
    data.mkdir()
    return data, {str(data): PVC_MOUNT}


def chown_for(pod: dict, *paths: Path) -> None:
    """What fsGroup does to a volume: the pod's group owns it and may write."""
    sc = pod["securityContext"]
    for p in paths:
        for q in [p, *p.rglob("*")]:
            shutil.chown(q, sc["runAsUser"], sc["runAsGroup"])


@pytest.fixture(scope="module")
def trainer_image():
    return images.rootfs("trainer")


@pytest.fixture(scope="module")
def generator_image():
    return images.rootfs("generator")


def test_trainer_image_trains_sft_from_the_rendered_command(trainer_image, tiny_run, tmp_path):
    pod, c = rendered(tiny_run, "trainer", "sft")
    data, binds = mounts(tiny_run, tmp_path)
    chown_for(pod, data)
    sc = pod["securityContext"]
    read_only, tmpfs = pod_mounts(pod, c)
    log = tmp_path / "trainer.log"
    with log.open("w") as out:
        proc = images.run_rootfs(
            trainer_image,
            c["command"],
            env=pod_env(c),
            uid=sc["runAsUser"],
            gid=sc["runAsGroup"],
            binds=binds,
            read_only=read_only,
            tmpfs=tmpfs,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        rc = proc.wait(timeout=1800)
    assert rc == 0, log.read_text()[-4000:]
    run = RunLayout.for_run(data, tiny_run.metadata.name)
    assert run.stage_done("sft").exists(), sorted(str(p) for p in data.rglob("*"))[:50]
    assert (run.model_dir("sft") / "config.json").exists()


def test_trainer_image_imports_trls_vllm_client(trainer_image):
    """Server-mode rl builds TRL's VLLMClient in the trainer, which needs vLLM importable there (issue 10, item 2)."""
    code = (
        "import trl.generation.vllm_client as c, transformers, importlib.metadata as m; "
        "assert c.is_vllm_available(); print('vllm', c._HAS_STATEFUL_TRAINER_ENGINE, transformers.__version__)"
    )
    proc = images.run_rootfs(
        trainer_image,
        ["python3", "-W", "ignore", "-c", code],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    out = proc.communicate(timeout=600)[0]
    assert proc.returncode == 0 and "vllm True" in out, out[-3000:]


def test_generator_image_serves_health_from_the_rendered_command(generator_image, tiny_run, tmp_path):
    from rlt.data.models import resolve_model_path

    pod, c = rendered(tiny_run, "generator", "rl")
    data, binds = mounts(tiny_run, tmp_path)
    # The generator of stage rl serves the sft model from the PVC: put the tiny model where sft would have.
    model = RunLayout.for_run(data, tiny_run.metadata.name).model_dir("sft")
    shutil.copytree(resolve_model_path("builtin:tiny-qwen2"), model)
    assert str(RunLayout.for_run(PVC_MOUNT, tiny_run.metadata.name).model_dir("sft")) in c["command"]
    chown_for(pod, data)
    assert c["command"][c["command"].index("--port") + 1] == str(c["ports"][0]["containerPort"])
    port = free_port()
    sc = pod["securityContext"]
    read_only, tmpfs = pod_mounts(pod, c)
    log = tmp_path / "generator.log"
    with log.open("w") as out:
        proc = images.run_rootfs(
            generator_image,
            remap_port(c["command"], port),
            env=pod_env(c),
            uid=sc["runAsUser"],
            gid=sc["runAsGroup"],
            binds=binds,
            read_only=read_only,
            tmpfs=tmpfs,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 600
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=3) as r:
                    assert r.status == 200
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail("generator never answered /health:\n" + log.read_text()[-4000:])
                time.sleep(2)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=10) as r:
            assert str(RunLayout.for_run(PVC_MOUNT, tiny_run.metadata.name).model_dir("sft")) in r.read().decode()
    finally:
        images.stop(proc)
