"""One source of truth between the images and what runs them: the user, workdir, entrypoint, ports and env of
each Containerfile's final stage must be what the chart's Deployment (operator) and the operator's builders
(trainer Job, generator StatefulSet) reference; every image reference and tag comes from pyproject's version."""

from __future__ import annotations

import json
import re
import shlex

import pytest
import yaml
from chart_helpers import CHART, IMAGE, ROOT, helm
from suite_helpers import PYPROJECT_VERSION, tiny_doc

from rlt.contract.layout import PVC_MOUNT
from rlt.spec.loading import parse_run
from rlt.spec.run import RLTRunSpec
from rlt_operator import builders as b

VERSION = PYPROJECT_VERSION
REGISTRY = re.search(r"^IMAGE_REGISTRY \?= (\S+)$", (ROOT / "Makefile").read_text(), re.M).group(1)


def final_stage(name: str) -> dict:
    """USER, WORKDIR, EXPOSE, ENTRYPOINT, ENV and ARG defaults of an image's last stage (continuations joined)."""
    text = re.sub(r"\\\n\s*", " ", (ROOT / "images" / name / "Containerfile").read_text())
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    last_from = max(i for i, ln in enumerate(lines) if ln.startswith("FROM "))
    out: dict = {"user": None, "workdir": None, "expose": set(), "entrypoint": None, "env": {}, "args": {}}
    for i, ln in enumerate(lines):
        word, _, rest = ln.partition(" ")
        if word == "ARG" and "=" in rest:
            k, _, v = rest.partition("=")
            out["args"][k] = v
        if i < last_from:
            continue
        if word == "USER":
            out["user"] = rest
        elif word == "WORKDIR":
            out["workdir"] = rest
        elif word == "EXPOSE":
            out["expose"] |= {int(p.split("/")[0]) for p in rest.split()}
        elif word == "ENTRYPOINT":
            out["entrypoint"] = json.loads(rest)
        elif word == "ENV":
            out["env"].update(dict(kv.split("=", 1) for kv in shlex.split(rest)))
    return out


def example_spec() -> RLTRunSpec:
    doc = tiny_doc()
    doc["spec"]["stages"]["rl"].setdefault("generation", {})["mode"] = "server"
    doc["spec"]["resources"] = {"generator": {"replicas": 1, "gpus": 1}, "trainer": {"nodes": 1, "gpus": 1}}
    return parse_run(doc).spec


REF = b.RunRef(name="tiny", namespace="default", uid="u")


def operator_deployment(*args: str) -> dict:
    out = helm("template", "rlt", str(CHART), *IMAGE, *args).stdout
    return next(d for d in yaml.safe_load_all(out) if d and d["kind"] == "Deployment")


def uid_gid(user: str) -> tuple[int, int]:
    uid, _, gid = user.partition(":")
    return int(uid), int(gid)


def test_operator_image_matches_the_chart():
    img = final_stage("operator")
    pod = operator_deployment()["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert uid_gid(img["user"]) == (pod["securityContext"]["runAsUser"], pod["securityContext"]["runAsGroup"])
    assert c["command"][0] == img["entrypoint"][0] == "rlt"
    env = {e["name"]: e.get("value") for e in c["env"]}
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert img["expose"] == set(ports.values())
    assert int(env["RLT_OPERATOR_METRICS_PORT"]) == ports["metrics"] == int(img["env"]["RLT_OPERATOR_METRICS_PORT"])
    assert int(env["RLT_OPERATOR_HEALTH_PORT"]) == ports["health"] == int(img["env"]["RLT_OPERATOR_HEALTH_PORT"])
    assert img["env"]["PYTHONDONTWRITEBYTECODE"] == "1", "the chart's root filesystem is read-only"


def test_trainer_image_matches_the_builders():
    img = final_stage("trainer")
    spec = example_spec()
    job = b.trainer_job(REF, spec, "sft", 0)["spec"]["template"]["spec"]
    c = job["containers"][0]
    assert uid_gid(img["user"]) == (job["securityContext"]["runAsUser"], job["securityContext"]["runAsGroup"])
    assert img["workdir"] == PVC_MOUNT == next(m["mountPath"] for m in c["volumeMounts"] if m["name"] == "data")
    assert img["expose"] == {p["containerPort"] for p in c["ports"]} == {b.MASTER_PORT, b.METRICS_PORT}
    assert int(img["env"]["RLT_METRICS_PORT"]) == b.METRICS_PORT
    assert c["command"][0] == img["entrypoint"][0] == "rlt"
    assert img["env"]["HF_HOME"].startswith(PVC_MOUNT + "/")
    # Distributed stages start through accelerate, which the image must put on the same PATH as rlt.
    multi = spec.model_copy(
        update={
            "resources": spec.resources.model_copy(
                update={"trainer": spec.resources.trainer.model_copy(update={"gpus": 2})}
            )
        }
    )
    assert b.trainer_command(multi, "sft")[:4] == ["rlt", "launch", "--", "accelerate"]
    assert img["env"]["PATH"].startswith("/opt/venv/bin:")


def test_generator_image_matches_the_builders():
    img = final_stage("generator")
    spec = example_spec()
    sts = b.generator_statefulset(REF, spec, "rl", 0)["spec"]["template"]["spec"]
    c = sts["containers"][0]
    assert uid_gid(img["user"]) == (sts["securityContext"]["runAsUser"], sts["securityContext"]["runAsGroup"])
    assert img["workdir"] == PVC_MOUNT
    assert img["expose"] == {p["containerPort"] for p in c["ports"]} == {b.VLLM_PORT}
    # The pod's command is the image's entrypoint followed by the flags: one source (builders.GENERATOR_ENTRYPOINT).
    assert tuple(img["entrypoint"]) == b.GENERATOR_ENTRYPOINT
    assert c["command"][: len(img["entrypoint"])] == img["entrypoint"]
    assert img["entrypoint"][0] == "python3", "vLLM's images have python3, not python"
    pod_env = {e["name"]: e.get("value") for e in c["env"]}
    assert pod_env["VLLM_SERVER_DEV_MODE"] == img["env"]["VLLM_SERVER_DEV_MODE"] == "1"


@pytest.mark.parametrize("name", ["operator", "trainer", "generator"])
def test_version_comes_from_pyproject(name):
    assert final_stage(name)["args"]["VERSION"] == VERSION
    assert final_stage(name)["args"]["BASE_IMAGE"], "every Containerfile takes its base as a build argument"


def test_default_image_references_are_what_make_images_tags():
    fields = type(example_spec().images).model_fields  # spec.images defaults, as the CRD publishes them
    assert fields["trainer"].default == f"{REGISTRY}/rlt-trainer:{VERSION}"
    assert fields["generator"].default == f"{REGISTRY}/rlt-generator:{VERSION}"
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert chart["appVersion"] == VERSION
    assert values["image"]["repository"] == f"{REGISTRY}/rlt-operator"
    c = operator_deployment()["spec"]["template"]["spec"]["containers"][0]
    assert c["image"] == f"{IMAGE[1].split('=', 1)[1]}:{VERSION}", "the tag defaults to the version make images tags"
    makefile = (ROOT / "Makefile").read_text()
    assert "IMAGE_TAG      ?= $(shell sed -n 's/^version = \"\\(.*\\)\"/\\1/p' pyproject.toml)" in makefile
