"""Pure builders: spec → child manifests (no Kopf, no API)."""

from __future__ import annotations

import json

import pytest
import yaml
from op_harness import EXAMPLES

from rlt.spec import load_run, parse_run
from rlt_operator import builders as b

REF = b.RunRef(name="r1", namespace="team", uid="uid-1")


def spec_from(name="rltrun-paper-7b.yaml", **spec_patch):
    doc = yaml.safe_load((EXAMPLES / name).read_text())
    doc["spec"].update(spec_patch)
    return parse_run(doc).spec


def env_of(pod_spec):
    return {e["name"]: e for e in pod_spec["containers"][0]["env"]}


def test_configmap_holds_the_run_with_the_generator_url():
    spec = spec_from()
    cm = b.configmap(REF, spec)
    assert cm["metadata"]["name"] == "r1-config"
    text = cm["data"]["run.yaml"]
    run = parse_run(yaml.safe_load(text))
    assert run.spec.stages.rl.generation.server_url == "http://r1-generator.team.svc:8000"
    assert run.metadata.name == "r1" and run.metadata.namespace == "team"
    assert cm["metadata"]["annotations"][b.A_CONFIG_HASH] == b.config_hash(text)
    assert spec.stages.rl.generation.server_url is None, "the builder must not mutate the spec"


def test_owner_and_labels_on_every_child():
    spec = spec_from()
    children = [b.configmap(REF, spec), b.pvc(REF, spec), b.trainer_job(REF, spec, "rl", 2),
                b.trainer_service(REF, spec, "rl", 2), b.generator_statefulset(REF, spec, "rl", 2),
                b.generator_service(REF, spec, "rl", 2)]
    for child in children:
        meta = child["metadata"]
        assert meta["namespace"] == "team" and meta["labels"][b.L_RUN] == "r1"
        assert meta["ownerReferences"] == [{"apiVersion": "rlt.dev/v1alpha1", "kind": "RLTRun", "name": "r1",
                                            "uid": "uid-1", "controller": True, "blockOwnerDeletion": True}]
    job = children[2]
    assert job["metadata"]["labels"][b.L_RESTART] == "2"
    assert job["spec"]["template"]["metadata"]["labels"][b.L_STAGE] == "rl"


def test_trainer_job_rendezvous_and_command():
    spec = spec_from(resources={"trainer": {"nodes": 4, "gpus": 8}})
    job = b.trainer_job(REF, spec, "rl", 0)
    js = job["spec"]
    assert (js["completionMode"], js["completions"], js["parallelism"], js["backoffLimit"]) == ("Indexed", 4, 4, 0)
    pod = js["template"]["spec"]
    assert pod["subdomain"] == "r1-rl" and pod["restartPolicy"] == "Never"
    env = env_of(pod)
    assert env["MASTER_ADDR"]["value"] == "r1-rl-0.r1-rl.team.svc"
    assert env["WORLD_SIZE"]["value"] == "32" and env["NNODES"]["value"] == "4"
    assert env["NODE_RANK"]["valueFrom"]["fieldRef"]["fieldPath"] == \
        "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "hf-token", "key": "token"}
    assert "value" not in env["HF_TOKEN"], "the token never appears in a manifest"
    cmd = pod["containers"][0]["command"]
    assert cmd[:2] == ["accelerate", "launch"]
    assert cmd[cmd.index("--num_machines") + 1] == "4" and cmd[cmd.index("--machine_rank") + 1] == "$(NODE_RANK)"
    assert cmd[-8:] == ["-m", "rlt.cli", "stage", "rl", "--config", "/etc/rlt/run.yaml", "--root", "/data"]
    assert pod["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "8"}
    svc = b.trainer_service(REF, spec, "rl", 0)
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True


def test_single_process_stage_runs_rlt_directly():
    spec = spec_from("rltrun-tiny.yaml", resources={"trainer": {"nodes": 1, "gpus": 1}})
    assert b.trainer_command(spec, "sft") == ["rlt", "stage", "sft", "--config", "/etc/rlt/run.yaml", "--root", "/data"]
    assert b.trainer_nodes(spec_from(resources={"trainer": {"nodes": 3}}), "distill") == 1


def test_generator_statefulset_runs_vllm_for_trl():
    spec = spec_from(resources={"generator": {"replicas": 1, "gpus": 4, "tensorParallelSize": 2,
                                              "dataParallelSize": 2}})
    sts = b.generator_statefulset(REF, spec, "rl", 0)
    pod = sts["spec"]["template"]["spec"]
    c = pod["containers"][0]
    cmd = c["command"]
    assert cmd[:3] == ["python", "-m", "vllm.entrypoints.openai.api_server"]
    assert cmd[cmd.index("--model") + 1] == "/data/r1/sft/model"  # sft ran before rl
    assert cmd[cmd.index("--tensor-parallel-size") + 1] == "2"
    assert cmd[cmd.index("--data-parallel-size") + 1] == "2"
    assert json.loads(cmd[cmd.index("--weight-transfer-config") + 1]) == {"backend": "nccl"}
    assert cmd[cmd.index("--logprobs-mode") + 1] == "processed_logprobs"
    assert cmd[cmd.index("--max-logprobs") + 1] == "-1"
    assert env_of(pod)["VLLM_SERVER_DEV_MODE"]["value"] == "1"
    assert c["startupProbe"]["httpGet"] == {"path": "/health", "port": 8000}
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}} in pod["volumes"]
    assert sts["spec"]["replicas"] == 1 and sts["spec"]["serviceName"] == "r1-generator"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert c["securityContext"]["allowPrivilegeEscalation"] is False


