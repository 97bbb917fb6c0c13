"""A rendered `nodes: 2`, 2 GPUs per node run, executed: the operator's Indexed Job pods start as real processes
(accelerate launch → torchrun → 2 DeepSpeed ranks each, gloo standing for NCCL) and must form ONE world of 4 for sft
and rl; a rank killed mid-step stops its gang in seconds (not after the pods' grace period: the survivors cannot
save without it) and restarts it from the last complete checkpoint; distill splits rows by rank."""

from __future__ import annotations

import json
import os
import re
import signal
import time

import pytest
from op_harness import example
from pods_harness import log_tails, metrics_rows, pod_logs, running_pods, wait_for, world_lines

from rlt.contract.layout import CHECKPOINT_COMPLETE, RunLayout
from rlt_operator.builders import own_claim_name
from rlt_sandbox.kubelet_processes import rank_processes, tagged_processes

pytestmark = pytest.mark.slow

RUN = "world"
SAVE_STEPS = 2
RL_STEPS = 4  # killed after checkpoint-2: the restarted gang trains steps 3 and 4


def multinode_run() -> dict:
    doc = example("rltrun-tiny.yaml")
    doc["metadata"]["name"] = RUN
    st = doc["spec"]["stages"]
    st["rl"].update(batchSize=16, perDeviceBatchSize=4, numGenerations=4, steps=RL_STEPS, saveSteps=SAVE_STEPS)
    st["sft"].update(perDeviceBatchSize=1)  # sft's batch of 4 over the 4 processes
    st["distill"].update(limit=5, batchSize=2)  # batches [0, 1] [2, 3] [4], dealt to the ranks: the shares differ
    doc["spec"]["resources"] = {"trainer": {"nodes": 2, "gpus": 2}}
    doc["spec"]["storage"] = {"accessMode": "ReadWriteMany"}  # pods on several nodes share the claim
    doc["spec"]["backoffLimit"] = 2
    return doc


