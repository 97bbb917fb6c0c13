"""kubectl's reading of a run file is the reference: what `kubectl apply --dry-run=client` would send (its
last-applied configuration, the object as JSON) equals what rlt's reader reads, for every example and for the valid
YAML that YAML 1.2 reads otherwise (merge keys, whole numbers written as floats)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from suite_helpers import EXAMPLES, find_tool

from rlt.spec.reader import load_yaml

KUBECTL = find_tool("kubectl")

pytestmark = [pytest.mark.timeout(180), pytest.mark.skipif(KUBECTL is None, reason="kubectl not installed")]

TRICKY = """\
apiVersion: rlt.dev/v1alpha1
kind: RLTRun
metadata:
  name: tricky
spec:
  teacher: &model {model: builtin:tiny-qwen2}
  student:
    <<: *model
  dataset: {source: builtin:mixed, size: 8.0, seed: -2.0}
  stages:
    sft: &small {maxSteps: 1e3, batchSize: 8}
    rl:
      <<: [*small, {steps: 3}]
      steps: 4
      learningRate: 1.5e-6
      beta: 0.0
      maxCompletionLength: 1e21
"""


def _as_kubectl_sends(sandbox, path: Path) -> list[dict]:
    out = json.loads(sandbox.kubectl("apply", "--dry-run=client", "--validate=false", "-o", "json", "-f", str(path)))
    objects = out["items"] if out.get("kind") == "List" else [out]
    sent = []
    for obj in objects:
        last = obj["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"]
        doc = json.loads(last)
        doc["metadata"].pop("annotations")  # kubectl's own additions, not the file's
        if "namespace" not in _file_docs(path)[len(sent)].get("metadata", {}):
            doc["metadata"].pop("namespace")
        sent.append(doc)
    return sent


def _file_docs(path: Path) -> list[dict]:
    return load_yaml(path.read_text())


def test_rlt_reads_run_files_as_kubectl_sends_them(start_sandbox, tmp_path):
    tricky = tmp_path / "tricky.yaml"
    tricky.write_text(TRICKY)
    sandbox = start_sandbox()
    corpus = [*sorted(EXAMPLES.glob("*.yaml")), tricky]
    for path in corpus:
        assert _file_docs(path) == _as_kubectl_sends(sandbox, path), path.name
    [doc] = _file_docs(tricky)
    rl = doc["spec"]["stages"]["rl"]
    assert doc["spec"]["student"] == {"model": "builtin:tiny-qwen2"} and rl["maxSteps"] == 1000 and rl["steps"] == 4
    assert isinstance(doc["spec"]["dataset"]["size"], int) and isinstance(rl["maxCompletionLength"], float)
