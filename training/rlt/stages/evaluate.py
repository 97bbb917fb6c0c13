"""Stage `evaluate` (method rlt): accuracy of a model on held-out questions, pass@1 averaged over `samples`.

The model answers in the student format (student system prompt, question); its answer is taken from the
solution tags and checked with rlt.answers (math), as a letter (choice), or with the built-in task's checker.
Writes eval/report.json, eval/report.md, eval/per_question.jsonl and eval/accuracy.png.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlt import answers, tasks
from rlt.benchmarks import find_benchmark, load_benchmark
from rlt.data import DataError, load_data
from rlt.layout import atomic_write_json, atomic_write_text
from rlt.prompts import Formatter, resolve_format
from rlt.spec import ModelRef
from rlt.stages.common import (
    Recorder,
    StageContext,
    announce_world,
    gather_shares,
    join_process_group,
    my_share,
    rank_device,
)


@dataclass
class EvalSet:
    rows: list[dict[str, Any]]
    answer_type: str  # math | choice | builtin
    source: str


# --------------------------------------------------------------------------- what is evaluated, on what


def eval_target(ctx: StageContext) -> tuple[str, ModelRef]:
    """(label, model): the spec's model, else the student stage's model, else the untrained student."""
    spec, st = ctx.spec, ctx.spec.stages.evaluate
    if st.model is not None:
        return "custom", st.model
    if spec.stages.student.enabled:
        if not ctx.layout.stage_done("student").exists():
            raise RuntimeError("stage evaluate needs the student stage's model; run stage student first")
        ref = spec.stages.student.model or spec.student
        return "student", ref.model_copy(update={"model": str(ctx.layout.model_dir("student")), "revision": None})
    return "baseline", spec.stages.student.model or spec.student


def resolve_answer_type(requested: str, source: str) -> str:
    if requested != "auto":
        return requested
    bench = find_benchmark(source)
    if bench is not None:
        return bench.answer
    return "builtin" if source.startswith("builtin:") else "math"


def load_eval_set(spec, fmt) -> EvalSet:
    """The evaluation questions: stages.evaluate.dataset (a benchmark, a dataset, a built-in task), else the
    held-out part of spec.dataset."""
    st = spec.stages.evaluate
    if st.dataset is not None:
        bench = find_benchmark(st.dataset.source)
        if bench is not None:
            rows = load_benchmark(bench, st.dataset.revision, st.limit)
        else:
            rows = load_data(st.dataset, fmt).train
        source = st.dataset.source
    else:
        if spec.dataset.eval_fraction <= 0:
            raise DataError(
                "stages.evaluate.dataset: not set, and spec.dataset.evalFraction is 0 (no held-out rows); "
                "set one of them"
            )
        rows = load_data(spec.dataset, fmt).eval
        source = f"{spec.dataset.source} (held out)"
    rows = rows[: st.limit]
    if not rows:
        raise DataError(f"stage evaluate: {source} gave no questions")
    return EvalSet(
        rows, resolve_answer_type(st.answer_type, st.dataset.source if st.dataset else spec.dataset.source), source
    )


# --------------------------------------------------------------------------- grading


def grade(row: dict[str, Any], output: str, answer_type: str, tags: tuple[str, str]) -> tuple[str | None, bool]:
    """(extracted answer, correct) of one model output for one question."""
    if answer_type == "choice":
        got = answers.normalize(answers.extract_answer(output, tags, last_number=False))
        want = answers.normalize(row["solution"])
        return got, got is not None and len(got) == 1 and got == want
    if answer_type == "builtin":
        block = _between(output, *tags)
        answer = block if block is not None else _last_line(output)
        verdict = tasks.check_builtin(row["question"], answer)
        if verdict is not None:  # countdown/basic: verified from the question itself; other built-in rows are math
            return answer, verdict
    if answer_type not in ("math", "builtin"):
        raise ValueError(f"stages.evaluate.answerType: unknown {answer_type!r}")
    got = answers.extract_answer(output, tags)
    return got, answers.is_correct(output, row["solution"], tags)


def _between(text: str, start: str, end: str) -> str | None:
    i = text.rfind(start)
    if i < 0:
        return None
    j = text.find(end, i + len(start))
    return (text[i + len(start) : j] if j >= 0 else text[i + len(start) :]).strip()


def _last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def pass_at_1(per_question: Sequence[Sequence[bool]]) -> float:
    """Mean over questions of the share of correct answers (pass@1 estimated from every sample)."""
    if not per_question:
        raise ValueError("no questions")
    return sum(sum(c) / len(c) for c in per_question) / len(per_question)


# --------------------------------------------------------------------------- generation


def generate_answers(
    model,
    tokenizer,
    prompts: list[str],
    *,
    samples: int,
    temperature: float,
    top_p: float,
    max_new_tokens: int,
    batch_size: int,
    server_url: str | None = None,
    timeout: float = 600.0,
    on_batch=None,
) -> list[list[str]]:
    """`samples` decoded answers per prompt, in-process (the shared sampler; greedy at temperature 0) or from vLLM."""
    from rlt.generation import sample_with_logprobs, server_generate

    prompt_ids = [tokenizer(p, add_special_tokens=False).input_ids for p in prompts]
    out: list[list[str]] = []
    for start in range(0, len(prompts), batch_size):
        chunk = prompt_ids[start : start + batch_size]
        if server_url:
            ids = server_generate(
                server_url,
                chunk,
                n=samples,
                temperature=temperature,
                top_p=top_p,
                max_new_tokens=max_new_tokens,
                timeout=timeout,
            ).completion_ids
        elif temperature > 0:
            ids = sample_with_logprobs(
                model,
                tokenizer,
                [p for p in chunk for _ in range(samples)],
                temperature=temperature,
                top_p=top_p,
                max_new_tokens=max_new_tokens,
                batch_size=len(chunk) * samples,
            ).completion_ids
        else:
            ids = _greedy(model, tokenizer, chunk, max_new_tokens)
        texts = [tokenizer.decode(c, skip_special_tokens=True) for c in ids]
        batch = [texts[i * samples : (i + 1) * samples] for i in range(len(chunk))]
        out += batch
        if on_batch is not None:
            on_batch(start, batch, sum(len(c) for c in ids))
    return out


def _greedy(model, tokenizer, prompt_ids, max_new_tokens: int) -> list[list[int]]:
    import torch

    device = next(model.parameters()).device
    width = max(len(p) for p in prompt_ids)
    ids = torch.full((len(prompt_ids), width), tokenizer.pad_token_id, dtype=torch.long, device=device)
    mask = torch.zeros_like(ids)
    for j, p in enumerate(prompt_ids):
        ids[j, width - len(p) :] = torch.tensor(p, device=device)
        mask[j, width - len(p) :] = 1
    from rlt.generation import clean_generation_config, only_generation_config

    # greedy on the model's own logits: no repetition penalty or other processor from the checkpoint's config
    config = clean_generation_config(
        model, do_sample=False, max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id
    )
    with torch.no_grad(), only_generation_config(model, config):
        seqs = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
    eos = tokenizer.eos_token_id
    out = []
    for row in seqs[:, width:].tolist():
        out.append(row[: row.index(eos) + 1] if eos in row else row)
    return out


# --------------------------------------------------------------------------- one model on one set


def evaluate_model(
    ctx: StageContext, ref: ModelRef, label: str, evalset: EvalSet, out_dir: Path, settings=None
) -> dict[str, Any]:
    """Answer every question `samples` times, grade, write the report files under out_dir; return the report."""
    from tqdm.auto import tqdm

    from rlt.models import load_model, load_tokenizer, pick_device

    st = settings or ctx.spec.stages.evaluate
    device = rank_device(ctx.device or pick_device())
    rank, world = join_process_group(device)
    announce_world("evaluate")
    # Each rank answers its own share of the questions; rank 0 merges them in order and writes the report.
    all_rows = evalset.rows
    share = my_share(all_rows, rank, world)
    print(f"rlt-shard stage=evaluate rank={rank} rows={','.join(str(i) for i, _ in share)}", flush=True)
    evalset = EvalSet([r for _, r in share], evalset.answer_type, evalset.source)
    formatter = Formatter(resolve_format(ctx.spec.format))
    tags = (formatter.t.solution_start, formatter.t.solution_end)
    tokenizer = load_tokenizer(ref, padding_side="left")
    server = st.generation.server_url if st.generation.mode == "server" else None
    if st.generation.mode == "server" and not server:
        raise ValueError("stages.evaluate.generation.serverUrl: required when mode is server")
    model = None if server else load_model(ref, device)
    prompts = [
        tokenizer.apply_chat_template(
            formatter.student_messages(r["question"], "", "")[:2], tokenize=False, add_generation_prompt=True
        )
        for r in evalset.rows
    ]
    recorder = Recorder(ctx, "evaluate", len(prompts))
    recorder.eval_model = label  # rlt_eval_accuracy/<label> in experiment tracking
    bar = tqdm(total=len(prompts), desc=f"evaluate {label}", unit="q", disable=not (ctx.show_progress and ctx.is_main))
    graded: list[list[bool]] = []
    started = time.perf_counter()
    tokens = {"n": 0}

    def on_batch(start, batch, n_tokens):
        for row, outs in zip(evalset.rows[start : start + len(batch)], batch, strict=True):
            graded.append([grade(row, o, evalset.answer_type, tags)[1] for o in outs])
        tokens["n"] += n_tokens
        acc = pass_at_1(graded)
        elapsed = time.perf_counter() - started
        recorder.record(
            len(graded),
            {
                "accuracy": acc,
                "generated_tokens": n_tokens,
                "tokens_per_second": tokens["n"] / elapsed if elapsed > 0 else 0.0,
            },
        )
        if ctx.metrics:
            ctx.metrics.set("rlt_eval_accuracy", acc, model=label)
            ctx.metrics.inc("rlt_eval_questions_total", len(batch), model=label)
            ctx.metrics.inc("rlt_eval_answers_total", sum(len(o) for o in batch), model=label)
        bar.update(len(batch))
        bar.set_postfix({"acc": f"{acc:.3f}"}, refresh=True)

    outputs = generate_answers(
        model,
        tokenizer,
        prompts,
        samples=st.samples,
        temperature=st.temperature,
        top_p=st.top_p,
        max_new_tokens=st.max_new_tokens,
        batch_size=st.batch_size,
        server_url=server,
        timeout=st.generation.server_timeout_seconds,
        on_batch=on_batch,
    )
    bar.close()
    seconds = time.perf_counter() - started
    answered = gather_shares(
        [(i, outs) for (i, _), outs in zip(share, outputs, strict=True)], rank, world, len(all_rows)
    )
    if answered is None:
        return {}  # not rank 0: rank 0 writes the report
    per_question = []
    for row, outs in zip(all_rows, answered, strict=True):
        checked = [grade(row, o, evalset.answer_type, tags) for o in outs]
        per_question.append(
            {
                "row": row.get("row"),
                "question": row["question"],
                "solution": row["solution"],
                "accuracy": sum(c for _, c in checked) / len(checked),
                "answers": [{"text": o, "extracted": e, "correct": c} for o, (e, c) in zip(outs, checked, strict=True)],
            }
        )
    evalset = EvalSet(all_rows, evalset.answer_type, evalset.source)
    report = build_report(label, ref.model, evalset, st, per_question, seconds, tokens["n"])
    write_report(out_dir, report, per_question)
    if ctx.metrics:
        ctx.metrics.set("rlt_eval_accuracy", report["accuracy"], model=label)
    return report


def build_report(
    label: str,
    model: str,
    evalset: EvalSet,
    st,
    per_question: list[dict[str, Any]],
    seconds: float,
    generated_tokens: int,
) -> dict[str, Any]:
    accs = [q["accuracy"] for q in per_question]
    acc = sum(accs) / len(accs)
    n = len(accs)
    return {
        "model": label,
        "modelPath": model,
        "dataset": evalset.source,
        "answerType": evalset.answer_type,
        "questions": n,
        "samples": st.samples,
        "temperature": st.temperature,
        "maxNewTokens": st.max_new_tokens,
        "accuracy": acc,
        # standard error of the mean over questions (per-question accuracies are the unit)
        "stderr": math.sqrt(sum((a - acc) ** 2 for a in accs) / (n - 1) / n) if n > 1 else None,
        "correct": sum(sum(a["correct"] for a in q["answers"]) for q in per_question),
        "answers": sum(len(q["answers"]) for q in per_question),
        "seconds": round(seconds, 1),
        "generatedTokens": generated_tokens,
    }


def markdown_table(reports: list[dict[str, Any]]) -> str:
    lines = ["| model | questions | samples | pass@1 | ± s.e. | correct / answers |", "|---|---|---|---|---|---|"]
    for r in reports:
        se = f"{r['stderr']:.3f}" if r.get("stderr") is not None else "—"
        lines.append(
            f"| {r['model']} | {r['questions']} | {r['samples']} | {r['accuracy']:.3f} | {se} | "
            f"{r['correct']} / {r['answers']} |"
        )
    return "\n".join(lines) + "\n"


def plot_accuracy(reports: list[dict[str, Any]], path: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(4, 1.6 * len(reports) + 2), 4))
    xs = range(len(reports))
    ax.bar(
        xs, [r["accuracy"] for r in reports], yerr=[r.get("stderr") or 0 for r in reports], capsize=4, color="tab:blue"
    )
    ax.set_xticks(list(xs), [r["model"] for r in reports])
    ax.set_ylim(0, 1)
    ax.set_ylabel("pass@1 (mean over questions)")
    ax.set_title(title, fontsize=10)
    for x, r in zip(xs, reports, strict=True):
        ax.text(x, r["accuracy"] + 0.02, f"{r['accuracy']:.2f}", ha="center", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_report(out_dir: Path, report: dict[str, Any], per_question: list[dict[str, Any]]) -> None:
    atomic_write_text(
        out_dir / "per_question.jsonl", "".join(json.dumps(q, ensure_ascii=False) + "\n" for q in per_question)
    )
    atomic_write_json(out_dir / "report.json", report)
    atomic_write_text(out_dir / "report.md", f"# Evaluation: {report['dataset']}\n\n" + markdown_table([report]))
    plot_accuracy([report], out_dir / "accuracy.png", f"{report['dataset']} ({report['answerType']})")


def run_evaluate(ctx: StageContext) -> str:
    formatter = Formatter(resolve_format(ctx.spec.format))
    label, ref = eval_target(ctx)
    evalset = load_eval_set(ctx.spec, formatter.fmt)
    out = ctx.layout.eval_dir
    report = evaluate_model(ctx, ref, label, evalset, out)
    if report:  # rank 0
        print(markdown_table([report]), end="", flush=True)
    Recorder(ctx, "evaluate", len(evalset.rows)).done()
    return str(out)
