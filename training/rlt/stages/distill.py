"""Stage `distill`: the trained teacher explains every question; the best of `samplesPerQuestion` candidates by
RLT reward becomes a student-format row: question, reasoning_trace, solution, reward (JSONL, written atomically).
Each row also keeps every candidate (text, reward, closed), best first.

Server mode fills every generator slot it planned for: one request per sequence, as many in flight as the
generators' KV caches hold (rlt.checks.capacity.distill_sequences_in_flight), the next sent the moment one finishes
(rlt.method.pipeline.as_completed), and a question is scored once its samples are all back, in the order the
questions complete. Requests of many sequences consumed in order left the slots of every short sequence empty until
the request's longest one and every earlier request had finished.

Resumable (rlt.stages.distill_parts): each rank appends its finished questions to its own file on the volume, each
row with its index, a restart does only the rows no rank has written, and rank 0 merges the files by index; the
ranks share no process group."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from rlt.contract import metrics as catalogue
from rlt.contract.env import RANK
from rlt.data.dataset import load_data
from rlt.data.jsonl import write_jsonl
from rlt.data.models import load_model, load_tokenizer
from rlt.method.generation import Samples, sample_with_logprobs, served_model, server_generate
from rlt.method.pipeline import as_completed
from rlt.spec.budgets import rollout_seconds
from rlt.spec.inputs import ModelRef
from rlt.spec.run import RLTRunSpec
from rlt.spec.stages import generation, teacher_temperature
from rlt.stages.context import StageContext, world_size
from rlt.stages.distill_parts import (
    append_rows,
    launch,
    parts_folder,
    rank_file,
    read_done,
    repair_tail,
    wait_for_all,
)
from rlt.stages.record import Recorder, announce_world, say_line, trace_line
from rlt.stages.rl_reward import reward_from_spec, scorable_rows
from rlt.stages.sft import teacher_prompt_ids
from rlt.stages.start_models import newest_teacher

if TYPE_CHECKING:
    import threading

    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from rlt.method.prompts import Formatter


def server_read_timeout(spec: RLTRunSpec) -> int:
    """How long a sequence's request may go without a byte: the rollout budget of a distill batch (waiting for the
    server, then its decode at the slowest assumed rate), not a fixed 600 s that 16k-token sequences outlast."""
    return rollout_seconds(spec, "distill")


def sequence_seed(run_seed: int, row: int, n: int, sample: int) -> int:
    """vLLM's seed of sample `sample` of stage row `row` (its request asks for that one sequence): every (row, sample)
    of a run has a seed of its own, a sequence asked for again (a cut stream, a restart) is the same sequence, and the
    rows depend neither on what else is in flight nor on the order requests finish in. The seed a request of one row
    and `n` samples gave sample j before (vLLM seeds sample j with seed + j). Below 2**63 (vLLM's bound) for any
    spec.seed < 2**32 and fewer than 2**31 sequences."""
    return run_seed * 2**31 + row * n + sample


def sequences_in_flight(spec: RLTRunSpec, prompt_tokens: int) -> tuple[int, str]:
    """Sequences one rank keeps in flight (rlt.checks.capacity.distill_sequences_in_flight: the generators' KV
    capacity shared by the ranks, for the rank's mean prompt), from the teacher's config read where it is (never
    downloaded)."""
    from rlt.checks.capacity import distill_sequences_in_flight, spec_gpu_memory
    from rlt.checks.shapes import read_shape

    shape, _ = read_shape(spec.teacher, build=False)
    return distill_sequences_in_flight(spec, shape, spec_gpu_memory(spec)[0], prompt_tokens)


def trained_teacher(ctx: StageContext) -> ModelRef:
    """The newest teacher the run has produced: RL's, else SFT's, else the spec's."""
    return newest_teacher(ctx, "distill")[0]


Question = tuple[int, dict[str, Any]]  # (stage row index, the row)


def server_questions(
    spec: RLTRunSpec, prompts: dict[int, list[int]], share: list[Question], in_flight: int
) -> Iterator[tuple[list[Question], Samples]]:
    """Server mode: the questions of `share` with their samples (prompt-major), in groups of up to batchSize, in the
    order the questions complete. One request per sequence, `in_flight` at the generators at all times while any
    are left: the slot of a finished sequence is refilled at once, while the caller scores."""
    # server mode runs with generation.serverUrl set (the operator fills it in)
    st, url = spec.stages.distill, cast(str, generation(spec).server_url)
    n, per_batch = st.samples_per_question, max(1, st.batch_size)
    timeout = server_read_timeout(spec)
    model = served_model(url, timeout)

    def one(seq: tuple[int, int], cancel: threading.Event) -> Samples:
        i, j = seq
        return server_generate(
            url,
            [prompts[i]],
            n=1,
            temperature=st.temperature,
            top_p=1.0,
            max_new_tokens=st.max_new_tokens,
            timeout=timeout,
            seed=sequence_seed(spec.seed, i, n, j),
            cancel=cancel,
            model=model,
        )

    rows = dict(share)
    got: dict[int, dict[int, Samples]] = {}
    ready: list[int] = []
    # question-major: a question's samples are sent together, so questions complete about as they were sent
    for (i, j), samples in as_completed(one, [(i, j) for i, _ in share for j in range(n)], in_flight):
        got.setdefault(i, {})[j] = samples
        if len(got[i]) == n:
            ready.append(i)
        if len(ready) == per_batch:
            yield _gathered(ready, got, rows, n)
            ready = []
    if ready:
        yield _gathered(ready, got, rows, n)


def _gathered(
    ready: list[int], got: dict[int, dict[int, Samples]], rows: dict[int, dict[str, Any]], n: int
) -> tuple[list[Question], Samples]:
    out = Samples([], [], [])
    for i in ready:
        for j in range(n):
            s = got[i][j]
            out.prompt_ids += s.prompt_ids
            out.completion_ids += s.completion_ids
            out.logprobs += s.logprobs
        del got[i]
    return [(i, rows[i]) for i in ready], out


def local_batches(
    spec: RLTRunSpec,
    teacher: PreTrainedModel | None,
    tokenizer: PreTrainedTokenizerBase,
    prompts: dict[int, list[int]],
    batches: list[list[Question]],
) -> Iterator[tuple[list[Question], Samples]]:
    """In process: the given batches in order (whole batches of the stage's fixed batching: my_share), each generated
    whole, then scored. Each batch samples from a seed of its own (the server path's seed of its first sequence), so a
    batch's rows depend on the run's seed and its questions only: not on what the process did before (training, other
    batches) nor on the rank or world size that explains it, and a restart writes the rows the uninterrupted run
    would have."""
    import torch

    if teacher is None:  # the caller loads the teacher whenever no server generates
        raise ValueError("in-process generation needs the teacher model: none was loaded")
    st = spec.stages.distill
    n = st.samples_per_question
    for batch in batches:
        ids = [prompts[i] for i, _ in batch for _ in range(n)]
        torch.manual_seed(sequence_seed(spec.seed, batch[0][0], n, 0))
        yield (
            batch,
            sample_with_logprobs(
                teacher,
                tokenizer,
                ids,
                temperature=st.temperature,
                top_p=1.0,
                max_new_tokens=st.max_new_tokens,
                batch_size=len(ids),
            ),
        )


def distill_rows(
    formatter: Formatter, chunk: list[dict[str, Any]], texts: list[str], totals: list[float], n: int
) -> list[dict[str, Any]]:
    """The student-format row of each question: its best candidate by reward, and every candidate, best first."""
    out = []
    for q, r in enumerate(chunk):
        cands = range(q * n, (q + 1) * n)
        best = max(cands, key=lambda k: totals[k])
        explanation, closed = formatter.split_explanation(texts[best])
        out.append(
            {
                **r.get("keep", {}),  # spec.dataset.keepColumns (names cannot clash: the spec refuses ours)
                "question": r["question"],
                "reasoning_trace": explanation,
                "solution": r["solution"],
                "reward": totals[best],
                "closed": closed,
                "candidate_rewards": [totals[k] for k in cands],
                "source_row": r["row"],
                "messages": formatter.student_messages(r["question"], explanation, r["solution"]),
                # every candidate, best first: the student stage's best_fit policy falls back to a shorter one
                "candidates": [
                    {"reasoning_trace": e, "reward": totals[k], "closed": c}
                    for k in sorted(cands, key=lambda k: -totals[k])
                    for e, c in [formatter.split_explanation(texts[k])]
                ],
            }
        )
    return out


def my_share(
    ctx: StageContext, total: int, rank: int, world: int, per_batch: int = 1
) -> tuple[Path, Path, list[list[int]], set[int]]:
    """(the parts folder, this rank's file, this rank's batches of row indices, the indices written before).
    The stage's rows fall into fixed batches (0..per_batch-1, the next per_batch, ...); the batches with a row no rank
    has written are dealt round-robin. A batch is redone whole when a kill cut it (its written rows are not written
    twice), so whichever rank and world size explains it, a batch's rows are the uninterrupted run's."""
    folder = parts_folder(ctx.layout.stage_dir("distill"), ctx.spec)
    mine = rank_file(folder, rank)
    repair_tail(mine)
    done = set(read_done(folder, before=launch()))  # this launch's peers may have written already: not dealt on
    batches = [list(range(s, min(s + per_batch, total))) for s in range(0, total, per_batch)]
    todo = [b for b in batches if not done.issuperset(b)]
    if done and ctx.is_main:
        left = sum(i not in done for b in todo for i in b)
        say_line(f"distill: resuming: {len(done)} of {total} rows were written before, {left} left")
    return folder, mine, todo[rank::world], done


def run_distill(ctx: StageContext) -> str:
    from tqdm.auto import tqdm  # type: ignore[import-untyped]  # tqdm ships no type information

    spec, st, formatter = ctx.spec, ctx.spec.stages.distill, ctx.formatter
    teacher_ref = trained_teacher(ctx)
    data = load_data(spec.dataset, formatter.fmt)
    student_tok: PreTrainedTokenizerBase = load_tokenizer(spec.student, padding_side="right")
    all_rows = scorable_rows(
        data.train[: st.limit], formatter, student_tok, spec.dataset.bad_rows, "distill", data.where
    )
    # Each rank explains its own share and appends its rows to its file; rank 0 merges the files in dataset order.
    # No process group: nothing to time out.
    rank, world = int(os.environ.get(RANK.name, "0")), world_size()
    announce_world("distill")
    server = generation(spec).mode == "server"
    # in process a batch is generated whole (its rows share one seed); served, every sequence has a seed of its own
    per_batch = 1 if server else max(1, st.batch_size)
    folder, mine, batches, done = my_share(ctx, len(all_rows), rank, world, per_batch)
    share = [(i, all_rows[i]) for b in batches for i in b if i not in done]
    trace_line(f"rlt-shard stage=distill rank={rank} rows={','.join(str(i) for i, _ in share)}")
    tokenizer: PreTrainedTokenizerBase = load_tokenizer(teacher_ref, padding_side="left")
    teacher: PreTrainedModel | None = None if server else load_model(teacher_ref, ctx.compute_device)
    student: PreTrainedModel = load_model(spec.student, ctx.compute_device)
    # Best of N by the reward RL optimised: the teacher's log-probs at rl's temperature (the policy's sampling), the
    # student's at student_temperature. The sampling here gives the teacher's at stages.distill.temperature: where
    # that is not rl's, the teacher model scores its explanations itself at rl's (in process: it is loaded; a
    # served distill refuses the mix at validation).
    rescore = teacher is not None and st.temperature != teacher_temperature(spec)
    reward = reward_from_spec(
        spec,
        student,
        student_tok,
        formatter,
        teacher=teacher if rescore else None,
        teacher_tokenizer=tokenizer,
    )
    n = st.samples_per_question
    recorder = Recorder(ctx, "distill", len(share))
    recorder.reward_key = "candidateRewardMean"  # the step's reward averages every candidate, kept or not
    bar = tqdm(total=len(share), desc="distill", unit="q", disable=not (ctx.show_progress and ctx.is_main))
    prompts = {
        i: teacher_prompt_ids(formatter, tokenizer, all_rows[i]["question"], all_rows[i]["solution"])
        for b in batches
        for i in b
    }
    if server:
        mean_prompt = sum(map(len, prompts.values())) // max(1, len(prompts))
        in_flight, why = sequences_in_flight(spec, mean_prompt)
        say_line(f"distill: rank {rank}: {why}")
        done_questions = server_questions(spec, prompts, share, in_flight)
    else:
        whole = [[(i, all_rows[i]) for i in b] for b in batches]
        done_questions = local_batches(spec, teacher, tokenizer, prompts, whole)
    kept: list[float] = []
    t0 = time.perf_counter()
    for batch, samples in done_questions:
        chunk = [r for _, r in batch]
        # one sequence of ids decodes to one str
        texts = [cast(str, tokenizer.decode(c, skip_special_tokens=True)) for c in samples.completion_ids]
        questions = [r["question"] for r in chunk for _ in range(n)]
        solutions = [r["solution"] for r in chunk for _ in range(n)]
        sampled = None if rescore else samples.logprobs  # None: the teacher's forward at rl's temperature
        scores = reward.score(questions, solutions, texts, sampled, samples.completion_ids)
        made = distill_rows(formatter, chunk, texts, scores.total, n)
        # a batch a kill cut is generated whole again (its rows share one seed); only its unwritten rows are written
        written = [(i, row) for (i, _), row in zip(batch, made, strict=True) if i not in done]
        append_rows(mine, written)  # on disk before the next questions are scored
        trace_line(f"rlt-distill-written rank={rank} rows={','.join(str(i) for i, _ in written)}")
        kept += [row["reward"] for _, row in written]
        elapsed, t0 = time.perf_counter() - t0, time.perf_counter()  # since the previous questions were written
        gen_tokens = sum(len(c) for c in samples.completion_ids)
        recorder.record(
            len(kept),
            {
                "reward": sum(scores.total) / len(scores.total),
                "step_seconds": elapsed,
                "kept_reward": sum(kept) / len(kept),
                "generated_tokens": gen_tokens,
                "tokens_per_second": gen_tokens / elapsed,
                **{k: v for k, v in scores.means().items() if k != "total"},
            },
        )
        if ctx.metrics:
            ctx.metrics.inc(catalogue.DISTILL_ROWS, len(written))
        bar.update(len(written))
    bar.close()
    path = ctx.layout.distill_dataset
    if rank == 0:
        write_jsonl(path, wait_for_all(folder, len(all_rows)))
    recorder.done()
    return str(path)
