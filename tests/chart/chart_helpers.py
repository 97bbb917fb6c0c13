"""Fixtures for the chart tests: real helm, kubernetes-validate, promtool, node (prometheus-operator schemas)."""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml
from suite_helpers import ROOT, find_tool

CHART = ROOT / "charts" / "rlt-operator"
MONITORING_API = "monitoring.coreos.com/v1"
PROMOP_MODELS = ROOT / ".tools" / "npm" / "node_modules" / "@kubernetes-models" / "prometheus-operator"

# The values files every render test runs over: name -> (values files, extra helm args).
VALUE_SETS = {
    "defaults": ([], []),
    "namespaced": ([CHART / "ci" / "namespaced-values.yaml"], []),
    "monitoring": ([CHART / "ci" / "monitoring-values.yaml"], ["--api-versions", MONITORING_API]),
}


def tool(name: str) -> str:
    path = find_tool(name)
    if not path:
        pytest.skip(f"{name} not found: run `make tools` (make test installs it)")
    return path


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([tool("helm"), *args], capture_output=True, text=True, timeout=120)
    if check and proc.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


# The chart refuses its placeholder image (nothing is published at ghcr.io/rlt-dev): renders name one.
IMAGE = ("--set", "image.repository=registry.example.com/rlt/rlt-operator")


def template(*extra: str, release: str = "rel", namespace: str = "rlt-system") -> list[dict]:
    out = helm("template", release, str(CHART), "--namespace", namespace, *IMAGE, *extra).stdout
    return [d for d in yaml.safe_load_all(out) if d]


_cache: dict[str, list[dict]] = {}


def render_set(name: str) -> list[dict]:
    if name not in _cache:
        files, extra = VALUE_SETS[name]
        args = [a for f in files for a in ("-f", str(f))] + extra
        _cache[name] = template(*args)
    return _cache[name]


def by_kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d.get("kind") == kind]


def one(docs: list[dict], kind: str, name_suffix: str = "") -> dict:
    found = [d for d in by_kind(docs, kind) if d["metadata"]["name"].endswith(name_suffix)]
    assert len(found) == 1, f"expected one {kind} *{name_suffix}, found {[d['metadata']['name'] for d in found]}"
    return found[0]


def validate_monitoring_objects(docs: list[dict]) -> list[str]:
    """Validate prometheus-operator objects with the JSON schemas of @kubernetes-models/prometheus-operator
    (ajv, in node). Returns one error line per invalid object."""
    if not (PROMOP_MODELS / "package.json").exists():
        pytest.skip("prometheus-operator schemas missing: run `make tools`")
    node = tool("node")
    script = f"""
import {{ readFileSync }} from "node:fs";
const m = await import({json.dumps(str(PROMOP_MODELS / "monitoring.coreos.com" / "v1" / "index.js"))});
const docs = JSON.parse(readFileSync(0, "utf8"));
const errors = [];
for (const d of docs) {{
  const cls = m[d.kind];
  if (!cls) {{ errors.push(`${{d.kind}}: no schema`); continue; }}
  try {{ new cls(d).validate(); }} catch (e) {{ errors.push(`${{d.kind}} ${{d.metadata.name}}: ${{e.message}}`); }}
}}
process.stdout.write(JSON.stringify(errors));
"""
    proc = subprocess.run(
        [node, "--input-type=module", "-e", script], input=json.dumps(docs), capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)
