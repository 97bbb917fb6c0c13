"""Stage `distill`: the trained teacher explains every question; the best of `samplesPerQuestion` candidates by
RLT reward becomes a student-format row: question, reasoning_trace, solution, reward (JSONL, written atomically).
Each row also keeps every candidate (text, reward, closed), best first.

Resumable (rlt.stages.distill_parts): each rank appends its finished batches to its own file on the volume, a
restart does only the rows no rank has written, and rank 0 merges the files; the ranks share no process group."""

from __future__ import annotations

import os
import time

from rlt.contract import metrics as catalogue
from rlt.contract.env import RANK
from rlt.data.dataset import load_data
from rlt.data.jsonl import write_jsonl
from rlt.data.models import load_model, load_tokenizer
from rlt.method.generation import sample_with_logprobs, server_generate
from rlt.method.pipeline import in_order
from rlt.spec.budgets import rollout_seconds
from rlt.spec.fingerprint import stage_fingerprint
from rlt.spec.inputs import ModelRef
from rlt.spec.run import RLTRunSpec
from rlt.stages.context import StageContext, world_size
from rlt.stages.distill_parts import append_rows, parts_dir, rank_file, read_done, repair_tail, wait_for_all
from rlt.stages.record import Recorder, announce_world, say_line
from rlt.stages.rl_reward import reward_from_spec
from rlt.stages.sft import teacher_prompt_ids
from rlt.stages.start_models import newest_teacher


def server_read_timeout(spec: RLTRunSpec) -> int:
    """How long one batch's request may take to answer: the rollout budget of a distill batch (waiting for the
    server, then its decode at the slowest assumed rate), not a fixed 600 s that 16k-token batches outlast."""
    return rollout_seconds(spec, "distill")


def batch_seed(run_seed: int, first_row: int, n: int) -> int:
    """vLLM's seed of the request of the batch that starts at stage row `first_row`: sample j of its prompts gets
    seed + j, so every (batch, sample) of a run has a seed of its own, a sequence asked for again after a cut stream
    is the same sequence, and the rows do not depend on what else is in flight. Below 2**63 (vLLM's bound) for any
    spec.seed < 2**32 and fewer than 2**31 sequences."""
    return run_seed * 2**31 + first_row * n


def requests_in_flight(spec: RLTRunSpec, prompt_tokens: int) -> tuple[int, str]:
    """Requests one rank keeps in flight (rlt.checks.capacity.distill_requests_in_flight: the generators' KV
    capacity shared by the ranks, for the rank's mean prompt), from the teacher's config read where it is (never
    downloaded)."""
    from rlt.checks.capacity import distill_requests_in_flight, spec_gpu_memory
    from rlt.checks.shapes import read_shape

    shape, _ = read_shape(spec.teacher, build=False)
    return distill_requests_in_flight(spec, shape, spec_gpu_memory(spec)[0], prompt_tokens)


def trained_teacher(ctx: StageContext) -> ModelRef:
    """The newest teacher the run has produced: RL's, else SFT's, else the spec's."""
    return newest_teacher(ctx, "distill")[0]


