"""The two-pass evaluation of a teacher on held-out problems (`rlt eval`), summarised by rlt.rcl.summary."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from rlt.contract.layout import PROBLEMS_FILE, REPORT_MD, TEACHER_METRICS_FILE, TEACHER_PLOT, format_time
from rlt.rcl.summary import summarize_problems

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from rlt.rcl.protocol import Protocol


class ProblemRecord(TypedDict, total=False):
    """One line of problems.jsonl: a problem, the student's accuracy without and with guidance, and the teaching."""

    row: int | None
    question: str
    solution: str
    acc_without: float
    acc_with: float
    teaching_tokens: float
    probe: str | None
    guidance: list[str | None]
    teacher_outputs: list[str]
    format_ok: float | None  # share of well-formed guidance; None without a teacher
    leaked: float | None  # share of guidance that states the answer; None without a teacher


def evaluate_teacher(
    protocol: Protocol,
    rows: list[dict[str, Any]],
    student: PreTrainedModel,
    student_tok: PreTrainedTokenizerBase,
    teacher: PreTrainedModel | None,
    teacher_tok: PreTrainedTokenizerBase | None,
    *,
    student_samples: int,
    guidance_samples: int,
    temperature: float,
    max_probe_tokens: int,
    max_student_tokens: int,
    max_guidance_tokens: int,
    batch_size: int,
) -> list[ProblemRecord]:
    """Per-problem records of the two-pass protocol. teacher None = no teacher (acc_with is acc_without)."""
    from rlt.method.generation import sample_texts
    from rlt.rcl.reward import states_answer, student_sampler

    answer = student_sampler(
        student, student_tok, temperature=temperature, max_new_tokens=max_student_tokens, batch_size=batch_size
    )

    def accuracy(prompts: list[str], questions: list[str], sols: list[str]) -> list[float]:
        return [
            sum(protocol.correct(a, q, s) for a in ans) / len(ans)
            for ans, q, s in zip(answer(prompts, student_samples), questions, sols, strict=True)
        ]

    qs, sols = [r["question"] for r in rows], [r["solution"] for r in rows]
    base = accuracy([protocol.student_prompt(student_tok, q) for q in qs], qs, sols)
    records: list[ProblemRecord] = [
        {"row": r.get("row"), "question": q, "solution": s, "acc_without": b}
        for r, q, s, b in zip(rows, qs, sols, base, strict=True)
    ]
    if teacher is None:
        return _untaught(records)
    if teacher_tok is None:
        raise ValueError("evaluate_teacher: a teacher needs its tokenizer (teacher_tok is None)")
    probes = sample_texts(
        student,
        student_tok,
        [protocol.probe_prompt(student_tok, q) for q in qs],
        temperature=temperature,
        max_new_tokens=max_probe_tokens,
        batch_size=batch_size,
    )
    teacher_prompts = [
        protocol.teacher_prompt(teacher_tok, q, p)
        for q, p in zip(qs, probes, strict=True)
        for _ in range(guidance_samples)
    ]
    outputs = sample_texts(
        teacher,
        teacher_tok,
        teacher_prompts,
        temperature=temperature,
        max_new_tokens=max_guidance_tokens,
        batch_size=batch_size,
    )
    guidance = [protocol.extract_guidance(o) for o in outputs]
    todo = [k for k, g in enumerate(guidance) if g]  # zero-length guidance ("") = the student alone, as in the reward
    acc = dict(
        zip(
            todo,
            accuracy(
                [protocol.student_prompt(student_tok, qs[k // guidance_samples], guidance[k]) for k in todo],
                [qs[k // guidance_samples] for k in todo],
                [sols[k // guidance_samples] for k in todo],
            ),
            strict=True,
        )
    )
    for i, rec in enumerate(records):
        ks = range(i * guidance_samples, (i + 1) * guidance_samples)
        # a missing or zero-length guidance passes nothing on: the student answers alone (acc_without)
        withs = [acc.get(k, rec["acc_without"]) for k in ks]
        given = [guidance[k] for k in ks]
        toks = [len(teacher_tok(g, add_special_tokens=False).input_ids) if g else 0 for g in given]
        rec.update(
            {
                "probe": probes[i],
                "acc_with": sum(withs) / len(withs),
                "teaching_tokens": sum(toks) / len(toks),
                "guidance": given,
                "teacher_outputs": [outputs[k] for k in ks],
                "format_ok": sum(g is not None for g in given) / len(ks),
                "leaked": sum(states_answer(g, rec["solution"]) for g in given if g) / len(ks),
            }
        )
    return records


def _untaught(records: list[ProblemRecord]) -> list[ProblemRecord]:
    """The records of a run without a teacher: the student alone, so accuracy with teaching is accuracy without."""
    for rec in records:
        rec.update(
            {
                "acc_with": rec["acc_without"],
                "teaching_tokens": 0,
                "guidance": [],
                "probe": None,
                "format_ok": None,
                "leaked": None,
            }
        )
    return records


def _fmt(x: float | None, pct: bool = False) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    return f"{100 * x:.1f} %" if pct else f"{x:.3f}"


def write_report(out_dir: Path, label: str, records: list[ProblemRecord], info: Mapping[str, object]) -> dict[str, Any]:
    """eval/<label>/{problems.jsonl,metrics.json,plot.png} and eval/report.md (one row per evaluated teacher)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from rlt.contract.layout import atomic_write_json, atomic_write_text
    from rlt.data.jsonl import write_jsonl

    here = out_dir / label
    here.mkdir(parents=True, exist_ok=True)
    write_jsonl(here / PROBLEMS_FILE, records)
    summary: dict[str, Any] = {}  # the metrics.json document: numbers, the label, the info, the time
    summary |= summarize_problems([(r["acc_without"], r["acc_with"], r["teaching_tokens"]) for r in records])
    oks = [ok for r in records if (ok := r.get("format_ok")) is not None]
    summary["format_ok"] = sum(oks) / len(oks) if oks else None
    summary.update(label=label, **info, finished=format_time())
    atomic_write_json(here / TEACHER_METRICS_FILE, summary)

    fig, ax = plt.subplots(1, 2, figsize=(10, 4))
    xs = range(len(records))
    ax[0].bar([x - 0.2 for x in xs], [r["acc_without"] for r in records], 0.4, label="without guidance")
    ax[0].bar([x + 0.2 for x in xs], [r["acc_with"] for r in records], 0.4, label="with guidance")
    ax[0].set(title=f"{label}: student accuracy per problem", xlabel="problem", ylim=(0, 1.05))
    ax[0].legend()
    ax[1].scatter([r["teaching_tokens"] for r in records], [r["acc_with"] - r["acc_without"] for r in records])
    ax[1].axhline(0, color="grey", lw=0.5)
    ax[1].set(
        title=f"APG {_fmt(summary['apg'])}  NDR {_fmt(summary['ndr'], True)}  TES {_fmt(summary['tes'])}",
        xlabel="teaching tokens",
        ylabel="acc with − without",
    )
    fig.tight_layout()
    fig.savefig(here / TEACHER_PLOT, dpi=90)
    plt.close(fig)

    rows = [json.loads(p.read_text()) for p in sorted(out_dir.glob(f"*/{TEACHER_METRICS_FILE}"))]
    lines = [
        "| teacher | problems | APG | NDR | TES | acc without | acc with | teaching tokens | guidance well-formed | seconds |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for m in rows:
        lines.append(
            f"| {m['label']} ({m.get('teacher', '')}) | {m['problems']} | {_fmt(m['apg'])} | {_fmt(m['ndr'], True)} | "
            f"{_fmt(m['tes'])} | {_fmt(m['acc_without'], True)} | {_fmt(m['acc_with'], True)} | "
            f"{_fmt(m['teaching_tokens'])} | {_fmt(m.get('format_ok'), True)} | {m.get('seconds', '—')} |"
        )
    text = (
        "# RCL evaluation\n\nAPG = mean(acc with − acc without); NDR = 1 − share right without and wrong with "
        "(right = at least half the answers correct); TES = APG per 100 teaching tokens. See docs/rcl.md.\n\n"
        + "\n".join(lines)
        + "\n"
    )
    atomic_write_text(out_dir / REPORT_MD, text)
    return summary
