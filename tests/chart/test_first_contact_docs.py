"""What a new user reads first agrees with the code: how to get `rlt`, what to run first, the example's namespace
and labels, the reward batch size.
(That the chart refuses its placeholder image is tests/chart/test_chart_render.py's.)"""

from __future__ import annotations

import re

import yaml
from suite_helpers import ROOT

from rlt.checks.validation import load_valid_run
from rlt.spec.stages import RewardSpec


def read(rel: str) -> str:
    return (ROOT / rel).read_text()


def test_readme_quick_start_commands_exist_in_their_order():
    """The Quick start's steps name make targets and files that exist, venv before activate before the tiny run
    before the demo (a renamed target or moved example breaks the first thing a user types)."""
    quick = read("README.md").split("## Quick start", 1)[1].split("##", 1)[0]
    order = [quick.index(s) for s in ("make venv", "source .venv/bin/activate", "rltrun-tiny.yaml", "make demo")]
    assert order == sorted(order)
    targets = set(re.findall(r"^([a-z][a-z0-9-]*):", read("Makefile"), re.M))
    named = set(re.findall(r"\bmake ([a-z][a-z0-9-]*)", quick))
    assert {"venv", "demo"} <= named <= targets, named - targets
    for path in re.findall(r"manifests/examples/[\w.-]+\.yaml", quick):
        assert (ROOT / path).is_file(), path


def test_quick_start_names_the_command_that_installs_the_sandbox_tools():
    """kubectl (for `rlt sandbox`), helm and prometheus come from `make tools` alone: the Quick start says so, and
    that target's recipe is the one that puts each of them in .tools/bin."""
    quick = read("README.md").split("## Quick start", 1)[1].split("## ", 1)[0]
    line = next(s for s in quick.splitlines() if s.startswith("make tools"))
    assert all(tool in line for tool in ("helm", "kubectl", "prometheus")), line
    said = " ".join(quick.split("```")[2].split())
    assert "only `make tools` installs helm, kubectl and prometheus" in said, said
    makefile = read("Makefile")
    tools = re.search(r"^tools: (.*)$", makefile, re.M).group(1).split()
    recipes = {t: makefile.split(f"\n{t}:", 1)[1].split("\n\n", 1)[0] for t in tools if t.startswith("$(TOOLS)")}
    built = " ".join(recipes.values())
    for binary in ("helm/helm", "kubectl/kubectl", "$(TOOLS)/promtool", "$(TOOLS)/prometheus"):
        assert binary in built, binary
    assert "make tools" in makefile.split("help:", 1)[1].split("\n\n", 1)[0]  # `make help` lists it


def test_walkthrough_kubeconfig_and_selector_work_without_tmpdir():
    walk = read("docs/walkthrough.md")
    assert "$TMPDIR" not in walk
    selector = re.search(r"-l rlt\.dev/run=(\S+)", walk).group(1)
    run = load_valid_run(ROOT / "manifests/examples/rltrun-small-2gpu.yaml")
    assert run.metadata.labels.get("rlt.dev/run") == selector == run.name  # the RLTRun itself is selected too
    assert f"--namespace {run.metadata.namespace}" in walk  # the sandbox serves the example's namespace


def rendered_notes(tmp_path, *sets: str, api: bool = False) -> str:
    """NOTES.txt as `helm install` prints it, without a cluster: the chart copied, its NOTES rendered through `tpl`
    into a ConfigMap that `helm template` shows. api: the cluster serves monitoring.coreos.com/v1."""
    import shutil

    from chart_helpers import CHART, IMAGE, MONITORING_API, helm

    chart = tmp_path / "chart"
    shutil.copytree(CHART, chart)
    shutil.copy(chart / "templates" / "NOTES.txt", chart / "files" / "NOTES.txt")
    (chart / "templates" / "zz-notes.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: notes}\ndata:\n  notes: |\n"
        '{{ tpl (.Files.Get "files/NOTES.txt") . | indent 4 }}\n'
    )
    args = [a for v in sets for a in ("--set", v)] + (["--api-versions", MONITORING_API] if api else [])
    out = helm("template", "rel", str(chart), *IMAGE, *args, "--show-only", "templates/zz-notes.yaml").stdout
    return yaml.safe_load(out)["data"]["notes"]


