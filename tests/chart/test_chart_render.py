"""helm lint and helm template of charts/rlt-operator over several values files, validated with real tools."""

from __future__ import annotations

import json
import re
import subprocess

import kubernetes_validate
import pytest
import yaml
from chart_helpers import (
    CHART,
    IMAGE,
    MONITORING_API,
    VALUE_SETS,
    by_kind,
    helm,
    one,
    render_set,
    template,
    tool,
    validate_monitoring_objects,
)
from suite_helpers import ROOT

K8S_VERSIONS = ("1.31.0", "1.37.0")
MONITORING_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}
PEERING_KINDS = {"ClusterKopfPeering", "KopfPeering"}  # custom resources: checked in test_chart_ha.py


@pytest.mark.parametrize("name", list(VALUE_SETS))
def test_helm_lint_strict(name):
    files, extra = VALUE_SETS[name]
    args = [a for f in files for a in ("-f", str(f))]
    out = helm("lint", "--strict", str(CHART), *IMAGE, *args).stdout
    assert "1 chart(s) linted, 0 chart(s) failed" in out


def test_the_placeholder_image_is_refused_with_what_to_do():
    proc = helm("template", "rel", str(CHART), check=False)
    assert proc.returncode != 0
    assert (
        "image.repository is ghcr.io/rlt-dev/rlt-operator, a placeholder: no rlt image is published. "
        "Build and push the images (make images IMAGE_REGISTRY=<registry>"
    ) in proc.stderr


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_rendered_objects_are_valid_kubernetes(rendered, version):
    name, docs = rendered
    checked = 0
    for doc in docs:
        if doc["kind"] in MONITORING_KINDS | PEERING_KINDS:
            continue
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as err:
            pytest.fail(f"[{name}] {doc['kind']}/{doc['metadata']['name']} invalid for {version}: {err.message}")
        checked += 1
    assert checked >= 8, f"[{name}] only {checked} core objects rendered"


def test_monitoring_objects_match_prometheus_operator_schemas():
    docs = [d for d in render_set("monitoring") if d["kind"] in MONITORING_KINDS]
    assert {d["kind"] for d in docs} == MONITORING_KINDS
    assert validate_monitoring_objects(docs) == []
    # The validator really rejects a broken object (interval must be a duration string).
    broken = json.loads(json.dumps(one(docs, "ServiceMonitor")))
    broken["spec"]["endpoints"][0]["interval"] = 30
    assert validate_monitoring_objects([broken]) != []


def test_monitoring_is_off_by_default():
    docs = template("--api-versions", MONITORING_API)
    kinds = {d["kind"] for d in docs}
    assert not kinds & MONITORING_KINDS
    assert not [c for c in by_kind(docs, "ConfigMap") if "grafana_dashboard" in c["metadata"]["labels"]]


def test_monitoring_objects_need_the_api():
    """Enabled in values but the cluster has no monitoring.coreos.com/v1: nothing is rendered."""
    docs = template("-f", str(CHART / "ci" / "monitoring-values.yaml"))
    assert not {d["kind"] for d in docs} & MONITORING_KINDS


def test_operator_deployment_is_hardened(rendered):
    name, docs = rendered
    dep = one(docs, "Deployment")
    spec = dep["spec"]
    assert spec["replicas"] == 2  # one works, one waits (Kopf peering; test_chart_ha.py)
    assert spec["strategy"]["type"] == "RollingUpdate"
    pod = spec["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (c,) = pod["containers"]
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert "add" not in sc["capabilities"]
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    probe = c["livenessProbe"]["httpGet"]
    assert probe["path"] == "/healthz" and probe["port"] == "health"
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"metrics": 8080, "health": 8081}
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["RLT_OPERATOR_METRICS_PORT"] == "8080"
    assert c["command"][:2] == ["rlt", "operator"]
    assert pod["serviceAccountName"] == one(docs, "ServiceAccount")["metadata"]["name"]
    # The metrics Service selects exactly the operator pod.
    svc = one(docs, "Service", "-metrics")
    assert svc["spec"]["selector"].items() <= spec["template"]["metadata"]["labels"].items()
    assert svc["spec"]["ports"][0]["targetPort"] == "metrics"


