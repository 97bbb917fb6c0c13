"""Staged saves on a cluster (issue 51): the operator gives each trainer pod a local volume for its checkpoints and
points RLT_LOCAL_CHECKPOINTS at it (rlt.stages.staged_saves then writes there first and copies to the run's volume
behind the training loop), sized by the plan without torch: the first pod's share of one checkpoint, with a margin;
a StorageClass of node-local volumes instead of an emptyDir; off on request, and the plan's saves follow."""

from __future__ import annotations

import yaml
from op_harness import EXAMPLES

from rlt.checks.model_shape import checkpoint_bytes, known_shape, pod_checkpoint_bytes
from rlt.checks.step_time import LOCAL_MARGIN, local_checkpoint_size, trainer_step_times
from rlt.contract.env import LOCAL_CHECKPOINTS
from rlt.spec.loading import parse_run
from rlt_operator import builders as b

REF = b.RunRef(name="r1", namespace="team", uid="uid-1")
GIB = 2**30


def paper(**trainer):
    doc = yaml.safe_load((EXAMPLES / "rltrun-paper-7b.yaml").read_text())
    doc["spec"]["resources"]["trainer"].update(trainer)
    return parse_run(doc).spec


def trainer_pod(spec, stage="rl"):
    return b.trainer_job(REF, spec, stage, 0)["spec"]["template"]["spec"]


def local_parts(pod):
    """(RLT_LOCAL_CHECKPOINTS's value, the volume it is on, the trainer container's requests)."""
    trainer = pod["containers"][0]
    env = {e["name"]: e.get("value") for e in trainer["env"]}
    mounts = {m["mountPath"]: m["name"] for m in trainer["volumeMounts"]}
    path = env.get(LOCAL_CHECKPOINTS.name)
    volumes = {v["name"]: v for v in pod["volumes"]}
    return path, volumes.get(mounts.get(path, "")), trainer["resources"]["requests"]


def test_trainer_pods_stage_saves_on_an_emptydir_sized_by_the_plan():
    spec = paper()
    path, volume, requests = local_parts(trainer_pod(spec))
    assert path == b.LOCAL_CHECKPOINTS_MOUNT
    # one 7B checkpoint of rl with its optimizer on one pod: bf16 weights + fp32 master and Adam moments (14 bytes a
    # parameter) + the synced GRPO reference in bf16 (rlt.stages.reference, after the first refSync)
    shape = known_shape("Qwen/Qwen2.5-7B-Instruct")
    whole = checkpoint_bytes(shape, shape.params, 3, 4, 2) + shape.params * 2
    size = -(-int(whole * LOCAL_MARGIN) // GIB)
    assert volume == {"name": "local-checkpoints", "emptyDir": {"sizeLimit": f"{size}Gi"}}
    assert requests["ephemeral-storage"] == f"{size}Gi"  # placed where the node's disk holds it
    assert 100 * GIB < whole < size * GIB
    # the generators stage nothing
    gen = b.generator_statefulset(REF, spec, "rl", 0)["spec"]["template"]["spec"]
    assert LOCAL_CHECKPOINTS.name not in {e["name"] for e in gen["containers"][0]["env"]}


def test_several_pods_each_hold_their_share():
    """Two pods of 4 GPUs: each writes its ranks' optimizer shards, the first also the whole model and, in rl with
    refSync on, the synced reference (rank 0 writes it); with refSync off, no reference."""
    spec = paper(nodes=2)
    shape = known_shape("Qwen/Qwen2.5-7B-Instruct")
    share = pod_checkpoint_bytes(shape, shape.params, 3, 8, 2, 2)
    assert share == shape.params * 2 + shape.params * 12 // 2
    reference = shape.params * 2
    assert local_checkpoint_size(spec)[0] == -(-int((share + reference) * LOCAL_MARGIN) // GIB) * GIB
    by_stage = {t.stage: t.local_bytes for t in trainer_step_times(spec, _shapes())}
    assert by_stage["rl"] == share + reference and by_stage["sft"] == share
    spec.stages.rl.ref_sync.enabled = False
    assert {t.stage: t.local_bytes for t in trainer_step_times(spec, _shapes())}["rl"] == share


def _shapes():
    from rlt.checks.model_shape import Shapes

    s = known_shape("Qwen/Qwen2.5-7B-Instruct")
    return Shapes(s, s, s)


def test_a_storage_class_gives_a_generic_ephemeral_volume_and_the_size_is_the_specs_when_set():
    spec = paper(localCheckpoints={"storageClassName": "local-nvme", "size": "300Gi"})
    path, volume, requests = local_parts(trainer_pod(spec))
    assert path == b.LOCAL_CHECKPOINTS_MOUNT
    claim = volume["ephemeral"]["volumeClaimTemplate"]["spec"]
    assert claim == {
        "accessModes": ["ReadWriteOnce"],
        "storageClassName": "local-nvme",
        "resources": {"requests": {"storage": "300Gi"}},
    }
    assert "ephemeral-storage" not in requests  # the claim's capacity is not the node's ephemeral storage


def test_turned_off_no_volume_no_env_and_the_plan_charges_the_whole_save():
    from rlt.checks.capacity import plan_for_run

    spec = paper(localCheckpoints={"enabled": False})
    path, volume, requests = local_parts(trainer_pod(spec))
    assert (path, volume) == (None, None) and "ephemeral-storage" not in requests
    on, off = (trainer_step_times(s, _shapes()) for s in (paper(), spec))
    for staged, direct in zip(on, off, strict=True):
        # the whole write to the volume blocks (not the ranks' exit a stop's save adds)
        assert staged.save_blocked(True) < direct.save_blocked(True) == direct.durable_copy < direct.save
    assert any("local checkpoints off" in line for line in plan_for_run(spec).stopping)


def test_an_unknown_model_gets_an_unbounded_emptydir_and_a_storage_class_then_needs_a_size():
    from rlt.checks.validation import spec_problems

    doc = yaml.safe_load((EXAMPLES / "rltrun-paper-7b.yaml").read_text())
    doc["spec"]["teacher"]["model"] = "someone/unpublished-7b"
    _, volume, requests = local_parts(trainer_pod(parse_run(doc).spec))
    assert volume == {"name": "local-checkpoints", "emptyDir": {}} and "ephemeral-storage" not in requests
    doc["spec"]["resources"]["trainer"]["localCheckpoints"] = {"storageClassName": "local-nvme"}
    problems = spec_problems(parse_run(doc).spec, local_files=False)
    assert any(p.startswith("spec.resources.trainer.localCheckpoints.size: required") for p in problems), problems
