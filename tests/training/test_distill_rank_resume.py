"""In-process distillation with several ranks resumes to the rows the uninterrupted run writes, whatever rank or world
size explains a batch after the restart. The stage's rows fall into fixed batches of batchSize (each sampled from a
seed of its own); a restart deals the unfinished batches and redoes a batch a kill cut, writing only its missing
rows. Before, a restart split the missing rows anew over the ranks, so batches (and their samples) changed.

The ranks run one after another in this process (RANK and WORLD_SIZE set as torchrun sets them): the stage has no
collective, and rank 0, run last, merges the files once every row is there."""

from __future__ import annotations

import json

import pytest
from suite_helpers import tiny_doc

ROWS = 7  # batches of 2: [0, 1] [2, 3] [4, 5] [6]


class Killed(BaseException):
    """The kill of a rank, raised where its next batch would be written."""


def distill_run(tmp_path):
    from rlt.spec.loading import parse_run

    doc = tiny_doc()
    doc["spec"]["stages"]["sft"] = {"enabled": False}
    doc["spec"]["stages"]["rl"]["enabled"] = False
    doc["spec"]["stages"]["distill"].update(batchSize=2, samplesPerQuestion=2, temperature=1.0, maxNewTokens=8)
    doc["spec"]["stages"]["distill"]["limit"] = ROWS
    return parse_run(doc)


def explain(
    tmp_path, monkeypatch, world: int, ranks: list[int], stop_after: dict[int, int] | None = None, same_moment=True
) -> list:
    """Run `ranks` of a `world`-rank distill in turn; rank r stops (as if killed) after `stop_after[r]` batches.
    `same_moment`: every rank reads the part files as they were at the start (else each reads them when it starts,
    after the ranks before it wrote)."""
    from rlt.contract.layout import RunLayout
    from rlt.stages import distill
    from rlt.stages.context import StageContext
    from rlt.stages.distill_parts import parts_folder, read_done

    run = distill_run(tmp_path)
    monkeypatch.setenv("WORLD_SIZE", str(world))
    append, wait = distill.append_rows, distill.wait_for_all

    def at_once(folder, total):  # rank 0 runs last: every row is written by then, or the merge would wait forever
        missing = sorted(set(range(total)) - set(read_done(folder)))
        assert not missing, f"rows no rank wrote: {missing}"
        return wait(folder, total)

    monkeypatch.setattr(distill, "wait_for_all", at_once)
    # the ranks of one start read the part files at the same moment: each sees what was written before the start
    layout = RunLayout.for_run(tmp_path, run.name)
    snapshot = read_done(parts_folder(layout.stage_dir("distill"), run.spec))
    if same_moment:
        monkeypatch.setattr(distill, "read_done", lambda folder, before=None: dict(snapshot))
    for rank in ranks:
        monkeypatch.setenv("RANK", str(rank))
        calls = {"n": 0}

        def counted(path, pairs, rank=rank, calls=calls):
            if stop_after and calls["n"] >= stop_after.get(rank, 10**9):
                raise Killed  # this batch is never written
            calls["n"] += 1
            append(path, pairs)

        monkeypatch.setattr(distill, "append_rows", counted)
        try:
            distill.run_distill(StageContext(run, layout, show_progress=False))
        except Killed:
            continue
    monkeypatch.setattr(distill, "append_rows", append)
    monkeypatch.setattr(distill, "wait_for_all", wait)
    monkeypatch.setattr(distill, "read_done", read_done)
    out = layout.distill_dataset
    return [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []


@pytest.mark.slow
def test_a_restart_at_another_world_size_writes_the_uninterrupted_runs_rows(tmp_path, monkeypatch, tiny):
    from rlt.contract.layout import RunLayout
    from rlt.stages.distill_parts import parts_folder

    reference = explain(tmp_path / "one", monkeypatch, world=1, ranks=[0])
    assert len(reference) == ROWS

    # two ranks: rank 1 writes one batch ([2, 3]) and is killed; rank 0 is killed before it writes anything
    resumed = tmp_path / "resumed"
    assert explain(resumed, monkeypatch, world=2, ranks=[1, 0], stop_after={1: 1, 0: 0}) == []
    run = distill_run(resumed)
    folder = parts_folder(RunLayout.for_run(resumed, run.name).stage_dir("distill"), run.spec)
    # a kill inside a batch's write: of batch [4, 5] only row 4 reached the disk
    (folder / "rank-0.jsonl").write_text(json.dumps({"index": 4, "row": reference[4]}) + "\n")
    # the restart runs three ranks: the batches left ([0, 1] [4, 5] [6]) go one to each
    rows = explain(resumed, monkeypatch, world=3, ranks=[2, 1, 0])
    assert [r["source_row"] for r in rows] == list(range(ROWS))
    assert rows == reference  # the same explanations, rewards and choices as the run that was never stopped
    written = [json.loads(x)["index"] for f in sorted(folder.glob("rank-*.jsonl")) for x in f.read_text().splitlines()]
    assert sorted(written) == list(range(ROWS)), "every row written exactly once"


@pytest.mark.slow
def test_a_rank_that_starts_after_its_peer_wrote_deals_as_its_peer_did(tmp_path, monkeypatch, tiny):
    """The ranks of one launch (torchrun's run id) each read the part files when they start: rank 1 has written its
    batches ([2, 3] [6]) before rank 0 reads them. Rank 0 must still take [0, 1] and [4, 5], as dealt at the start:
    dealing anew from what it sees would give it only [0, 1], leave [4, 5] to no rank, and the merge would wait."""
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "launch-1")
    reference = explain(tmp_path / "one", monkeypatch, world=1, ranks=[0])
    rows = explain(tmp_path / "late", monkeypatch, world=2, ranks=[1, 0], same_moment=False)
    assert rows == reference