async def test_two_nodes_of_two_ranks_train_as_one_world_and_resume_after_a_killed_rank(harness, tmp_path, monkeypatch):
    monkeypatch.setenv("RLT_PROGRESS_URL", "http://127.0.0.1:{port}/metrics")
    await harness.start_operator()
    # The pods' own grace period (600 s: the tiny run's plan asks for less, so GRACE_FLOOR_SECONDS), uncapped.
    async with running_pods(harness, tmp_path, grace_seconds=None) as kubelet:
        claim = kubelet.claim_dir(own_claim_name(RUN))
        await harness.create_run(multinode_run())

        # rl is running and has a complete checkpoint: kill rank 3 (on the second pod) mid-step; the gang stops
        # within seconds, not after its grace period.
        ckpt = RunLayout.for_run(claim, RUN).checkpoint_dir("rl", SAVE_STEPS) / CHECKPOINT_COMPLETE

        async def checkpointed():
            st = await harness.run_status(RUN)
            assert st.get("phase") != "Failed", st  # fail fast, e.g. on a spec the operator refuses
            return ckpt.exists()

        await wait_for(checkpointed, "rl's first complete checkpoint", 600, kubelet)
        pod = kubelet.pod(f"{RUN}-rl-1-")
        ranks = rank_processes(pod)
        assert sorted(ranks) == [2, 3], f"pod index 1 should run ranks 2 and 3, found {ranks}"
        last_before = max(r["step"] for r in metrics_rows(claim, RUN) if r["stage"] == "rl")
        # The ranks of pod 0 are frozen first: they stand for survivors that do not notice the lost peer, as NCCL
        # ranks blocked in a collective until the process group's timeout (gloo over TCP notices the closed socket
        # at once, and these ranks would leave by themselves). SIGTERM cannot move them: only the operator's short
        # grace period for a gang that lost a trainer pod ends them before their own grace period does.
        survivor = kubelet.pod(f"{RUN}-rl-0-")
        for pid in rank_processes(survivor).values():
            os.kill(pid, signal.SIGSTOP)
        grace = float(pod.body["spec"]["terminationGracePeriodSeconds"])
        assert grace >= 600, "the pods' own grace period, uncapped: the old behaviour would wait all of it"
        killed = time.monotonic()
        os.kill(ranks[3], signal.SIGKILL)

        async def gang_stopped():
            return all(not tagged_processes(p.tag) for p in (survivor, pod))

        # Well within the grace period (a fifth of it), however loaded the machine: torchrun on the killed rank's
        # pod stops its other rank (<= 30 s), then the operator deletes the survivors with LOST_PEER_GRACE_SECONDS.
        await wait_for(
            gang_stopped, f"the gang that lost rank 3 to stop (grace period {grace:.0f} s)", grace / 5, kubelet
        )
        print(f"\nthe gang stopped {time.monotonic() - killed:.1f} s after rank 3 was killed (grace {grace:.0f} s)")

        st = await harness.wait_status(RUN, lambda s: s.get("restarts") == 1, "a gang restart", timeout=120)
        assert "rl" in st.get("lastFailure", "")
        final = await harness.wait_status(
            RUN, lambda s: s.get("phase") in ("Succeeded", "Failed"), "the run to finish", timeout=900
        )
        assert final["phase"] == "Succeeded", (final, pod_logs(kubelet, f"{RUN}-"))
        # Exactly one restart: a second one means the resumed gang failed too; its pods' logs say why.
        assert final["restarts"] == 1, (final.get("lastFailure"), log_tails(pod_logs(kubelet, f"{RUN}-rl-")))

        logs = pod_logs(kubelet, f"{RUN}-")
        # ONE world of 4 per training stage attempt: ranks 0..3, ranks 0-1 on node 0 and 2-3 on node 1.
        for stage in ("sft", "rl"):
            seen = [w for name, text in logs.items() if name.startswith(f"{RUN}-{stage}-") for w in world_lines(text)]
            assert seen and all(w["world"] == 4 and w["backend"] == "gloo" for w in seen), seen
            assert {(w["rank"], w["node"]) for w in seen} == {(0, 0), (1, 0), (2, 1), (3, 1)}, seen
        attempts = [w for text in logs.values() for w in world_lines(text) if w["stage"] == "rl"]
        assert len(attempts) == 8, "rl ran twice (before and after the kill), 4 ranks each"

        # Every rank drew its own prompts: in each step the 4 ranks' prompt groups are distinct.
        shards: dict[tuple[int, int], set[str]] = {}
        for text in logs.values():
            for rank, step, prompts in re.findall(r"rlt-shard stage=rl rank=(\d+) step=(\d+) prompts=(\S+)", text):
                shards.setdefault((int(step), int(rank)), set()).update(prompts.split(","))
        for step in {s for s, _ in shards}:
            groups = [frozenset(shards[(step, r)]) for r in range(4) if (step, r) in shards]
            assert len(groups) == 4 and len(set(groups)) == 4, (step, groups)

        # Resume: the restarted rl began at the last complete checkpoint; steps lost = done - resumed from.
        rl_log = "\n".join(t for n, t in logs.items() if n.startswith(f"{RUN}-rl-"))
        resumed_from = SAVE_STEPS
        assert rl_log.count("rlt-shard stage=rl rank=0 step=0 ") == 1, "the restart began at step 0 again"
        assert rl_log.count(f"rlt-shard stage=rl rank=0 step={resumed_from} ") == 2, "not resumed at the checkpoint"
        assert "incomplete" not in rl_log  # nothing partial was seen or set aside here
        steps = [r["step"] for r in metrics_rows(claim, RUN) if r["stage"] == "rl"]
        assert steps[-1] == RL_STEPS
        lost = last_before - resumed_from
        print(
            f"\nrl steps lost to the killed rank: {lost} completed (last logged {last_before}, resumed from "
            f"checkpoint-{resumed_from}, save interval {SAVE_STEPS}) + the interrupted step"
        )
        assert 0 <= lost <= SAVE_STEPS
        # One writer: each sft step is recorded once, not once per rank.
        sft_steps = [r["step"] for r in metrics_rows(claim, RUN) if r["stage"] == "sft"]
        assert sft_steps == sorted(set(sft_steps)) and sft_steps

        # distill: 2 processes on the pod's 2 GPUs; every row exactly once, in order, one file.
        dataset = claim / RUN / "distill" / "dataset.jsonl"
        rows = [json.loads(line) for line in dataset.read_text().splitlines()]
        assert [r["source_row"] for r in rows] == sorted(r["source_row"] for r in rows)
        assert len({r["source_row"] for r in rows}) == len(rows) == 5
        distill_log = "\n".join(t for n, t in logs.items() if n.startswith(f"{RUN}-distill-"))
        shares = dict(re.findall(r"rlt-shard stage=distill rank=(\d+) rows=(\S+)", distill_log))
        assert shares == {"0": "0,1,4", "1": "2,3"}, shares  # whole batches: each row's samples whatever the world
        assert not list((claim / RUN / "distill").glob("*rank*")), "no per-rank leftovers"
