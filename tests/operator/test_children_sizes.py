"""The offline door's size bounds (rlt.checks.consumers) against the children the operator really renders: the
ConfigMap's data, the RLT_RUN_YAML env string of a trainer pod and the pods' annotations, built by the pure builders,
stay within what the check counted plus the room it reserves, so a run the check takes cannot render a child over
the API server's or execve's limits, and the field it names is the one that grew."""

from __future__ import annotations

import pytest
from suite_helpers import deep_merge, tiny_doc

from rlt.checks import consumers
from rlt.checks.validation import run_problems
from rlt.spec.loading import dump_run, parse_run
from rlt_operator import builders as b

REF = b.RunRef(name="tiny", namespace="a-long-namespace-name-of-sixty-three-characters-0123456789abcde", uid="u")


def _run(patch: dict):
    doc = tiny_doc()
    deep_merge(doc["spec"], patch)
    doc["metadata"]["namespace"] = REF.namespace
    return parse_run(doc, "run.yaml")


def _children(run) -> tuple[dict, dict, dict]:
    spec = run.spec
    config = b.configmap(REF, spec)
    job = b.trainer_job(REF, spec, "sft", 0)
    sts = b.generator_statefulset(REF, spec, "rl", 0)
    return config, job, sts


@pytest.mark.parametrize("mode", ["server", "inprocess"])
def test_rendered_children_fit_what_the_check_counted(mode):
    run = _run(
        {
            "stages": {"rl": {"generation": {"mode": mode}}},
            "env": [{"name": "NOTE", "value": "n" * 60_000}],
            "scheduling": {"podAnnotations": {"example.com/a": "a" * 30_000}},
        }
    )
    counted = len(dump_run(consumers._as_run(run.spec, run.name, REF.namespace)).encode())
    config, job, sts = _children(run)
    data = sum(len(k.encode()) + len(v.encode()) for k, v in config["data"].items())
    assert data <= counted + consumers.RESERVED
    env = {e["name"]: e.get("value") for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert len(env["RLT_RUN_YAML"].encode()) <= counted + consumers.RESERVED  # the generator's URL fits the room
    user = sum(len(k) + len(v) for k, v in run.spec.scheduling.pod_annotations.items())
    for template in (job["spec"]["template"], sts["spec"]["template"]):
        notes = template["metadata"].get("annotations", {})
        # the Job controller adds its completion index annotation to each pod (~45 bytes)
        total = sum(len(k.encode()) + len(v.encode()) for k, v in notes.items()) + 64
        assert total <= user + consumers.RESERVED
    assert run_problems(run) == []


def test_the_env_bound_names_the_field_that_grew_and_the_children_are_over():
    run = _run({"format": {"teacherSystemPrompt": "t" * 140_000}})
    problems = consumers.size_problems(run.spec, run.name, REF.namespace)
    assert problems and all(p.startswith("spec.format.teacherSystemPrompt:") for p in problems), problems
    _, job, _ = _children(run)
    env = {e["name"]: e.get("value") for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert len(env["RLT_RUN_YAML"].encode()) > consumers.MAX_ENV_STRING  # the rendered child is over, as counted