def test_cluster_mode_watches_all_namespaces():
    docs = render_set("defaults")
    args = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--all-namespaces" in args and not [a for a in args if a.startswith("--namespace")]
    # the one Role: the leader Lease's, in the release namespace (test_chart_rbac)
    assert [(r["metadata"]["name"], r["metadata"]["namespace"]) for r in by_kind(docs, "Role")] == [
        ("rel-rlt-operator-leader-election", "rlt-system")
    ]
    assert [r["metadata"]["name"] for r in by_kind(docs, "RoleBinding")] == ["rel-rlt-operator-leader-election"]
    names = {r["metadata"]["name"] for r in by_kind(docs, "ClusterRole")}
    assert {"rel-rlt-operator", "rel-rlt-operator-cluster"} <= names


def test_namespaced_mode_grants_roles_only_in_watched_namespaces():
    docs = render_set("namespaced")
    args = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert [a for a in args if a.startswith("--namespace")] == ["--namespace=team-a", "--namespace=team-b"]
    assert "--all-namespaces" not in args
    lease = "rel-rlt-operator-leader-election"  # the leader Lease's Role, in the release namespace (test_chart_rbac)
    roles = [r for r in by_kind(docs, "Role") if r["metadata"]["name"] != lease]
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    bindings = [b for b in by_kind(docs, "RoleBinding") if b["metadata"]["name"] != lease]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    for b in bindings:
        assert b["subjects"] == [{"kind": "ServiceAccount", "name": "rel-rlt-operator", "namespace": "rlt-system"}]
        assert b["roleRef"]["kind"] == "Role"
    # No cluster-wide grant on runs or their children: the only ClusterRole is the cluster-scoped reads.
    (cluster_role,) = by_kind(docs, "ClusterRole")
    for rule in cluster_role["rules"]:
        assert not {"rltruns", "jobs", "pods", "namespaces"} & set(rule["resources"]), rule


def test_rbac_has_no_wildcards(rendered):
    name, docs = rendered
    for kind in ("ClusterRole", "Role"):
        for role in by_kind(docs, kind):
            for rule in role["rules"]:
                for key in ("apiGroups", "resources", "verbs"):
                    assert "*" not in rule.get(key, []), f"[{name}] wildcard in {role['metadata']['name']}: {rule}"
                assert "nonResourceURLs" not in rule