def test_scheduling_passthrough_and_queue_label_only_from_spec():
    spec = spec_from(scheduling={
        "nodeSelector": {"gpu": "h100"}, "tolerations": [{"key": "gpu", "operator": "Exists"}],
        "affinity": {"nodeAffinity": {"x": 1}}, "priorityClassName": "high", "queueName": "team-q",
        "serviceAccountName": "trainer", "imagePullSecrets": ["regcred"]},
        env=[{"name": "EXTRA", "value": "1"}])
    for obj in (b.trainer_job(REF, spec, "rl", 0), b.generator_statefulset(REF, spec, "rl", 0)):
        tmpl = obj["spec"]["template"]
        pod = tmpl["spec"]
        assert pod["nodeSelector"] == {"gpu": "h100"} and pod["priorityClassName"] == "high"
        assert pod["tolerations"] == [{"key": "gpu", "operator": "Exists"}]
        assert pod["affinity"] == {"nodeAffinity": {"x": 1}} and pod["serviceAccountName"] == "trainer"
        assert pod["imagePullSecrets"] == [{"name": "regcred"}]
        assert tmpl["metadata"]["labels"][b.KUEUE_QUEUE] == "team-q"
        assert obj["metadata"]["labels"][b.KUEUE_QUEUE] == "team-q"
        assert env_of(pod)["EXTRA"]["value"] == "1"
    plain = spec_from()
    assert b.KUEUE_QUEUE not in b.trainer_job(REF, plain, "rl", 0)["spec"]["template"]["metadata"]["labels"]


def test_pvc_and_existing_claim():
    spec = spec_from(storage={"size": "2Ti", "storageClassName": "fast", "accessMode": "ReadWriteMany"})
    pvc = b.pvc(REF, spec)
    assert pvc["spec"] == {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "2Ti"}},
                           "storageClassName": "fast"}
    mine = spec_from(storage={"existingClaim": "shared"})
    assert b.pvc(REF, mine) is None
    assert b.data_claim_name("r1", mine) == "shared"
    assert ("persistentvolumeclaims", "r1-data") not in b.all_children("r1", ["rl"], "shared")


def test_outputs_and_generator_model_follow_enabled_stages():
    spec = load_run(EXAMPLES / "rltrun-tiny.yaml").spec
    assert b.outputs("t", spec) == {"teacherCheckpoint": "/data/t/rl/model",
                                    "distilledDataset": "/data/t/distill/dataset.jsonl"}
    spec.stages.sft.enabled = False
    assert b.generator_model("t", spec, "rl") == "builtin:tiny-qwen2"
    assert b.generator_model("t", spec, "distill") == "/data/t/rl/model"


def test_optional_student_and_evaluate_stages():
    spec = spec_from(resources={"trainer": {"nodes": 2}},
                     stages={"student": {"enabled": True}, "evaluate": {"enabled": True}})
    assert spec.stages.enabled()[-2:] == ["student", "evaluate"]
    assert b.trainer_nodes(spec, "student") == 2 and b.trainer_nodes(spec, "evaluate") == 1
    assert b.outputs("r1", spec)["studentCheckpoint"] == "/data/r1/student/model"
    job = b.trainer_job(REF, spec, "evaluate", 0)
    assert job["metadata"]["name"] == "r1-evaluate" and job["spec"]["completions"] == 1
    assert ("jobs", "r1-evaluate") in b.all_children("r1", spec.stages.enabled(), None)


def test_rl_in_server_mode_refuses_several_generator_replicas():
    """TRL keeps ONE vLLM server in sync: a second replica behind the Service would generate from stale weights."""
    from rlt.spec import SpecError

    with pytest.raises(SpecError, match=r"resources.generator.replicas: 2 .*dataParallelSize"):
        spec_from(resources={"generator": {"replicas": 2, "gpus": 1}})
    # distill alone serves a fixed teacher: several replicas are fine there.
    spec_from("rltrun-tiny.yaml", stages={"rl": {"enabled": False, "generation": {"mode": "server"}}},
              resources={"generator": {"replicas": 2}})


def test_multinode_deepspeed_launch_uses_torchrun_on_every_pod():
    """accelerate's default multi-node launcher (pdsh) would turn each pod into its own one-node world."""
    spec = spec_from("rltrun-multinode.yaml")
    cmd = b.trainer_command(spec, "rl")
    assert cmd[cmd.index("--deepspeed_multinode_launcher") + 1] == "standard"
    assert cmd[cmd.index("--num_machines") + 1] == "4" and cmd[cmd.index("--num_processes") + 1] == "32"
    assert cmd[cmd.index("--machine_rank") + 1] == "$(NODE_RANK)"
    # distill/evaluate: one process per GPU of the one pod, each with its own rows (no DeepSpeed engine).
    assert b.trainer_command(spec, "distill")[:5] == ["torchrun", "--standalone", "--nproc_per_node", "8", "-m"]
