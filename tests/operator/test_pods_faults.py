"""Faults on real processes: the trainer pod killed while it writes a checkpoint (the partial checkpoint must never be
resumed), and the operator restarted mid-run (no duplicate or re-created children; the run still finishes)."""

from __future__ import annotations

import re
import threading
import time

import pytest
from op_harness import example
from pods_harness import pod_logs, running_pods, wait_for

from rlt.contract.layout import RunLayout, checkpoints, is_complete
from rlt_operator.builders import own_claim_name
from rlt_sandbox.kubelet_processes import kill_all

pytestmark = pytest.mark.slow

RUN = "faults"


def single_process_rl() -> dict:
    doc = example("rltrun-tiny.yaml")
    doc["metadata"]["name"] = RUN
    st = doc["spec"]["stages"]
    st["sft"]["enabled"] = False
    st["distill"]["enabled"] = False
    st["rl"].update(steps=10, saveSteps=1, saveTotalLimit=20)
    doc["spec"]["backoffLimit"] = 4
    return doc


class SaveKiller(threading.Thread):
    """Watches the checkpoints folder and kills the trainer pod the moment a checkpoint exists without its marker."""

    def __init__(self, kubelet, ckpts):
        super().__init__(daemon=True)
        self.kubelet, self.ckpts = kubelet, ckpts
        self.killed: str | None = None
        self.victims: list[str] = []
        self.stop = False

    def run(self) -> None:
        while not self.stop and self.killed is None:
            if self.ckpts.is_dir():
                for step, path in checkpoints(self.ckpts):
                    # from the second save on, so that a complete checkpoint exists to resume from
                    if step != 1 and not is_complete(path):
                        pods = [
                            p
                            for (_, n), p in list(self.kubelet.pods.items())
                            if n.startswith(f"{RUN}-rl-") and p.phase == "Running"
                        ]
                        for pod in pods:
                            kill_all(pod.tag)
                        if pods:
                            self.victims = [p.name for p in pods]
                            self.killed = path.name
                        break
            time.sleep(0.002)


async def test_kill_during_checkpoint_save_and_operator_restart(harness, tmp_path):
    await harness.start_operator()
    async with running_pods(harness, tmp_path) as kubelet:
        ckpts = RunLayout.for_run(kubelet.claim_dir(own_claim_name(RUN)), RUN).checkpoints_dir("rl")
        await harness.create_run(single_process_rl())

        # Kill during a save; a save that won the race against the kill is no test: try the next one.
        partial, old_pods = None, set()
        for attempt in range(1, 4):
            killer = SaveKiller(kubelet, ckpts)
            killer.start()
            await wait_for(lambda k=killer: k.killed, "a checkpoint being written", 600, kubelet)
            killer.stop = True
            await harness.wait_status(RUN, lambda s, a=attempt: s.get("restarts") == a, "a gang restart", 120)
            old_pods |= set(killer.victims)
            if not is_complete(ckpts / killer.killed):
                partial = killer.killed
                break
        assert partial, "three saves finished before the kill landed"
        step = int(partial.split("-")[1])

        # The restarted trainer sets the partial checkpoint aside and resumes from the one before it.
        async def resumed():
            new = {n: t for n, t in pod_logs(kubelet, f"{RUN}-rl-").items() if n not in old_pods}
            return next((t for t in new.values() if "rlt-shard stage=rl" in t), None)

        new_log = await wait_for(resumed, "the restarted trainer's first step", 300, kubelet)
        assert re.search(rf"checkpoint-{step} is incomplete .*set aside", new_log), new_log[-3000:]
        first = int(re.search(r"rlt-shard stage=rl rank=0 step=(\d+)", new_log).group(1))
        assert first == step - 1, f"resumed at step {first}, expected the last complete checkpoint-{step - 1}"
        assert any(p.name.startswith(f"{partial}.") for p in (ckpts / "set-aside").iterdir())
        print(
            f"\nkilled during the save of {partial}: resumed from checkpoint-{step - 1}, "
            f"steps lost: {step - first} (save interval 1; the step whose save was cut short)"
        )

        # Operator restart while the trainer runs: it must adopt the Job and pod it finds, not re-create them.
        job_before = await harness.get("jobs", f"{RUN}-rl")
        pods_before = sorted(p["metadata"]["name"] for p in await harness.list("pods", f"rlt.dev/run={RUN}"))
        restarts = (await harness.run_status(RUN))["restarts"]
        await harness.stop_operator()
        await harness.start_operator()
        final = await harness.wait_status(
            RUN, lambda s: s.get("phase") in ("Succeeded", "Failed"), "the run to finish", timeout=600
        )
        assert final["phase"] == "Succeeded" and final["restarts"] == restarts, final
        job_after = await harness.get("jobs", f"{RUN}-rl")
        assert job_after["metadata"]["uid"] == job_before["metadata"]["uid"], "the Job was re-created"
        pods_after = sorted(p["metadata"]["name"] for p in await harness.list("pods", f"rlt.dev/run={RUN}"))
        assert pods_after == pods_before, "pods were added or replaced after the operator restart"
        assert len(await harness.list("jobs", f"rlt.dev/run={RUN}")) == 1
