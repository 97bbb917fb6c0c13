"""The teaching comparison on `builtin:sums-detour` (issues 46, 52): do explanations from a teacher trained by GRPO
with the RLT reward distil a better student than the dataset's own traces, or than a teacher trained by SFT? The
design is docs/experiments.md, "Round five: the comparison's fixed design" (registered before any unit ran); the
arms' settings are the earlier protocol's ("Fixed with the runner"), unchanged.

The unit of analysis is a teacher seed s = 1 … 15. Per teacher seed three primary arms and two secondary ones:

  rl               sft warm-up -> rl -> distill                     (teacher seed s)
  sft-continued    sft for the warm-up's steps plus as many as rl takes -> distill
  raw              the dataset's traces are the distillation data (no teacher)
  sft-convergence  secondary: sft until the held-out loss stops improving -> distill
  friendly         secondary: the friendly rewrite as the distillation data (the ceiling)

Each arm's distillation data is distilled into K = 4 students (student + evaluate), student seeds 100·s + 1 … 4,
the same four in every arm of teacher seed s; the arm's value is their mean held-out pass@1, and the rule
(benchmarks/comparison_analysis.py) reads d_raw = rl − raw and d_sft = rl − sft-continued per teacher seed at 97.5 %.

A unit is one RLTRun of rlt's own stages under `run_local`, in a process of its own: a *teacher unit* (the arm's
teacher stages and distill; its row records the explanations' summary and where its dataset is) or a *student unit*
(student + evaluate from its teacher unit's dataset, or from the traces). Within a teacher seed: rl's teacher,
sft-continued's teacher, then the students (rl's, sft-continued's, raw's), then, with --secondary, sft-convergence's
teacher and one student, and one friendly student. A student unit of a teacher arm refuses to run before its teacher
unit's row is in the units file.

  python benchmarks/teaching_comparison.py --out results/teaching --deadline 06:30 --commit   # teacher seed by seed
  python benchmarks/teaching_comparison.py --analyse --plot docs/images/teaching-comparison.png
  python benchmarks/teaching_comparison.py --quick --out /tmp/tc --seeds 1 --minutes 30 --secondary   # tiny

Fixed with this runner for the fixed design (what the design leaves open; before any of its units): a teacher
unit's distill dataset is kept gzipped in benchmarks/teaching-comparison/ (its row names it, with the sha256 its
students check) and committed with its row, so a teacher seed's students run on any clone; the secondary arms run only with --secondary; the
deadline guard estimates each teacher arm's teacher units and all student units apart (comparison_runner); rl's
teacher unit and every student unit run in pieces (step 0's student units outlasted a session), SIGTERM 180 s before
the deadline (step 0's grace).

Each finished unit is appended to benchmarks/teaching-comparison.jsonl (with --commit, committed at once); a re-run
on any clone skips the units in it. The runner runs at nice 19 (its units' autogroups too: unit_runner), one unit at a time, and starts no unit that the recent units of its kind say cannot
end before the deadline; a unit still running at the deadline is stopped. A unit that fails stops the runner; it is
re-run under its own seeds, never replaced.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gzip
import hashlib
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import comparison_analysis as analysis
import teaching_protocol as protocol
from comparison_convergence import convergence_stop
from comparison_runner import (
    ARMS,
    FIRST_ESTIMATE,
    TEACHER_ARMS,
    parse_unit,
    pieces_file,
    progress,
    run_name,
    run_units,
    student_seed,
    teacher_row,
    unit_name,
    unit_runner,
)
from unit_runner import commit_rows, deadline_ts, lower_priority, one_runner, read_rows, stop_on_sigterm

# ---- registered (docs/experiments.md, "Round five: the comparison's fixed design"): the arms, the units' names,
# seeds and order are in comparison_runner, the rule's constants in comparison_analysis
RL_SAVE = 5  # rl checkpoints every RL_SAVE steps: its teacher unit runs in pieces (comparison_runner.PIECE)
UNITS_FILE = Path(__file__).parent / "teaching-comparison.jsonl"
# The protocol's teacher units' distillation datasets (gzip, ~10-40 kB each), committed with their rows: a new clone
# runs a finished teacher's students from the repository alone.
RECORDS = Path(__file__).parent / "teaching-comparison"
DEFAULT_OUT = "results/teaching"


@dataclass(frozen=True)
class Settings:
    """Sizes and optimiser settings of every arm (the protocol's; `QUICK` shrinks them to check the code runs)."""

    model: str = "builtin:smollm2-135m-instruct"  # teacher start and student start
    task: str = "sums-detour"
    train_rows: int = 256  # generator seed 0
    loss_rows: int = 32  # training-split rows after them, for sft-convergence's held-out loss only
    heldout: int = 200
    heldout_seed: int = 99
    warmup_steps: int = 32  # one epoch of 256 rows at batch 8
    sft_batch: int = 8
    sft_lr: float = 1e-4
    max_epochs: int = 20
    patience: int = 2
    rl_steps: int = 60
    questions: int = 2
    generations: int = 8
    rl_lr: float = 1e-5
    temperature: float = 1.0
    kl_weight: float = 3.0  # λ
    cap: int = 128  # explanation tokens, in rl and distill
    explain_temperature: float = 0.7
    student_epochs: float = 3.0
    student_lr: float = 2e-5
    student_batch: int = 16
    answer_tokens: int = 160  # the student writes its own reasoning, then the answer
    students: int = analysis.STUDENTS  # K per arm and teacher seed (registered; QUICK runs fewer)


QUICK = Settings(
    model="builtin:tiny-qwen2",
    train_rows=16,
    loss_rows=4,
    heldout=6,
    warmup_steps=2,
    sft_batch=4,
    max_epochs=3,
    rl_steps=2,
    generations=2,
    cap=12,
    student_epochs=1.0,
    student_batch=4,
    answer_tokens=12,
    students=2,
)


# ---- the data: training rows, held-out questions, and the rows sft-convergence measures its loss on


def training_rows(s: Settings) -> list[dict[str, Any]]:
    from rlt.data import tasks

    return [dict(r) for r in tasks.generate(s.task, s.train_rows, 0)]


def heldout_rows(s: Settings) -> list[dict[str, Any]]:
    """The first `heldout` rows of generator seed `heldout_seed` whose question is not among the training rows."""
    from rlt.data import tasks

    seen = {r["question"] for r in training_rows(s)}
    fresh = [dict(r) for r in tasks.generate(s.task, 4 * s.heldout, s.heldout_seed) if r["question"] not in seen]
    if len(fresh) < s.heldout:
        raise ValueError(f"generator seed {s.heldout_seed} gave {len(fresh)} unseen questions, {s.heldout} wanted")
    return fresh[: s.heldout]


def loss_rows(s: Settings) -> list[dict[str, Any]]:
    """Training-split rows (generator seed 0) after the training rows, not used for distillation: the first
    `loss_rows` whose question is neither trained on nor held out."""
    from rlt.data import tasks

    taken = {r["question"] for r in training_rows(s)} | {r["question"] for r in heldout_rows(s)}
    more = tasks.generate(s.task, s.train_rows + 8 * s.loss_rows, 0)[s.train_rows :]
    rows = [dict(r) | {"row": i} for i, r in enumerate(more) if r["question"] not in taken][: s.loss_rows]
    if len(rows) < s.loss_rows:
        raise ValueError(f"only {len(rows)} loss rows left after the training and held-out questions")
    return rows


def friendly_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows with the friendly rewrite as their trace (rlt.data.headroom.friendly_trace)."""
    from rlt.data.headroom import friendly_trace, operands

    return [r | {"reasoning_trace": friendly_trace(*operands(r["question"]))} for r in rows]


# ---- each arm as an RLTRun


def run_spec(
    s: Settings,
    arm: str,
    seed: int,
    heldout_file: str,
    part: str = "all",
    name: str | None = None,
    fp32: bool = False,
) -> dict[str, Any]:
    """The RLTRun of one unit. Every arm shares the student stage and the evaluation; the teacher arms differ only
    in their sft/rl stages (constant learning rates, so sft-continued's first warm-up steps are the rl arm's
    warm-up). part "teacher": the teacher stages and distill only (seed: the teacher seed); "student": student and
    evaluate only (seed: the student seed; its distillation data is put in place before it runs); "all": both.
    fp32: the weights and the training in float32 whatever the device (a teacher unit on a GPU, where rlt's auto is
    bf16, trains as the CPU units do; on CPU auto is float32 already)."""
    if arm not in ARMS:
        raise ValueError(f"arm {arm!r}: choose from {', '.join(ARMS)}")
    if part not in ("all", "teacher", "student"):
        raise ValueError(f"part {part!r}: choose from all, teacher, student")
    teacher = arm in TEACHER_ARMS and part != "student"
    student = part != "teacher"
    sft: dict[str, Any] = {
        "enabled": teacher,
        "batchSize": s.sft_batch,
        "perDeviceBatchSize": s.sft_batch,
        "learningRate": s.sft_lr,
        "lrScheduler": "constant",
        "warmupRatio": 0.0,
        "maxLength": 384,
        "gradientCheckpointing": False,
        "saveSteps": 10_000,
    }
    if arm == "rl":
        sft["maxSteps"] = s.warmup_steps
    elif arm == "sft-continued":
        sft["maxSteps"] = s.warmup_steps + s.rl_steps  # compute-matched: one optimizer step per RL step
    else:
        sft["epochs"] = float(s.max_epochs)  # sft-convergence stops earlier (ConvergenceStop); raw/friendly: off
    models: dict[str, Any] = {"model": s.model} | ({"dtype": "float32"} if fp32 else {})
    if fp32:
        sft["precision"] = "fp32"
    return {
        "apiVersion": "rlt.dev/v1alpha1",
        "kind": "RLTRun",
        "metadata": {"name": name or run_name(arm, seed)},
        "spec": {
            "method": "rlt",
            "seed": seed,
            "teacher": dict(models),
            "student": dict(models),
            "dataset": {"source": f"builtin:{s.task}", "size": s.train_rows, "seed": 0},
            "resources": {"trainer": {"gpus": 1}},  # one trainer process: the batch sizes are per run
            "stages": {
                "sft": sft,
                "rl": {
                    "enabled": arm == "rl" and teacher,
                    "steps": s.rl_steps,
                    "batchSize": s.questions * s.generations,
                    "numGenerations": s.generations,
                    "perDeviceBatchSize": s.questions * s.generations,
                    "learningRate": s.rl_lr,
                    "temperature": s.temperature,
                    "beta": 0.0,
                    "maxCompletionLength": s.cap,
                    "maxPromptLength": 512,
                    "saveSteps": RL_SAVE,
                    "gradientCheckpointing": False,
                    "reward": {"lambda": s.kl_weight, "batchSize": 8},
                }
                | ({"precision": "fp32"} if fp32 else {}),
                # one explanation per question, kept whatever its reward: filtering would be a second treatment
                "distill": {
                    "enabled": teacher,
                    "samplesPerQuestion": 1,
                    "temperature": s.explain_temperature,
                    "maxNewTokens": s.cap,
                    "batchSize": 16,
                },
                "student": {
                    "enabled": student,
                    "epochs": s.student_epochs,
                    "learningRate": s.student_lr,
                    "batchSize": s.student_batch,
                    "perDeviceBatchSize": s.student_batch,
                    "maxLength": 512,
                    "gradientCheckpointing": False,
                    "saveSteps": 10_000,
                },
                "evaluate": {
                    "enabled": student,
                    "dataset": {"source": heldout_file},
                    "answerType": "builtin",
                    "temperature": 0.0,
                    "samples": 1,
                    "maxNewTokens": s.answer_tokens,
                    "batchSize": 16,
                    "limit": s.heldout,
                },
            },
        },
    }


def write_trace_dataset(path: Path, rows: list[dict[str, Any]]) -> None:
    """The distillation data of the raw and friendly arms: each row's own trace, in the distill stage's format."""
    from rlt.data.jsonl import write_jsonl
    from rlt.method.prompts import Formatter, resolve_format
    from rlt.spec.inputs import FormatSpec

    formatter = Formatter(resolve_format(FormatSpec()))
    path.parent.mkdir(parents=True, exist_ok=True)
    write_jsonl(
        path,
        [
            {
                "question": r["question"],
                "reasoning_trace": r["reasoning_trace"],
                "solution": r["solution"],
                "source_row": i,
                "messages": formatter.student_messages(r["question"], r["reasoning_trace"], r["solution"]),
            }
            for i, r in enumerate(rows)
        ],
    )


# ---- one unit: a teacher's stages and distill, or a student's distillation and evaluation


def write_heldout(s: Settings, out: Path) -> str:
    """The held-out rows in out/heldout.jsonl (every unit: deterministic, and never another settings' rows)."""
    from rlt.data.jsonl import write_jsonl

    path = out / "heldout.jsonl"
    write_jsonl(path, heldout_rows(s))
    return str(path.resolve())


def records_dir(s: Settings, out: Path) -> Path:
    """Where teacher units keep their datasets for their students: RECORDS for the protocol, under `out` else."""
    return RECORDS if s == Settings() else out / "records"


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def stamp(s: Settings, summary: dict[str, Any], t0: float, earlier: list[dict]) -> dict[str, Any]:
    """What every row records about its run: stage seconds and the seconds of all its pieces (a stage stopped at a
    deadline and resumed counts both pieces; one finished in an earlier piece counts too), settings, device."""
    return {
        "stage_seconds": {k: v.get("secondsAllRuns", v.get("seconds")) for k, v in summary.get("stages", {}).items()},
        "seconds": round(time.perf_counter() - t0 + sum(p["seconds"] for p in earlier), 1),
        "pieces": len(earlier) + 1,
        "settings": "protocol" if s == Settings() else "quick" if s == QUICK else "other",
        "device": device_name(),
        "ended": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def distil_and_evaluate(
    s: Settings, out: Path, spec: dict[str, Any], put_data: Callable[[Path], None], pieces: Path
) -> dict[str, Any]:
    """A student run (student + evaluate of `spec`): its distillation data put in place by put_data(path), then
    the student stage and the held-out evaluation; pass@1, the per-question grades and the run's stamp."""
    from rlt.contract.layout import PER_QUESTION_FILE, REPORT_JSON, RunLayout
    from rlt.data.jsonl import read_jsonl
    from rlt.run.runner import run_local
    from rlt.spec.loading import parse_run

    t0, earlier = time.perf_counter(), read_rows(pieces)
    run = parse_run(spec)
    layout = RunLayout.for_run(out, run.name)
    put_data(layout.distill_dataset)
    summary = run_local(run, out, metrics_port=None, show_progress=False, only=["student", "evaluate"])
    report = json.loads((layout.eval_dir / REPORT_JSON).read_text())
    graded = list(read_jsonl(layout.eval_dir / PER_QUESTION_FILE))
    if report["questions"] != s.heldout or len(graded) != s.heldout:
        raise SystemExit(f"{layout.eval_dir}: {report['questions']} questions evaluated, {s.heldout} held out")
    return {
        "pass1": report["accuracy"],
        "correct": [int(q["accuracy"] > 0.5) for q in graded],
        "questions": report["questions"],
    } | stamp(s, summary, t0, earlier)


def teacher_unit(s: Settings, out: Path, arm: str, seed: int, plots: bool = True) -> dict[str, Any]:
    """A teacher arm's teacher stages and distill under teacher seed `seed`; its row records the explanations'
    summary and where its distillation dataset is (relative to `out`, with its sha256 for the students to check).
    plots False: the run draws none (the GPU box has no matplotlib)."""
    import contextlib

    from rlt.contract.layout import RunLayout
    from rlt.data.jsonl import read_jsonl
    from rlt.data.models import quiet_libraries
    from rlt.run.runner import run_local
    from rlt.spec.loading import parse_run

    if arm not in TEACHER_ARMS:
        raise ValueError(f"arm {arm!r}: only a teacher arm ({', '.join(TEACHER_ARMS)}) has a teacher unit")
    quiet_libraries()
    name = unit_name(arm)
    t0, earlier = time.perf_counter(), read_rows(pieces_file(out, name, seed))
    on_gpu = device_name() != "cpu"  # a lent GPU (benchmarks/gpu_teachers.py): trained in float32 as on CPU
    run = parse_run(run_spec(s, arm, seed, write_heldout(s, out), part="teacher", fp32=on_gpu))
    layout = RunLayout.for_run(out, run.name)
    convergence = layout.root / "convergence.json"
    stop = convergence_stop(loss_rows(s), s.patience, convergence) if arm == "sft-convergence" else None
    with stop or contextlib.nullcontext():
        summary = run_local(run, out, metrics_port=None, show_progress=False, plots_wanted=plots)
    explained = list(read_jsonl(layout.distill_dataset))
    if len(explained) != s.train_rows:
        raise SystemExit(f"{layout.distill_dataset}: {len(explained)} explanations, {s.train_rows} training rows")
    archive = records_dir(s, out) / f"{arm}-seed{seed}.jsonl.gz"
    archive.parent.mkdir(parents=True, exist_ok=True)
    with gzip.GzipFile(archive, "wb", mtime=0) as f:  # mtime 0: the same explanations give the same bytes
        f.write(layout.distill_dataset.read_bytes())
    row: dict[str, Any] = {
        "kind": "teacher",
        "unit": name,
        "arm": arm,
        "seed": seed,
        "dataset": archive.name,
        "dataset_sha256": file_sha256(layout.distill_dataset),
        "explanations": {
            "rows": len(explained),
            "mean_reward": statistics.fmean(r["reward"] for r in explained),
            "closed": statistics.fmean(float(r["closed"]) for r in explained),
            "states_solution": statistics.fmean(
                float(protocol.mentions(r["reasoning_trace"], r["solution"])) for r in explained
            ),
        },
    } | stamp(s, summary, t0, earlier)
    if convergence.exists():
        row["convergence"] = json.loads(convergence.read_text())
    if arm == "rl":
        row["rl_tokens"] = rl_tokens(layout.metrics_file)
    return row


def rl_tokens(metrics_file: Path) -> dict[str, Any]:
    """What the rl stage generated, measured (the design states compute-matched in tokens as well as steps): its
    steps and the completion tokens they sampled, from the run's metrics.jsonl (a step a resumed piece logged twice
    counted once)."""
    from rlt.run.plots import latest_per_step, read_metrics

    steps = latest_per_step(read_metrics(metrics_file), "rl")
    return {"steps": len(steps), "generated": int(sum(r.get("generated_tokens", 0) for r in steps))}


def student_unit(
    s: Settings, out: Path, arm: str, seed: int, student: int, teacher: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Student `student` of `arm` under teacher seed `seed` (student seed 100·seed + student): a teacher arm's
    student distils its teacher unit's dataset (`teacher`: that unit's row; refused without it), raw's and
    friendly's the training rows' traces."""
    from rlt.data.models import quiet_libraries

    name = unit_name(arm, student)
    parse_unit(name)
    data: bytes | None = None
    if arm in TEACHER_ARMS:
        needed = f"teacher unit {unit_name(arm)} of teacher seed {seed}"
        if teacher is None:
            raise ValueError(f"student unit {name} of teacher seed {seed}: its {needed} has no row yet; run it first")
        source = records_dir(s, out) / teacher["dataset"]
        if not source.exists():
            raise ValueError(
                f"student unit {name}: {source.name}, the dataset of its {needed}, is not in {source.parent}"
            )
        data = gzip.decompress(source.read_bytes())
        if hashlib.sha256(data).hexdigest() != teacher["dataset_sha256"]:
            raise ValueError(f"student unit {name}: {source} is not the dataset its {needed} recorded (sha256)")
    quiet_libraries()

    def put_data(path: Path) -> None:
        if data is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        else:
            rows = training_rows(s)
            write_trace_dataset(path, rows if arm == "raw" else friendly_rows(rows))

    spec = run_spec(
        s, arm, student_seed(seed, student), write_heldout(s, out), part="student", name=run_name(arm, seed, student)
    )
    row = {"kind": "student", "unit": name, "arm": arm, "seed": seed, "student": student}
    row |= {"student_seed": student_seed(seed, student)}
    if teacher is not None:
        row["dataset_sha256"] = teacher["dataset_sha256"]
    return row | distil_and_evaluate(s, out, spec, put_data, pieces_file(out, name, seed))


def unit(s: Settings, out: Path, arm: str, seed: int, traces: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Round five step 0's unit (benchmarks/headroom_students.py): the raw or friendly arm's traces of `traces`
    (default: the training rows) distilled into a student with seed `seed`, and evaluated."""
    from rlt.data.models import quiet_libraries

    if arm in TEACHER_ARMS:
        raise ValueError(f"arm {arm!r}: a teacher arm trains on the training rows in its own teacher and student units")
    quiet_libraries()
    rows = training_rows(s) if traces is None else traces

    def put_data(path: Path) -> None:
        write_trace_dataset(path, rows if arm == "raw" else friendly_rows(rows))

    spec = run_spec(s, arm, seed, write_heldout(s, out))
    return {"arm": arm, "seed": seed} | distil_and_evaluate(s, out, spec, put_data, pieces_file(out, arm, seed))


def device_name() -> str:
    """Where the unit ran (a pairing across machines would mix fp32 on CPU with bf16 on a GPU)."""
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--out", default=DEFAULT_OUT, help="the units' run folders (--quick: OUT-quick unless given)")
    p.add_argument(
        "--units", type=Path, help=f"the finished units (default {UNITS_FILE.name}; --quick: OUT/units.jsonl)"
    )
    seeds = list(range(1, analysis.SEEDS_FIXED + 1))
    p.add_argument("--seeds", type=lambda v: [int(x) for x in v.split(",")], default=seeds, help="teacher seeds")
    p.add_argument("--secondary", action="store_true", help="also sft-convergence and friendly (outside the rule)")
    p.add_argument("--deadline", help="HH:MM UTC: no unit runs past it")
    p.add_argument("--minutes", type=float, help="or: no unit runs past this many minutes from now")
    p.add_argument("--quick", action="store_true", help="the tiny model and sizes: checks that every arm runs")
    p.add_argument("--nice", type=int, default=19)
    p.add_argument("--lock", default="/tmp/rlt-heavy.lock", help="taken per unit; '' for none")
    p.add_argument("--progress", action="store_true", help="units done and left, CPU hours left (no arm values)")
    p.add_argument("--analyse", action="store_true", help="print the arm values, the contrasts and the verdicts")
    p.add_argument("--plot", type=Path, help="with --analyse: draw the per-seed contrasts here")
    p.add_argument("--commit", action="store_true", help="commit each unit's row (a teacher's dataset too) at once")
    p.add_argument("--unit", help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, help=argparse.SUPPRESS)
    p.add_argument("--no-plots", action="store_true", help=argparse.SUPPRESS)  # a teacher unit on the GPU box
    args = p.parse_args(argv)
    s = QUICK if args.quick else Settings()
    settings = "quick" if args.quick else "protocol"
    out = Path(args.out)
    if args.quick and out == Path(DEFAULT_OUT):
        out = Path(DEFAULT_OUT + "-quick")  # never the protocol's folder: its units would be taken as measured
    if args.units is None:  # --quick's rows never go to the committed file
        args.units = out / "units.jsonl" if args.quick else UNITS_FILE
    if args.analyse:
        analysis.analyse(read_rows(args.units), args.plot, settings, s.students)
        return
    if args.progress:
        print("\n".join(progress(read_rows(args.units), args.seeds, s.students)))
        return
    if args.unit:
        if argv is None:  # the unit's own process (unit_runner's): its runs report to no tracker
            from rlt.stages.tracking import hide_tracking_libraries

            hide_tracking_libraries()
        arm, student = parse_unit(args.unit)
        if student is None:
            row = teacher_unit(s, out, arm, args.seed, plots=not args.no_plots)
        else:
            teacher = teacher_row(args.units, arm, args.seed, settings) if arm in TEACHER_ARMS else None
            row = student_unit(s, out, arm, args.seed, student, teacher)
        (out / f"unit-{args.unit}-seed{args.seed}.json").write_text(json.dumps(row))
        return
    if args.commit and args.quick:
        raise SystemExit("--commit: only the protocol's rows are committed (--quick writes under --out)")

    def record(path: Path, row: dict) -> None:
        if args.commit:
            also = [records_dir(s, out) / row["dataset"]] if row["kind"] == "teacher" else []
            commit_rows(path, f"teaching comparison: unit {row['unit']} of teacher seed {row['seed']}", also=also)

    end = deadline_ts(args.deadline, args.minutes, dt.datetime.now(dt.UTC))
    lower_priority(args.nice)
    stop_on_sigterm()
    out.mkdir(parents=True, exist_ok=True)
    print(f"settings: {json.dumps(asdict(s))}", flush=True)
    first = {k: v / (60 if args.quick else 1) for k, v in FIRST_ESTIMATE.items()}
    runner = unit_runner(out, args.quick, args.lock or None, end, args.units)
    with one_runner(out):
        run_units(
            args.seeds, args.units, runner, end, first, students=s.students, secondary=args.secondary, record=record
        )
    # Counts only: arm values wait for --analyse, so whoever watches the runner stays blind to the outcome.
    rows = read_rows(args.units)
    print(f"{len(rows)} rows in {args.units}; the arm values: --analyse", flush=True)


if __name__ == "__main__":
    main()
