"""The emulator glue itself (a hand-written stand-in for an apiserver): what the operator relies on."""

from __future__ import annotations

import pytest

from rlt_operator.config.kinds import RUN
from rlt_sandbox.kmock_selectors import labels_match, parse_label_selector

CMS = "/api/v1/namespaces/default/configmaps"
RUNS = RUN.collection_path("default")


@pytest.mark.parametrize(
    "selector, labels, match",
    [
        ("a=1", {"a": "1"}, True),
        ("a==1,b", {"a": "1", "b": "x"}, True),
        ("a!=1", {"a": "1"}, False),
        ("!a", {}, True),
        ("a", {}, False),
    ],
)
def test_label_selectors(selector, labels, match):
    assert labels_match(labels, parse_label_selector(selector)) is match


def test_set_based_selectors_are_refused_not_ignored():
    with pytest.raises(ValueError, match="set-based"):
        parse_label_selector("env in (a,b)")


async def test_metadata_versions_status_isolation_and_errors(harness):
    created = await harness.call("POST", CMS, {"metadata": {"name": "x", "labels": {"k": "v"}}, "data": {"a": "1"}})
    meta = created["metadata"]
    assert meta["namespace"] == "default" and meta["uid"] and meta["generation"] == 1
    rv = int(meta["resourceVersion"])

    patched = await harness.call("PATCH", f"{CMS}/x", {"data": {"a": "2"}}, "application/merge-patch+json")
    assert int(patched["metadata"]["resourceVersion"]) > rv

    replaced = await harness.call("PUT", f"{CMS}/x", {"metadata": {"name": "x"}, "data": {"b": "3"}})
    assert replaced["data"] == {"b": "3"}

    with pytest.raises(AssertionError, match="409.*AlreadyExists"):
        await harness.call("POST", CMS, {"metadata": {"name": "x"}})
    with pytest.raises(AssertionError, match="404.*NotFound"):
        await harness.call("PATCH", f"{CMS}/nope", {"data": {}}, "application/merge-patch+json")
    with pytest.raises(AssertionError, match="422"):
        await harness.call(
            "PATCH",
            f"{CMS}/x",
            [
                {"op": "test", "path": "/metadata/resourceVersion", "value": "0"},
                {"op": "add", "path": "/data/c", "value": "4"},
            ],
            "application/json-patch+json",
        )

    run = await harness.call(
        "POST",
        RUNS,
        {"apiVersion": "rlt.dev/v1alpha1", "kind": "RLTRun", "metadata": {"name": "r"}, "spec": {"seed": 1}},
    )
    assert run["metadata"]["generation"] == 1
    after = await harness.call(
        "PATCH",
        f"{RUNS}/r/status",
        {"status": {"phase": "Running"}, "spec": {"seed": 2}},
        "application/merge-patch+json",
    )
    assert after["status"] == {"phase": "Running"} and after["spec"] == {"seed": 1}, "status writes only status"
    after = await harness.call("PATCH", f"{RUNS}/r", {"spec": {"seed": 3}}, "application/merge-patch+json")
    assert after["metadata"]["generation"] == 2

    listed = await harness.call("GET", f"{CMS}?labelSelector=k%3Dv")
    assert listed["kind"] == "ConfigMapList" and listed["items"] == []  # the PUT dropped the label


def test_kmock_internals_are_patched_only_by_an_explicit_call():
    """Importing the glue changes nothing of kmock's; `patch_kmock()` (called by `serve`) installs the fixes."""
    import subprocess
    import sys

    code = (
        "from kmock._internal import parsing\n"
        "from rlt_sandbox import kmock_glue, kmock_patches\n"
        "print(kmock_patches.kmock_patched())\n"
        "try:\n    parsing.parse_path('/api/v1/namespaces')\nexcept ValueError:\n    print('kmock bug')\n"
        "kmock_patches.patch_kmock(); kmock_patches.patch_kmock()\n"
        "print(kmock_patches.kmock_patched(), parsing.parse_path('/api/v1/namespaces').plural)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split("\n")[:3] == ["False", "kmock bug", "True namespaces"]


async def test_a_strategic_merge_patch_merges_built_in_kinds_and_is_refused_for_custom_ones(harness):
    """helm upgrade sends strategic-merge patches for built-in kinds: a Pod's containers merge by name (a merge patch
    would replace the list). Custom resources refuse them with the API server's 415, changing nothing."""
    smp = "application/strategic-merge-patch+json"
    pods = "/api/v1/namespaces/default/pods"
    spec = {"containers": [{"name": "a", "image": "i:1"}, {"name": "b", "image": "j:1"}]}
    await harness.call("POST", pods, {"metadata": {"name": "p"}, "spec": spec})
    patched = await harness.call("PATCH", f"{pods}/p", {"spec": {"containers": [{"name": "b", "image": "j:2"}]}}, smp)
    assert patched["spec"]["containers"] == [{"name": "a", "image": "i:1"}, {"name": "b", "image": "j:2"}]
    assert patched["metadata"]["generation"] == 2
    with pytest.raises(AssertionError, match="422.*merged by 'name'"):
        await harness.call("PATCH", f"{pods}/p", {"spec": {"containers": [{"image": "x"}]}}, smp)
    run = {"apiVersion": "rlt.dev/v1alpha1", "kind": "RLTRun", "metadata": {"name": "s"}, "spec": {"seed": 1}}
    await harness.call("POST", RUNS, run)
    with pytest.raises(AssertionError, match="415.*UnsupportedMediaType"):
        await harness.call("PATCH", f"{RUNS}/s", {"spec": {"seed": 9}}, smp)
    assert (await harness.call("GET", f"{RUNS}/s"))["spec"] == {"seed": 1}


async def test_kubectl_logs_tail_returns_the_last_lines(harness, tmp_path):
    log = tmp_path / "p.log"
    log.write_text("".join(f"line {i}\n" for i in range(10)))
    # (namespace, pod, container or None for the default one) -> the log file, as LocalKubelet.log_of
    harness.cluster.pod_log = lambda ns, name, container=None: log if (ns, name) == ("default", "p") else None
    path = "/api/v1/namespaces/default/pods/p/log"
    for query, want in (("?tailLines=3", "line 7\nline 8\nline 9\n"), ("?tailLines=0", ""), ("", log.read_text())):
        async with harness.session.get(harness.url + path + query) as resp:
            assert (resp.status, await resp.text()) == (200, want), query
