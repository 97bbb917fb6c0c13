"""What a new user reads first agrees with the code: how to get `rlt`, what to run first, the example's namespace
and labels, the reward batch size, and the placeholder images."""

from __future__ import annotations

import re

import yaml
from suite_helpers import ROOT

from rlt.spec import RewardSpec, load_run


def read(rel: str) -> str:
    return (ROOT / rel).read_text()


def test_readme_puts_rlt_on_path_and_offers_the_tiny_run_before_the_demo():
    quick = read("README.md").split("## Quick start", 1)[1].split("##", 1)[0]
    order = [quick.index(s) for s in ("make venv", "source .venv/bin/activate", "rltrun-tiny.yaml", "make demo")]
    assert order == sorted(order)
    assert "about 10 min" in quick
    assert "no rlt images are published" in read("README.md") and "make images" in read("README.md")


def test_tiny_run_timing_is_said_the_same_way_everywhere():
    for rel in ("README.md", "docs/walkthrough.md", "manifests/examples/rltrun-tiny.yaml"):
        text = read(rel)
        assert "a minute or two" in text, rel
        assert not re.search(r"tiny.*(in seconds|about a minute\b)|seconds-long", text), rel


def test_walkthrough_kubeconfig_and_selector_work_without_tmpdir():
    walk = read("docs/walkthrough.md")
    assert "$TMPDIR" not in walk
    selector = re.search(r"-l rlt\.dev/run=(\S+)", walk).group(1)
    run = load_run(ROOT / "manifests/examples/rltrun-small-2gpu.yaml")
    assert run.metadata.labels.get("rlt.dev/run") == selector == run.name  # the RLTRun itself is selected too
    assert f"--namespace {run.metadata.namespace}" in walk  # the sandbox serves the example's namespace


def test_helm_notes_create_the_example_namespace_first():
    notes = read("charts/rlt-operator/templates/NOTES.txt")
    ns = yaml.safe_load(read("manifests/examples/rltrun-small-2gpu.yaml"))["metadata"]["namespace"]
    assert notes.index(f"kubectl create namespace {ns}") < notes.index(
        "kubectl apply -f manifests/examples/rltrun-small-2gpu.yaml"
    )
    assert f"kubectl -n {ns} get rltruns -w" in notes


def test_reward_doc_states_the_default_batch_size():
    said = re.search(r"`reward\.batchSize`, default (\d+)", read("docs/reward.md"))
    assert said and int(said.group(1)) == RewardSpec().batch_size


def test_placeholder_images_are_said_to_be_placeholders():
    values = read("charts/rlt-operator/values.yaml")
    assert "A PLACEHOLDER" in values and "make images" in values
    install = read("docs/install.md")
    assert install.index("## Images first") < install.index("## Install with Helm")
