"""The strategic-merge directives the sandbox applies for helm and kubectl (rlt_sandbox.strategic_merge), each on a
tiny object; the end-to-end proof with real helm/kubectl is tests/operator/test_sandbox_upgrade.py."""

from __future__ import annotations

import pytest

from rlt_sandbox.strategic_merge import PatchError, apply

POD = {
    "metadata": {"name": "p", "finalizers": ["a"], "labels": {"x": "1", "y": "2"}},
    "spec": {
        "containers": [{"name": "c", "image": "i", "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]}],
        "volumes": [{"name": "v", "emptyDir": {}}],
        "tolerations": [{"key": "k1"}, {"key": "k2"}],
    },
}


def pod(patch):
    return apply(POD, patch, "", "Pod")


def test_lists_with_merge_keys_merge_and_others_are_replaced():
    out = pod({"spec": {"containers": [{"name": "c", "env": [{"name": "B", "value": "3"}]}], "tolerations": []}})
    assert out["spec"]["containers"][0]["env"] == [{"name": "A", "value": "1"}, {"name": "B", "value": "3"}]
    assert out["spec"]["containers"][0]["image"] == "i" and out["spec"]["tolerations"] == []
    assert POD["spec"]["containers"][0]["env"][1]["value"] == "2"  # the stored object is not changed


def test_delete_replace_and_null():
    env = [{"$patch": "delete", "name": "A"}]
    out = pod({"metadata": {"labels": {"x": None}}, "spec": {"containers": [{"name": "c", "env": env}]}})
    assert out["spec"]["containers"][0]["env"] == [{"name": "B", "value": "2"}]
    assert out["metadata"]["labels"] == {"y": "2"}
    out = pod({"spec": {"containers": [{"$patch": "replace"}, {"name": "d", "image": "j"}]}})
    assert out["spec"]["containers"] == [{"name": "d", "image": "j"}]
    assert pod({"metadata": {"labels": {"$patch": "replace", "z": "3"}}})["metadata"]["labels"] == {"z": "3"}


def test_finalizers_union_delete_from_primitive_list_retain_keys_and_order():
    assert pod({"metadata": {"finalizers": ["b", "a"]}})["metadata"]["finalizers"] == ["a", "b"]
    assert pod({"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]}})["metadata"]["finalizers"] == []
    volume = {"name": "v", "configMap": {"name": "cm"}, "$retainKeys": ["configMap", "name"]}
    assert pod({"spec": {"volumes": [volume]}})["spec"]["volumes"] == [{"name": "v", "configMap": {"name": "cm"}}]
    env = [{"name": "C", "value": "3"}]
    patch = {"$setElementOrder/env": [{"name": "C"}, {"name": "A"}, {"name": "B"}], "env": env, "name": "c"}
    out = pod({"spec": {"containers": [patch]}})
    assert [e["name"] for e in out["spec"]["containers"][0]["env"]] == ["C", "A", "B"]


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"spec": {"containers": [{"image": "x"}]}}, r"/spec/containers\[0\]: .* merged by 'name'"),
        ({"spec": {"$patch": "explode"}}, r"/spec: unknown \"\$patch\" directive 'explode'"),
        ({"$patch": "delete"}, "use DELETE"),
        ([], "must be a JSON object"),
    ],
)
def test_malformed_patches_name_the_field(patch, message):
    with pytest.raises(PatchError, match=message):
        pod(patch)
