"""Stages of method rcl: `sft` (format warm-up: probe -> diagnosis -> guidance rows), `rl` (GRPO with the two-pass
rollout and the RCL reward) and `evaluate` (APG/NDR/TES on held-out problems). Same TRL trainers and Recorder as rlt.

Two properties the public RCL code lacks and tests pin down (tests/training/test_rcl_rl.py):
- the prompt the GRPO loss conditions on is the exact prompt the guidance was sampled from (question + probe):
  the rollout returns those token ids as `prompt_ids`, and TRL computes every log-prob from them;
- in server mode the rollout goes through TRL's `_generate`, which pushes the policy weights to vLLM whenever the
  optimizer step changed, i.e. before every step's generation.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from rlt.contract.layout import REPORT_MD, RunLayout
from rlt.data.dataset import LoadedData, load_data
from rlt.data.errors import sift_rows
from rlt.data.eval_set import evaluation_set
from rlt.data.models import load_model, load_tokenizer
from rlt.method.prompts import resolve_format
from rlt.rcl.protocol import Protocol, load_rcl_format
from rlt.rcl.reward import RCLReward, RewardParams, student_sampler
from rlt.rcl.summary import step_values
from rlt.spec.inputs import ModelRef
from rlt.spec.run import RLTRun, RLTRunSpec
from rlt.stages.context import StageContext
from rlt.stages.record import PhaseTimer, Recorder
from rlt.stages.rl import sample_policy, teacher_start, train_grpo
from rlt.stages.sft import train_sft
from rlt.stages.start_models import newest_teacher

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase
    from trl.trainer.grpo_trainer import GRPOTrainer, RolloutFunc

    from rlt.spec.stages import RlStage


def protocol_for(spec: RLTRunSpec) -> Protocol:
    return Protocol(load_rcl_format(spec.rcl.format))


def _data(spec: RLTRunSpec) -> LoadedData:
    return load_data(spec.dataset, resolve_format(spec.format))


# --------------------------------------------------------------------------- sft


def rcl_sft_rows(
    rows: list[dict[str, Any]],
    protocol: Protocol,
    tokenizer: PreTrainedTokenizerBase,
    bad_rows: str,
    where: Callable[[int], str] = lambda i: f"row {i}",
) -> list[dict[str, str]]:
    """Teacher-format rows from worked reasoning: fixed probe and diagnosis (format file), guidance = its first line.
    A bad row is named by `where(row)` ('line N' of the file)."""
    f = protocol.fmt

    def problem(r: dict[str, Any]) -> str | None:
        if (r.get("reasoning_trace") or "").strip():
            return None
        return (
            f"{where(r['row'])}: reasoning_trace is missing; the rcl warm-up takes the guidance from it (disable "
            "stages.sft or set spec.dataset.badRows: skip)"
        )

    return [
        {
            "prompt": protocol.teacher_prompt(tokenizer, r["question"], f.sft_probe),
            "completion": protocol.teacher_target(f.sft_diagnosis, r["reasoning_trace"].strip().splitlines()[0])
            + tokenizer.eos_token,
        }
        for r in sift_rows(rows, problem, bad_rows, "sft (rcl)", "without a reasoning_trace")
    ]


def run_rcl_sft(ctx: StageContext) -> str:
    spec = ctx.spec
    tokenizer: PreTrainedTokenizerBase = load_tokenizer(spec.teacher, padding_side="right")
    data = _data(spec)
    rows = rcl_sft_rows(data.train, protocol_for(spec), tokenizer, spec.dataset.bad_rows, data.where)
    return train_sft(ctx, ctx.compute_device, rows, tokenizer)


# --------------------------------------------------------------------------- rl


def rcl_rl_rows(
    rows: list[dict[str, Any]],
    protocol: Protocol,
    tokenizer: PreTrainedTokenizerBase,
    max_prompt_tokens: int,
    max_probe_tokens: int,
    bad_rows: str,
    where: Callable[[int], str] = lambda i: f"row {i}",
) -> list[dict[str, str]]:
    """Dataset rows for GRPO: `prompt` is the bare question (the rollout builds the real teacher prompt). A bad row
    is named by `where(row)` ('line N' of the file)."""

    def problem(r: dict[str, Any]) -> str | None:
        n = len(tokenizer(protocol.teacher_prompt(tokenizer, r["question"], ""), add_special_tokens=False).input_ids)
        if n + max_probe_tokens <= max_prompt_tokens:
            return None
        return (
            f"{where(r['row'])}: teacher prompt is {n} tokens + up to {max_probe_tokens} probe tokens, over "
            f"stages.rl.maxPromptLength={max_prompt_tokens}"
        )

    return [
        {"prompt": r["question"], "question": r["question"], "solution": r["solution"]}
        for r in sift_rows(rows, problem, bad_rows, "rl (rcl)", "too long")
    ]


def probe_sampler(
    protocol: Protocol,
    student: PreTrainedModel,
    student_tok: PreTrainedTokenizerBase,
    *,
    temperature: float,
    max_tokens: int,
) -> Callable[[list[str]], list[str]]:
    """Pass 1: one short approach outline per question, from the frozen student."""
    from rlt.method.generation import sample_with_logprobs

    def probe(questions: list[str]) -> list[str]:
        ids = [
            student_tok(protocol.probe_prompt(student_tok, q), add_special_tokens=False).input_ids for q in questions
        ]
        s = sample_with_logprobs(
            student, student_tok, ids, temperature=temperature, top_p=1.0, max_new_tokens=max_tokens
        )
        return student_tok.batch_decode(s.completion_ids, skip_special_tokens=True)

    return probe


def make_rcl_rollout(
    protocol: Protocol,
    teacher_tok: PreTrainedTokenizerBase,
    probe_fn: Callable[[list[str]], list[str]],
    st: RlStage,
    timer: PhaseTimer,
    counters: dict[str, int],
) -> RolloutFunc:
    """TRL rollout_func: probe once per question, then G guidance samples from the teacher prompt (question + probe).

    `prompt_ids` returned = the tokens of that teacher prompt, so the GRPO loss conditions on exactly the
    prompt each guidance was sampled from."""

    def rollout(prompts: list[str], trainer: GRPOTrainer) -> dict[str, Any]:
        g = cast(int, trainer.num_generations)  # grpo_options always sets num_generations
        groups = [prompts[k : k + g] for k in range(0, len(prompts), g)]
        for grp in groups:
            if len(grp) != g or any(p != grp[0] for p in grp):
                raise RuntimeError(f"rcl rollout: expected groups of {g} identical prompts, got {grp!r}")
        questions = [grp[0] for grp in groups]
        with timer.phase("generate"):
            probes = probe_fn(questions)
            teacher_prompts = [
                protocol.teacher_prompt(teacher_tok, q, p) for q, p in zip(questions, probes, strict=True)
            ]
            unique_ids = [teacher_tok(t, add_special_tokens=False).input_ids for t in teacher_prompts]
            prompt_ids = [ids for ids in unique_ids for _ in range(g)]
            # server mode: TRL has already pushed this step's weights (see GRPOTrainer._generate)
            completion_ids, logprobs = sample_policy(trainer, teacher_tok, prompt_ids, g, st)
        counters["generated_tokens"] += sum(len(c) for c in completion_ids)
        return {
            "prompt_ids": prompt_ids,
            "completion_ids": completion_ids,
            "logprobs": logprobs,
            "probe": [p for p in probes for _ in range(g)],
            "teacher_prompt": [t for t in teacher_prompts for _ in range(g)],
        }

    return rollout


def build_rcl_reward(
    spec: RLTRunSpec,
    protocol: Protocol,
    student: PreTrainedModel,
    student_tok: PreTrainedTokenizerBase,
    teacher_tok: PreTrainedTokenizerBase,
) -> RCLReward:
    rcl, rl = spec.rcl, spec.stages.rl
    scorer = None
    if rcl.performance == "dense":
        from rlt.method.scoring import SpanScorer

        scorer = SpanScorer(
            student,
            student_tok,
            temperature=rl.temperature,
            batch_size=rl.reward.batch_size,
            share_prefix=rl.reward.share_prefix,
        )
    answer = student_sampler(student, student_tok, temperature=rl.temperature, max_new_tokens=rcl.max_student_tokens)
    return RCLReward(
        protocol,
        student_tok,
        answer,
        samples=rcl.student_samples,
        params=RewardParams.from_spec(rcl),
        teacher_tokenizer=teacher_tok,
        performance=rcl.performance,
        scorer=scorer,
    )


def run_rcl_rl(ctx: StageContext) -> str:
    spec, st = ctx.spec, ctx.spec.stages.rl
    device = ctx.compute_device
    protocol = protocol_for(spec)
    start = teacher_start(ctx)
    tokenizer: PreTrainedTokenizerBase = load_tokenizer(start, padding_side="left")
    data = _data(spec)
    rows = rcl_rl_rows(
        data.train,
        protocol,
        tokenizer,
        st.max_prompt_length,
        spec.rcl.max_probe_tokens,
        spec.dataset.bad_rows,
        data.where,
    )
    student: PreTrainedModel = load_model(spec.student, device)
    student_tok: PreTrainedTokenizerBase = load_tokenizer(spec.student, padding_side="left")
    reward = build_rcl_reward(spec, protocol, student, student_tok, tokenizer)
    probe_fn = probe_sampler(
        protocol, student, student_tok, temperature=st.temperature, max_tokens=spec.rcl.max_probe_tokens
    )

    def reward_values() -> dict[str, float]:
        return {k: v for k, v in reward.last.means().items() if k != "reward"} if reward.last is not None else {}

    def rollout(timer: PhaseTimer, counters: dict[str, int]) -> RolloutFunc:
        return make_rcl_rollout(protocol, tokenizer, probe_fn, st, timer, counters)

    return train_grpo(ctx, device, start, tokenizer, rows, reward, rollout, reward_values)


def final_teacher(ctx: StageContext) -> tuple[ModelRef, str]:
    """The run's latest finished teacher: rl's model, else sft's, else spec.teacher (label for the report)."""
    return newest_teacher(ctx, "evaluate", strict=False)


