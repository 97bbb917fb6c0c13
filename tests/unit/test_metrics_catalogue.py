"""One source for metric names: the catalogue drives the exporter and the docs table."""

from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from suite_helpers import ROOT

from rlt.contract.metrics import ALL_METRICS, CONTROLLER_RUNTIME_NAMES, TrainerMetrics, markdown_table


def test_names_follow_prometheus_conventions():
    names = [d.name for d in ALL_METRICS]
    assert len(names) == len(set(names))
    for d in ALL_METRICS:
        # ours are rlt_*; the operator's reconcile and API-client series keep controller-runtime's names
        assert d.name.startswith("rlt_") or (d.name in CONTROLLER_RUNTIME_NAMES and d.source == "operator"), d.name
        assert d.name.endswith("_total") == (d.kind == "counter"), d.name
        assert d.kind in ("gauge", "counter", "histogram")
        assert len(d.labels) <= 5 and "step" not in d.labels


def test_docs_table_matches_catalogue():
    doc = (ROOT / "docs" / "metrics.md").read_text()
    assert markdown_table() in doc, (
        "docs/metrics.md is stale: paste rlt.contract.metrics.markdown_table() between the markers"
    )


def test_exporter_uses_catalogue_names_and_labels():
    reg = CollectorRegistry()
    m = TrainerMetrics("r1", registry=reg)
    m.stage = "rl"
    m.set("rlt_reward_component", -1.5, component="r_ss")
    m.inc("rlt_generated_tokens_total", 10)
    m.observe("rlt_step_phase_seconds", 0.3, phase="score")
    text = generate_latest(reg).decode()
    assert 'rlt_reward_component{component="r_ss",method="rlt",namespace="local",run="r1",stage="rl"} -1.5' in text
    assert 'rlt_generated_tokens_total{method="rlt",namespace="local",run="r1",stage="rl"} 10.0' in text
    assert 'rlt_step_phase_seconds_count{method="rlt",namespace="local",phase="score",run="r1",stage="rl"} 1.0' in text


def test_spec_reference_matches_model():
    from suite_helpers import hack_module

    spec_table = hack_module("gen_docs").spec_table

    assert spec_table() in (ROOT / "docs" / "spec.md").read_text(), "docs/spec.md is stale: run make docs"


def test_no_shipped_module_retypes_a_metric_name():
    """A metric's name as a string literal outside the catalogue (rlt.contract.metrics): a rename there would leave
    the writer or the reader on the old name. The catalogue's named constants are used instead."""
    import ast

    import rlt
    import rlt_operator

    names = {d.name for d in ALL_METRICS}
    offenders = []
    for package in (rlt, rlt_operator):
        base = Path(package.__file__).resolve().parent
        for path in sorted(base.rglob("*.py")):
            if path.relative_to(base).as_posix() == "contract/metrics.py":
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Constant) and node.value in names:
                    offenders.append(f"{path.relative_to(base)}:{node.lineno}: {node.value}")
    assert not offenders