def run_distill(ctx: StageContext) -> str:
    from tqdm.auto import tqdm

    spec, st = ctx.spec, ctx.spec.stages.distill
    device, formatter = ctx.compute_device, ctx.formatter
    teacher_ref = trained_teacher(ctx)
    all_rows = load_data(spec.dataset, formatter.fmt).train[: st.limit]
    # Each rank explains its own share of the rows no rank has written yet (a restart resumes by row index) and
    # appends them to its file; rank 0 merges the files in dataset order. No process group: nothing to time out.
    rank, world = int(os.environ.get(RANK.name, "0")), world_size()
    announce_world("distill")
    folder = parts_dir(ctx.layout.stage_dir("distill"), stage_fingerprint(spec, "distill"))
    mine = rank_file(folder, rank)
    repair_tail(mine)
    done = read_done(folder)
    remaining = [i for i in range(len(all_rows)) if i not in done]
    share = [(i, all_rows[i]) for i in remaining[rank::world]]
    say_line(f"rlt-shard stage=distill rank={rank} rows={','.join(str(i) for i, _ in share)}")
    if done and ctx.is_main:
        say_line(f"distill: resuming: {len(done)} of {len(all_rows)} rows were written before, {len(remaining)} left")
    tokenizer = load_tokenizer(teacher_ref, padding_side="left")
    gen = spec.stages.rl.generation
    teacher = None if gen.mode == "server" else load_model(teacher_ref, device)
    student = load_model(spec.student, device)
    reward = reward_from_spec(
        spec, student, load_tokenizer(spec.student, padding_side="right"), formatter, teacher_tokenizer=tokenizer
    )
    n = st.samples_per_question
    recorder = Recorder(ctx, "distill", len(share))
    recorder.reward_key = "candidateRewardMean"  # the step's reward averages every candidate, kept or not
    out_rows: list[dict] = []
    per_batch = max(1, st.batch_size)
    bar = tqdm(total=len(share), desc="distill", unit="q", disable=not (ctx.show_progress and ctx.is_main))
    batches = [share[s : s + per_batch] for s in range(0, len(share), per_batch)]

    prompts = {i: teacher_prompt_ids(formatter, tokenizer, r["question"], r["solution"]) for i, r in share}

    def generate(batch: list[tuple[int, dict]], cancel=None):
        prompt_ids = [prompts[i] for i, _ in batch]
        if teacher is None:
            return server_generate(
                gen.server_url,
                prompt_ids,
                n=n,
                temperature=st.temperature,
                top_p=1.0,
                max_new_tokens=st.max_new_tokens,
                timeout=server_read_timeout(spec),
                seed=batch_seed(spec.seed, batch[0][0], n),
                cancel=cancel,
            )
        return sample_with_logprobs(
            teacher,
            tokenizer,
            [p for p in prompt_ids for _ in range(n)],
            temperature=st.temperature,
            top_p=1.0,
            max_new_tokens=st.max_new_tokens,
            batch_size=per_batch * n,
        )

    in_flight = 0
    if teacher is None:
        mean_prompt = sum(map(len, prompts.values())) // max(1, len(prompts))
        in_flight, why = requests_in_flight(spec, mean_prompt)
        say_line(f"distill: rank {rank}: {why}")
    # Server mode: requests in flight while this rank scores the answers that came back, in order (in_order);
    # in process, or in_flight 0: one batch at a time, generated then scored.
    done_batches = in_order(generate, batches, in_flight) if in_flight > 0 else ((b, generate(b)) for b in batches)
    t0 = time.perf_counter()
    for batch, samples in done_batches:
        chunk = [r for _, r in batch]
        texts = [tokenizer.decode(c, skip_special_tokens=True) for c in samples.completion_ids]
        questions = [r["question"] for r in chunk for _ in range(n)]
        solutions = [r["solution"] for r in chunk for _ in range(n)]
        scores = reward.score(questions, solutions, texts, samples.logprobs, samples.completion_ids)
        for i, r in enumerate(chunk):
            cands = range(i * n, (i + 1) * n)
            best = max(cands, key=lambda k: scores.total[k])
            explanation, closed = formatter.split_explanation(texts[best])
            out_rows.append(
                {
                    **r.get("keep", {}),  # spec.dataset.keepColumns (names cannot clash: the spec refuses ours)
                    "question": r["question"],
                    "reasoning_trace": explanation,
                    "solution": r["solution"],
                    "reward": scores.total[best],
                    "closed": closed,
                    "candidate_rewards": [scores.total[k] for k in cands],
                    "source_row": r["row"],
                    "messages": formatter.student_messages(r["question"], explanation, r["solution"]),
                    # every candidate, best first: the student stage's best_fit policy falls back to a shorter one
                    "candidates": [
                        {"reasoning_trace": e, "reward": scores.total[k], "closed": c}
                        for k in sorted(cands, key=lambda k: -scores.total[k])
                        for e, c in [formatter.split_explanation(texts[k])]
                    ],
                }
            )
        indices = [i for i, _ in batch]
        append_rows(mine, zip(indices, out_rows[-len(chunk) :], strict=True))  # on disk before the next batch
        say_line(f"rlt-distill-written rank={rank} rows={','.join(map(str, indices))}")
        elapsed, t0 = time.perf_counter() - t0, time.perf_counter()  # since the previous batch was written
        gen_tokens = sum(len(c) for c in samples.completion_ids)
        recorder.record(
            len(out_rows),
            {
                "reward": sum(scores.total) / len(scores.total),
                "step_seconds": elapsed,
                "kept_reward": sum(r["reward"] for r in out_rows) / len(out_rows),
                "generated_tokens": gen_tokens,
                "tokens_per_second": gen_tokens / elapsed,
                **{k: v for k, v in scores.means().items() if k != "total"},
            },
        )
        if ctx.metrics:
            ctx.metrics.inc(catalogue.DISTILL_ROWS, len(chunk))
        bar.update(len(chunk))
    bar.close()
    path = ctx.layout.distill_dataset
    if rank == 0:
        write_jsonl(path, wait_for_all(folder, len(all_rows)))
    recorder.done()
    return str(path)