def eval_rows(spec: RLTRunSpec) -> list[dict[str, Any]]:
    """The evaluate stage's rows (rlt.data.eval_set, as method rlt's stage and `rlt compare` read them)."""
    return evaluation_set(spec, resolve_format(spec.format)).rows


def evaluate_teaching(
    ctx: StageContext,
    teacher: ModelRef | None,
    label: str,
    out_dir: Path,
    on_problems: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Two-pass evaluation of `teacher` (None = no teacher) -> out_dir/<label>/ and out_dir/report.md. The problems
    go through in slices of `batchSize`, each through both passes, so that a bar and on_problems(done, total) move
    while it runs: one pass over a whole paper-scale set is longer than RLTRunStalled waits for a step."""
    from tqdm.auto import tqdm  # type: ignore[import-untyped]  # tqdm ships no type information

    from rlt.rcl.evaluation import ProblemRecord, evaluate_teacher, write_report

    spec, ev = ctx.spec, ctx.spec.stages.evaluate
    device = ctx.compute_device
    rows = eval_rows(spec)
    t0 = time.perf_counter()
    student: PreTrainedModel = load_model(spec.student, device)
    student_tok: PreTrainedTokenizerBase = load_tokenizer(spec.student, padding_side="left")
    t_model = t_tok = None
    if teacher is not None:
        t_model, t_tok = load_model(teacher, device), load_tokenizer(teacher, padding_side="left")
    records: list[ProblemRecord] = []
    bar = tqdm(
        total=len(rows), desc=f"evaluate {label}", unit="problem", disable=not (ctx.show_progress and ctx.is_main)
    )
    for start in range(0, len(rows), ev.batch_size):
        records += evaluate_teacher(
            protocol_for(spec),
            rows[start : start + ev.batch_size],
            student,
            student_tok,
            t_model,
            t_tok,
            student_samples=spec.rcl.student_samples,
            guidance_samples=ev.samples,
            temperature=ev.temperature,
            max_probe_tokens=spec.rcl.max_probe_tokens,
            max_student_tokens=spec.rcl.max_student_tokens,
            max_guidance_tokens=ev.max_new_tokens,
            batch_size=ev.batch_size,
        )
        bar.update(len(records) - bar.n)
        if on_problems is not None:
            on_problems(len(records), len(rows))
    bar.close()
    info = {"teacher": teacher.model if teacher else "none", "seconds": round(time.perf_counter() - t0, 1)}
    return write_report(out_dir, label, records, info)


def run_rcl_evaluate(ctx: StageContext) -> str:
    teacher, label = final_teacher(ctx)
    recorder = Recorder(ctx, "evaluate", 1)

    def problems_done(done: int, total: int) -> None:  # the stage's step: problems evaluated (the stall clock)
        recorder.set_total(total)
        recorder.step_ended(done, {})

    out_dir = ctx.layout.eval_dir  # the evaluate stage and `rlt eval` share one report
    summary = evaluate_teaching(ctx, teacher, label, out_dir, problems_done)
    recorder.record(recorder.total, step_values(summary))
    recorder.done()
    return str(out_dir / REPORT_MD)


# --------------------------------------------------------------------------- `rlt eval`


def named_teacher(ctx: StageContext, teacher: str | None, label: str | None) -> tuple[ModelRef | None, str]:
    """(model or None, report label) for `rlt eval --teacher`: unset = the run's latest trained teacher, "none" = no
    teacher, "initial" = spec.teacher, else a model path or hub id."""
    if teacher is None:
        ref, name = final_teacher(ctx)
    elif teacher == "none":
        ref, name = None, "none"
    elif teacher == "initial":
        ref, name = ctx.spec.teacher, "initial"
    else:
        ref = ctx.spec.teacher.model_copy(update={"model": teacher, "revision": None})
        shown = "-".join(Path(teacher).parts[-2:]) if Path(teacher).exists() else teacher
        name = re.sub(r"[^A-Za-z0-9_.-]+", "-", shown).strip("-")
    return ref, label or name


def run_teaching_eval(
    run: RLTRun,
    output: str | Path = "results",
    teacher: str | None = None,
    label: str | None = None,
    device: str | None = None,
) -> Path:
    """`rlt eval`: the teaching evaluation of one teacher into <output>/<run>/eval/<label>/; returns report.md."""
    from rlt.data.models import quiet_libraries

    quiet_libraries()
    ctx = StageContext(run, RunLayout.for_run(output, run.name), None, device, show_progress=False)
    ref, name = named_teacher(ctx, teacher, label)
    evaluate_teaching(ctx, ref, name, ctx.layout.eval_dir)
    return ctx.layout.eval_dir / REPORT_MD
