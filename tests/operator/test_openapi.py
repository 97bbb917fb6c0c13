"""The OpenAPI documents the sandbox serves, generated from the CRD: what kubectl and helm look for in them."""

from rlt_operator import crd as crd_mod
from rlt_sandbox.openapi import Served, v2_document, v3_discovery, v3_group_version


def rltrun() -> Served:
    crd = crd_mod.crd()
    version = crd["spec"]["versions"][0]
    return Served("rlt.dev", version["name"], "rltruns", "RLTRun", True, version["schema"]["openAPIV3Schema"])


def test_v3_document_has_the_crd_schema_and_the_patch_parameter_kubectl_checks():
    configmaps = Served("", "v1", "configmaps", "ConfigMap", True)
    doc = v3_group_version([rltrun()])
    schema = doc["components"]["schemas"]["dev.rlt.v1alpha1.RLTRun"]
    assert schema["x-kubernetes-group-version-kind"] == [{"group": "rlt.dev", "version": "v1alpha1", "kind": "RLTRun"}]
    rl = schema["properties"]["spec"]["properties"]["stages"]["properties"]["rl"]
    assert rl["properties"]["numGenerations"]["description"] == "G: completions per question."
    patch = doc["paths"]["/apis/rlt.dev/v1alpha1/namespaces/{namespace}/rltruns/{name}"]["patch"]
    assert patch["x-kubernetes-group-version-kind"]["kind"] == "RLTRun"
    assert {"name": "fieldValidation", "in": "query"}.items() <= patch["parameters"][0].items()
    core = v3_group_version([configmaps])
    assert "/api/v1/namespaces/{namespace}/configmaps/{name}" in core["paths"]
    discovery = v3_discovery([rltrun(), configmaps])["paths"]
    assert set(discovery) == {"apis/rlt.dev/v1alpha1", "api/v1"}
    assert discovery["apis/rlt.dev/v1alpha1"]["serverRelativeURL"].startswith("/openapi/v3/apis/rlt.dev/v1alpha1?hash=")


def test_v2_document_carries_the_same_schema():
    doc = v2_document([rltrun()])
    assert doc["swagger"] == "2.0"
    spec = doc["definitions"]["dev.rlt.v1alpha1.RLTRun"]["properties"]["spec"]
    assert "teacher" in spec["properties"]
    assert {"apiVersion", "kind", "metadata", "spec", "status"} <= doc["definitions"]["dev.rlt.v1alpha1.RLTRun"][
        "properties"
    ].keys()