def test_aggregated_user_roles():
    docs = render_set("defaults")
    editor = one(docs, "ClusterRole", "-rltrun-editor")
    viewer = one(docs, "ClusterRole", "-rltrun-viewer")
    assert editor["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
    assert viewer["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    view_verbs = {v for r in viewer["rules"] for v in r["verbs"]}
    assert view_verbs == {"get", "list", "watch"}
    assert "aggregate-to-view" not in json.dumps(editor["metadata"]["labels"])
    assert not [
        r for r in by_kind(render_set("namespaced"), "ClusterRole") if r["metadata"]["name"].endswith("-editor")
    ]


def test_crd_is_a_kept_template():
    crd = one(render_set("defaults"), "CustomResourceDefinition")
    assert crd["metadata"]["name"] == "rltruns.rlt.dev"
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    unkept = one(render_set("namespaced"), "CustomResourceDefinition")  # crds.keep=false there
    assert "helm.sh/resource-policy" not in (unkept["metadata"].get("annotations") or {})
    assert not by_kind(template("--set", "crds.install=false"), "CustomResourceDefinition")


def test_servicemonitor_and_podmonitor():
    docs = render_set("monitoring")
    sm = one(docs, "ServiceMonitor")
    assert sm["metadata"]["labels"]["release"] == "kps"
    svc = one(docs, "Service", "-metrics")
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert sm["spec"]["endpoints"][0]["port"] == svc["spec"]["ports"][0]["name"]
    assert sm["spec"]["jobLabel"] in svc["metadata"]["labels"]
    pm = one(docs, "PodMonitor")
    assert pm["metadata"]["labels"]["release"] == "kps"
    assert {e["port"] for e in pm["spec"]["podMetricsEndpoints"]} == {"metrics", "http"}
    assert pm["spec"]["namespaceSelector"] == {"any": True}
    exprs = pm["spec"]["selector"]["matchExpressions"]
    assert {"key": "rlt.dev/role", "operator": "In", "values": ["trainer", "generator"]} in exprs
    # In namespaced mode the PodMonitor only looks into the watched namespaces.
    ns_docs = template(
        "-f",
        str(CHART / "ci" / "namespaced-values.yaml"),
        "--set",
        "metrics.podMonitor.enabled=true",
        "--api-versions",
        MONITORING_API,
    )
    assert one(ns_docs, "PodMonitor")["spec"]["namespaceSelector"] == {"matchNames": ["team-a", "team-b"]}


def test_only_the_named_prometheus_namespaces_reach_the_generators_port_8000():
    """metrics.podMonitor.prometheusNamespaces reaches the operator (env, as rendered by real helm) and from it each
    run's generator NetworkPolicy: Prometheus pods of those namespaces only may reach port 8000."""
    from suite_helpers import ROOT

    from rlt.spec.loading import parse_run
    from rlt_operator import builders as b
    from rlt_operator.config.settings import OperatorSettings

    def policy_from(*extra):
        deploy = one(template(*extra), "Deployment")
        env = {e["name"]: e.get("value", "") for e in deploy["spec"]["template"]["spec"]["containers"][0]["env"]}
        settings = OperatorSettings.from_env(env)
        spec = parse_run(yaml.safe_load((ROOT / "manifests/examples/rltrun-tiny.yaml").read_text())).spec
        return b.generator_network_policy(b.RunRef("r", "team-a", "u"), spec, settings.scrapers)["spec"]["ingress"]

    def prometheus_namespaces(ingress):
        peers = [p for rule in ingress for p in rule["from"] if "namespaceSelector" in p]
        assert all(p["namespaceSelector"] for p in peers), "an empty namespaceSelector admits every namespace"
        return [v for p in peers for e in p["namespaceSelector"]["matchExpressions"] for v in e["values"]]

    assert prometheus_namespaces(policy_from()) == ["monitoring"]  # the documented default
    named = policy_from("--set", "metrics.podMonitor.prometheusNamespaces={mon-a,mon-b}")
    assert prometheus_namespaces(named) == ["mon-a", "mon-b"]
    assert prometheus_namespaces(policy_from("--set", "metrics.podMonitor.prometheusNamespaces=null")) == []


def test_prometheusrule_embeds_the_rule_file():
    docs = render_set("monitoring")
    rule = one(docs, "PrometheusRule")
    source = yaml.safe_load((CHART / "files" / "alerts" / "rlt-alerts.yaml").read_text())
    rendered_groups = rule["spec"]["groups"]
    assert [g["name"] for g in rendered_groups] == [g["name"] for g in source["groups"]]
    for got_g, want_g in zip(rendered_groups, source["groups"], strict=True):
        for got, want in zip(got_g["rules"], want_g["rules"], strict=True):
            assert got["expr"] == want["expr"] and got.get("for") == want.get("for")
            assert got["labels"] == {**want["labels"], "team": "ml-platform"}
            assert got["annotations"]["runbook_url"].endswith("docs/alerts.md#" + want["alert"].lower())
            assert {k: v for k, v in got["annotations"].items() if k != "runbook_url"} == want["annotations"]


def test_dashboard_configmaps():
    docs = render_set("monitoring")
    cms = [c for c in by_kind(docs, "ConfigMap") if c["metadata"]["labels"].get("grafana_dashboard") == "1"]
    files = sorted((CHART / "files" / "dashboards").glob("*.json"))
    assert len(cms) == len(files) == 4
    for cm in cms:
        assert cm["metadata"]["namespace"] == "monitoring"
        assert cm["metadata"]["annotations"] == {"grafana_folder": "RLT"}
        ((key, body),) = cm["data"].items()
        assert json.loads(body) == json.loads((CHART / "files" / "dashboards" / key).read_text())


def test_an_extra_env_value_that_is_not_a_string_is_refused_by_the_schema():
    """`value: 60` would reach the API server, which refuses the whole Deployment with a decoding error."""
    env = '[{"name": "RLT_RESYNC_SECONDS", "value": 60}]'
    proc = helm("template", "rel", str(CHART), *IMAGE, "--set-json", f"operator.extraEnv={env}", check=False)
    assert proc.returncode != 0 and "value" in proc.stderr and "string" in proc.stderr, proc.stderr
    ok = '[{"name": "RLT_RESYNC_SECONDS", "value": "60"}]'
    assert helm("template", "rel", str(CHART), *IMAGE, "--set-json", f"operator.extraEnv={ok}").returncode == 0


@pytest.mark.parametrize(
    "bad",
    [
        "operator.logLevel=loud",
        "image.pullPolicy=Sometimes",
        "operator.metricsPort=0",
        "operator.watchNamespaces={Team_A}",
        "metrics.serviceMonitor.interval=often",
        "unknownTopLevel=1",
        "fullnameOverride=Bad_Name",
        "nameOverride=rlt.operator",
        "serviceAccount.name=Ops_Bot",
        "grafanaDashboards.namespace=Bad_NS",
        "resources.requests.memory=1GB",
        "resources.requests.cpu=-1",
        "resources.limits.memory=lots",
        "prometheusRule.runbookBaseUrl=http://",
        "prometheusRule.runbookBaseUrl=mailto:oncall@example.com",
        "prometheusRule.runbookBaseUrl=https://wiki.example.com/rlt#alerts",
        "securityContext.readOnlyRootFileSystem=false",  # a typo the API server would drop with a warning
        "podSecurityContext.runAsUser=root",
        "imagePullSecrets[0].nmae=regcred",
    ],
)
def test_values_schema_rejects(bad):
    proc = helm("template", "rel", str(CHART), *IMAGE, "--set", bad, check=False)
    assert proc.returncode != 0
    assert "values don't meet the specifications of the schema" in proc.stderr
    field = [part for part in re.split(r"[.\[\]]", bad.split("=")[0]) if part][-1]
    assert field in proc.stderr, proc.stderr  # the value the schema refused is the one named


@pytest.mark.parametrize("name", list(VALUE_SETS))
def test_operator_command_parses_with_the_real_cli(name):
    """The Deployment's command line is accepted by `rlt operator`'s own argument parser."""
    from rlt.cli import build_parser

    c = one(render_set(name), "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert c["command"] == ["rlt", "operator"]
    args = build_parser().parse_args(c["command"][1:] + c["args"])
    assert args.func.__name__ == "cmd_operator"
    if name == "namespaced":
        assert args.namespace == ["team-a", "team-b"] and not args.all_namespaces and args.verbose
    else:
        assert args.all_namespaces and not args.namespace
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["RLT_OPERATOR_HEALTH_PORT"] == "8081"  # where `rlt operator` serves /healthz


def _alerts(docs: list[dict]) -> dict[str, dict]:
    return {r["alert"]: r for g in one(docs, "PrometheusRule")["spec"]["groups"] for r in g["rules"] if "alert" in r}


def test_alert_thresholds_and_for_are_chart_values(tmp_path):
    values = tmp_path / "alerting.yaml"
    values.write_text(
        "prometheusRule:\n"
        "  thresholds: {stalledMinutes: 45, stalledStepTimes: 3, stalledFloorMinutes: 10, restartsPerHour: 5,\n"
        "    rewardFlatMinutes: 20, kvCacheUsage: 0.9}\n"
        "  for: {RLTRunFailed: 3m}\n"
    )
    files, extra = VALUE_SETS["monitoring"]
    docs = template(*[a for f in files for a in ("-f", str(f))], *extra, "-f", str(values))
    alerts = _alerts(docs)
    stalled = alerts["RLTRunStalled"]
    said = stalled["expr"] + stalled["annotations"]["summary"] + stalled["annotations"]["description"]
    assert "+ 45 * 60" in stalled["expr"] and "45 minutes while" in stalled["annotations"]["description"]
    assert "3 * max" in stalled["expr"] and "3 step times" in stalled["annotations"]["description"]
    assert "10 * 60" in stalled["expr"] and "at least 10 minutes" in stalled["annotations"]["description"]
    for default in ("30", "2 * max", "2 step", " 5 * 60", "least 5 minutes"):  # every default replaced
        assert default not in said, default
    assert ">= 5" in alerts["RLTRunRestartLoop"]["expr"]
    assert "at least 5 times" in alerts["RLTRunRestartLoop"]["annotations"]["description"]
    assert 'rlt_reward_std{stage="rl"}[20m]' in alerts["RLTRewardCollapsed"]["expr"]
    assert "> 0.9\n" in alerts["RLTGeneratorsSaturated"]["expr"]
    assert "over 90 % full" in alerts["RLTGeneratorsSaturated"]["annotations"]["description"]
    assert alerts["RLTRunFailed"]["for"] == "3m" and alerts["RLTRunStalled"]["for"] == "2m"
    # what the chart renders is still a rule file Prometheus loads
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": one(docs, "PrometheusRule")["spec"]["groups"]}))
    proc = subprocess.run([tool("promtool"), "check", "rules", str(rules)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_threshold_equal_to_another_ones_default_is_not_rewritten_by_it(tmp_path):
    """stalledFloorMinutes 30 is stalledMinutes' default: substituted one after the other, the floor would become
    stalledMinutes' 60 too, in the expression and in the text that states it."""
    values = tmp_path / "alerting.yaml"
    values.write_text("prometheusRule:\n  thresholds: {stalledMinutes: 60, stalledFloorMinutes: 30}\n")
    files, extra = VALUE_SETS["monitoring"]
    stalled = _alerts(template(*[a for f in files for a in ("-f", str(f))], *extra, "-f", str(values)))["RLTRunStalled"]
    assert "30 * 60" in stalled["expr"] and "+ 60 * 60" in stalled["expr"], stalled["expr"]
    assert "at least 30 minutes" in stalled["annotations"]["description"]
    assert "60 minutes while" in stalled["annotations"]["description"]
    assert "@@" not in stalled["expr"] + stalled["annotations"]["description"], "a placeholder left behind"


def test_runbooks_default_to_the_page_in_the_source_tree():
    """No rlt site is published: without prometheusRule.runbookBaseUrl each alert names docs/alerts.md, not a URL of
    an organisation that does not host it."""
    alerts = _alerts(template("--set", "prometheusRule.enabled=true", "--api-versions", MONITORING_API))
    doc = (ROOT / "docs" / "alerts.md").read_text()
    for name, rule in alerts.items():
        assert "runbook_url" not in rule["annotations"], name
        assert rule["annotations"]["runbook"] == f"docs/alerts.md#{name.lower()}"
        assert f"\n## {name}\n" in doc


@pytest.mark.parametrize(
    ("values", "says"),
    [
        (
            ["operator.leaderElection.renewDeadline=20"],
            "operator.leaderElection: retryPeriod (2) < renewDeadline (20) < leaseDuration (15) < 3600 seconds",
        ),
        (["operator.leaderElection.leaseDuration=5000"], "< leaseDuration (5000) < 3600 seconds is required"),
        (["operator.leaderElection.retryPeriod=10"], "retryPeriod (10) < renewDeadline (10)"),
        (["operator.metricsPort=8081"], "operator.metricsPort and operator.healthPort are both 8081"),
        (
            ["metrics.serviceMonitor.enabled=true", "metrics.service.enabled=false"],
            "metrics.serviceMonitor.enabled needs metrics.service.enabled",
        ),
        (["podLabels.app\\.kubernetes\\.io/component=other"], "podLabels.app.kubernetes.io/component: the chart sets"),
        (["prometheusRule.for.RLTRunStaled=45m"], "prometheusRule.for.RLTRunStaled: no such alert (the alerts: "),
        (["prometheusRule.extraAlertLabels.severity=page"], "prometheusRule.extraAlertLabels.severity: the alerts set"),
        (["serviceAccount.create=false"], "serviceAccount.create=false needs serviceAccount.name: without it"),
    ],
)
def test_values_that_conflict_are_refused_at_render_naming_them(values, says):
    """Each value passes the schema alone; together the operator would exit at start (leader timings: the same rule
    as `rlt operator`'s), two servers would share a port, or a label or alert setting would be dropped silently."""
    proc = helm("template", "rel", str(CHART), *IMAGE, *(a for v in values for a in ("--set", v)), check=False)
    assert proc.returncode != 0 and says in proc.stderr, proc.stderr


def test_the_chart_refuses_leader_timings_exactly_when_the_operator_does():
    """The render's rule is `rlt operator`'s timing_problem, value for value (the chart passes them as flags)."""
    from rlt_operator.cluster.leader import timing_problem

    for lease, renew, retry in [(15, 10, 2), (15, 15, 2), (15, 10, 10), (15, 20, 2), (30, 29.5, 0.5), (3599, 10, 2)]:
        # --set-json: --set would read 29.5 as a string
        args = [f"leaseDuration={lease}", f"renewDeadline={renew}", f"retryPeriod={retry}"]
        sets = [a for v in args for a in ("--set-json", f"operator.leaderElection.{v}")]
        proc = helm("template", "rel", str(CHART), *IMAGE, *sets, check=False)
        assert (proc.returncode == 0) == (timing_problem(lease, renew, retry) is None), (args, proc.stderr)


def test_long_and_odd_release_names_give_valid_distinct_names():
    long = "a" * 53  # the longest release name helm takes
    docs = template("--set", "grafanaDashboards.enabled=true", release=long)
    svc = one(docs, "Service", "-metrics")["metadata"]["name"]
    assert len(svc) <= 63 and svc.endswith("-metrics")
    dashboards = [d["metadata"]["name"] for d in by_kind(docs, "ConfigMap") if "-dashboard-" in d["metadata"]["name"]]
    assert len(dashboards) == 4 == len(set(dashboards)) and all(len(n) <= 63 for n in dashboards), dashboards
    proc = helm("template", "1abc", str(CHART), *IMAGE, check=False)
    assert proc.returncode != 0 and 'the metrics Service would be named "1abc-rlt-operator-metrics"' in proc.stderr
    assert (
        one(template("--set", "fullnameOverride=ops", release="1abc"), "Service")["metadata"]["name"] == "ops-metrics"
    )


def test_the_operator_scrape_job_is_rlt_operator_whatever_the_chart_is_called():
    """RLTOperatorDown and the operator dashboard select job="rlt-operator"; nameOverride must not rename it."""
    docs = template(
        "-f",
        str(CHART / "ci" / "monitoring-values.yaml"),
        "--api-versions",
        MONITORING_API,
        "--set",
        "nameOverride=ml-op",
    )
    sm, svc = one(docs, "ServiceMonitor"), one(docs, "Service", "-metrics")
    assert svc["metadata"]["labels"][sm["spec"]["jobLabel"]] == "rlt-operator"
    assert svc["metadata"]["labels"]["app.kubernetes.io/name"] == "ml-op"


def test_a_rollout_waits_for_a_new_operator_that_answers_and_stays_up():
    """Readiness on /healthz and minReadySeconds: with maxUnavailable 0, a new pod that never answers, or crashes
    just after its start, holds the rollout instead of replacing the working replicas."""
    deployment = one(template(), "Deployment")
    spec = deployment["spec"]
    (container,) = [c for c in spec["template"]["spec"]["containers"] if c["name"] == "operator"]
    ready = container["readinessProbe"]
    assert ready["httpGet"] == {"path": "/healthz", "port": "health"}
    assert ready["httpGet"]["port"] in {p["name"] for p in container["ports"]}
    assert spec["minReadySeconds"] == 10 and spec["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    sa = one(template("--set", "serviceAccount.create=false", "--set", "serviceAccount.name=ops"), "Deployment")
    assert sa["spec"]["template"]["spec"]["serviceAccountName"] == "ops"


@pytest.mark.parametrize(
    "unset",
    [None, "metrics.serviceMonitor.enabled=false"],
    ids=["service-monitor", "no-service-monitor"],
)
def test_operator_down_fires_for_no_scrape_only_where_the_chart_makes_the_scrape(tmp_path, unset):
    """RLTOperatorDown's "no operator scraped at all" needs the job="rlt-operator" scrape that the chart's
    ServiceMonitor makes: rendered without one, it would fire from the install on, for ever. The rendered rules run under promtool: no `up` series at all, then an operator
    scraped and gone."""
    files, extra = VALUE_SETS["monitoring"]
    docs = template(*[a for f in files for a in ("-f", str(f))], *extra, *(("--set", unset) if unset else ()))
    service_monitor = unset is None
    assert any(d["kind"] == "ServiceMonitor" for d in docs) == service_monitor
    rule = {k: v for k, v in _alerts(docs)["RLTOperatorDown"].items() if k != "annotations"}  # labels are the test
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": [{"name": "rlt", "rules": [rule]}]}))
    none_scraped = [{"exp_labels": {"severity": "critical", "team": "ml-platform", "job": "rlt-operator"}}]
    none_scraped = none_scraped if service_monitor else []
    gone = {"severity": "critical", "team": "ml-platform", "namespace": "rlt-system", "job": "rlt-operator"}
    case = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [],
                "alert_rule_test": [{"eval_time": "10m", "alertname": "RLTOperatorDown", "exp_alerts": none_scraped}],
            },
            {
                "interval": "1m",
                "input_series": [{"series": 'up{namespace="rlt-system", job="rlt-operator"}', "values": "1x5 0x10"}],
                "alert_rule_test": [
                    {"eval_time": "14m", "alertname": "RLTOperatorDown", "exp_alerts": [{"exp_labels": gone}]}
                ],
            },
        ],
    }
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(case))
    proc = subprocess.run(
        [tool("promtool"), "test", "rules", "test.yaml"], capture_output=True, text=True, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