def test_helm_notes_create_the_example_namespace_first(tmp_path):
    ns = yaml.safe_load(read("manifests/examples/rltrun-small-2gpu.yaml"))["metadata"]["namespace"]
    notes = rendered_notes(tmp_path)
    assert notes.index(f"kubectl create namespace {ns}") < notes.index(
        "kubectl apply -f manifests/examples/rltrun-small-2gpu.yaml"
    )
    assert f"kubectl -n {ns} get rltruns -w" in notes
    assert "helm test rel -n default" in notes and "The RLTRun CRD is kept" in notes


def test_helm_notes_send_the_example_where_the_operator_watches(tmp_path):
    """With watchNamespaces the example's own namespace is not watched: the notes apply it to a watched one; and
    with crds.install off the chart keeps no CRD, so the notes do not say it does."""
    notes = rendered_notes(tmp_path, "operator.watchNamespaces={team-a,team-b}", "crds.install=false")
    assert "sed 's/namespace: research/namespace: team-a/' manifests/examples/rltrun-small-2gpu.yaml" in notes
    assert "kubectl -n team-a get rltruns -w" in notes and "kubectl create namespace research" not in notes
    assert "The RLTRun CRD is kept" not in notes
    listed = rendered_notes(
        tmp_path / "listed", "operator.watchNamespaces={team,research}", "metrics.service.enabled=false"
    )
    assert "kubectl create namespace research" in listed and "does not watch" not in listed  # research is watched
    assert "helm test" not in listed  # the test pod reads the metrics Service, which is off


def test_reward_doc_states_the_default_batch_size():
    said = re.search(r"`reward\.batchSize`, default (\d+)", read("docs/reward.md"))
    assert said and int(said.group(1)) == RewardSpec().batch_size


def test_readme_and_install_guide_name_one_release_and_its_deployment():
    """The README's `helm install` and docs/install.md use one release name, and the `deployment/…` that install.md
    waits for is the Deployment the chart renders for it (another name makes `kubectl rollout status` fail)."""
    from chart_helpers import by_kind, template

    readme = " ".join(read("README.md").split())
    install = read("docs/install.md")
    releases = set(re.findall(r"helm install (\S+) charts/rlt-operator", readme + install))
    assert len(releases) == 1, releases
    [release] = releases
    [deployment] = by_kind(template(release=release), "Deployment")
    waited = set(re.findall(r"deployment/([\w.-]+)", install))
    assert waited == {deployment["metadata"]["name"]}, (waited, deployment["metadata"]["name"])


def test_the_chart_readmes_first_command_renders():
    """The first command a chart user copies must work: the chart refuses its placeholder image, so it names one."""
    from chart_helpers import helm

    block = read("charts/rlt-operator/README.md").split("```sh", 1)[1].split("```", 1)[0]
    words = block.replace("\\\n", " ").split()
    assert words[:2] == ["helm", "install"], words
    release, chart, *flags = words[2:]
    flags = [f for f in flags if f != "--create-namespace"]
    helm("template", release, str(ROOT / chart), *flags)


def test_install_guide_says_pvcs_are_kept_and_refused_specs_are_held():
    install = read("docs/install.md")
    assert "PVCs stay" in install and "PVCs)" not in install
    assert "as Failed" not in install and "it is held" in install
    assert "## Rolling back" in install and "## Which replica works, several installs" in install


def test_helm_notes_say_operator_down_needs_the_service_monitor(tmp_path):
    """Alerts without the chart's ServiceMonitor: RLTOperatorDown then leaves out "none scraped" (the chart makes no
    scrape of job rlt-operator), and the notes say how to give it one."""
    alone = rendered_notes(tmp_path / "alone", "prometheusRule.enabled=true", api=True)
    assert 'RLTOperatorDown watches the scrape job "rlt-operator"' in alone
    on = ("prometheusRule.enabled=true", "metrics.serviceMonitor.enabled=true")
    assert "RLTOperatorDown" not in rendered_notes(tmp_path / "both", *on, api=True)
    # no monitoring API: no rule was made, and the warning above says so
    assert "RLTOperatorDown" not in rendered_notes(tmp_path / "no-api", "prometheusRule.enabled=true")
