"""The dashboard JSON type-checks against Grafana's own schema (@grafana/schema's `Dashboard`, with tsc).

Each dashboard becomes a TypeScript object literal typed `Dashboard`: literal types are kept, so enum fields
(panel types, variable types, ...) and excess properties are checked too, not just the JSON's shape.
"""

from __future__ import annotations

import json
import subprocess

import pytest
from obs_helpers import DASHBOARD_DIR, ROOT, dashboards, tool

NPM = ROOT / ".tools" / "npm" / "node_modules"


def tsc_check(tmp_path, named: dict[str, dict]) -> subprocess.CompletedProcess:
    if not (NPM / "@grafana" / "schema" / "package.json").exists() or not (NPM / ".bin" / "tsc").exists():
        pytest.skip("@grafana/schema + typescript missing: run `make tools`")
    tool("node")
    files = []
    for name, dash in named.items():
        ident = name.removesuffix(".json").replace("-", "_")
        path = tmp_path / f"{ident}.ts"
        path.write_text(
            'import type { Dashboard } from "@grafana/schema";\n'
            f"export const {ident}: Dashboard = {json.dumps(dash, indent=1)};\n"
        )
        files.append(path.name)
    (tmp_path / "tsconfig.json").write_text(
        json.dumps(
            {
                "compilerOptions": {
                    "strict": True,
                    "noEmit": True,
                    "skipLibCheck": True,
                    "module": "esnext",
                    "moduleResolution": "bundler",
                    "baseUrl": ".",
                    "paths": {"@grafana/schema": [str(NPM / "@grafana" / "schema")]},
                },
                "files": files,
            }
        )
    )
    return subprocess.run([str(NPM / ".bin" / "tsc"), "-p", str(tmp_path)], capture_output=True, text=True, timeout=120)


def test_dashboards_match_grafana_schema(tmp_path):
    named = dashboards()
    assert len(named) == 4 and DASHBOARD_DIR.is_dir()
    proc = tsc_check(tmp_path, named)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_schema_check_rejects_a_broken_dashboard(tmp_path):
    dash = json.loads(json.dumps(next(iter(dashboards().values()))))
    dash["refresh"] = 30  # must be a string such as "30s"
    dash["panels"][0]["gridPos"]["w"] = "wide"
    proc = tsc_check(tmp_path, {"broken.json": dash})
    assert proc.returncode != 0
    assert proc.stdout.count("error TS") >= 2, proc.stdout
