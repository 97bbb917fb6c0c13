"""Writes the repository's generated files from their one source; the shipped packages only render them.

    python hack/generate.py crd         manifests/crd/rltruns.rlt.dev.yaml (rlt_operator.crd.render)
    python hack/generate.py chart-rbac  the chart's RBAC rules and Kopf's peering CRDs (rlt_operator.cluster.rbac, .peering)
    python hack/generate.py docs        the generated tables of docs/*.md (hack/gen_docs.py)
    python hack/generate.py trl-options training/rlt/spec/trl_options.json from the installed TRL
                                        (rlt.stages.trainer_check.render)
    python hack/generate.py k8s-api     training/rlt/spec/k8s_api.json from kubernetes-validate's schemas
                                        (rlt.spec.k8s_api.schema_definitions)

Tests compare each file with its source (tests/operator/test_crd.py, tests/chart, tests/unit).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from rlt_operator.crd import CRD_NAME

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "rlt-operator"
CRD_PATH = ROOT / "manifests" / "crd" / f"{CRD_NAME}.yaml"
CHART_RULES = CHART / "templates" / "_rbac_rules.tpl"
CHART_PEERING_CRDS = CHART / "crds" / "kopf-peerings.yaml"


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    print(f"wrote {path.relative_to(ROOT)}")


def crd() -> None:
    from rlt_operator import crd as source

    _write(CRD_PATH, source.render())


def chart_rbac() -> None:
    from rlt_operator.cluster import peering, rbac

    _write(CHART_RULES, rbac.render_chart_rules())
    _write(CHART_PEERING_CRDS, peering.render_chart_crds())


def docs() -> None:
    sys.path.insert(0, str(Path(__file__).parent))
    import gen_docs

    gen_docs.regenerate()


def trl_options() -> None:
    from rlt.spec.trainer_args import OPTIONS_FILE
    from rlt.stages.trainer_check import render

    _write(OPTIONS_FILE, render())


def k8s_api() -> None:
    from rlt.spec.k8s_api import DEFS_FILE, render

    _write(DEFS_FILE, render())


TARGETS: dict[str, Callable[[], None]] = {
    "crd": crd,
    "chart-rbac": chart_rbac,
    "docs": docs,
    "trl-options": trl_options,
    "k8s-api": k8s_api,
}


def main(argv: list[str]) -> int:
    if not argv or any(a not in TARGETS for a in argv):
        print(f"usage: python hack/generate.py {{{','.join(TARGETS)}}}...", file=sys.stderr)
        return 2
    for target in argv:
        TARGETS[target]()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
