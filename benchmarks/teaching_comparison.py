"""The teaching comparison on `builtin:sums-detour` (issue 46; protocol in docs/experiments.md, "The teaching
comparison on builtin:sums-detour: protocol", committed before any run): do explanations from a teacher trained by
GRPO with the RLT reward distil a better student than the dataset's own traces, or than a teacher trained by SFT?

Five arms per seed, each an RLTRun of rlt's own stages (`run_local`, one process per unit):

  rl               sft warm-up -> rl -> distill -> student -> evaluate
  sft-continued    sft for the warm-up's steps plus as many as rl takes -> distill -> student -> evaluate
  sft-convergence  sft until the loss on held-out training-split rows stops improving -> distill -> student -> ...
  raw              the dataset's traces as the distillation data -> student -> evaluate
  friendly         the friendly rewrite as the distillation data -> student -> evaluate (the ceiling; not in the rule)

  python benchmarks/teaching_comparison.py --out results/teaching --deadline 06:30   # units, pilot seeds first
  python benchmarks/teaching_comparison.py --size       # after the pilot: seeds needed, from d's spread alone
  python benchmarks/teaching_comparison.py --analyse    # pass@1 per seed and arm, d, its interval, the verdict
  python benchmarks/teaching_comparison.py --quick --out /tmp/tc --seeds 1 --minutes 30   # tiny: checks it runs

Each finished unit is appended to benchmarks/teaching-comparison.jsonl (committed, small: pass@1 and the per-question
grades); a re-run skips the units in it. The runner runs at nice 19, one unit at a time, and starts no unit that
the recent units of its arm say cannot end before the deadline; a unit still running at the deadline is stopped.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import teaching_protocol as protocol
from unit_runner import (
    append_row,
    deadline_ts,
    heavy_lock,
    read_rows,
    run_missing_units,
    run_until,
    stop_on_sigterm,
    unit_estimate,
)

# ---- pre-registered (docs/experiments.md, "The teaching comparison ... protocol"); never edited after a unit ran
ARMS = ("rl", "sft-continued", "sft-convergence", "raw", "friendly")  # run order: the rule's two arms first
TEACHER_ARMS = ("rl", "sft-continued", "sft-convergence")
PRIMARY = ("rl", "sft-continued")  # d = pass@1(rl) − pass@1(sft-continued), per seed
SECONDARY = (("rl", "sft-convergence"), ("rl", "raw"), *((a, "friendly") for a in ARMS if a != "friendly"))
MARGIN = 0.05  # pass@1: 10 of 200 held-out questions
EFFECT = 0.10  # the effect the seed count is sized for (80 % power, paired)
PILOT = (1, 2, 3, 4)  # variance-only internal pilot: only the sd of d is read from them
MIN_SEEDS, MAX_SEEDS = 6, 24
SEEDS_FIXED: int | None = None  # set by a commit after the pilot (from --size), before seed 5 runs
FIRST_ESTIMATE = {"rl": 7200.0, "sft-continued": 1800.0, "sft-convergence": 3600.0, "raw": 1200.0}
FIRST_ESTIMATE["friendly"] = FIRST_ESTIMATE["raw"]
# rl's unit is longer than what a session has left after its other work; its stage checkpoints every RL_SAVE steps
# and a re-run continues from the last one (rlt's restarts change nothing: tests/training/test_restart_changes_nothing),
# so it may start with PIECE seconds left and is stopped at the deadline, to go on next time. GRACE seconds before
# the deadline a unit gets SIGTERM, on which the stage saves its last finished step.
RESUMABLE, PIECE, RL_SAVE, GRACE = ("rl",), 1200.0, 5, 120.0
UNITS_FILE = Path(__file__).parent / "teaching-comparison.jsonl"
DEFAULT_OUT = "results/teaching"
COURTESY = 20.0  # seconds between units without the lock


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


def run_name(arm: str, seed: int) -> str:
    return f"teach-{arm}-seed{seed}"


def run_spec(s: Settings, arm: str, seed: int, heldout_file: str) -> dict[str, Any]:
    """The RLTRun of one unit. Every arm shares the seed, the student stage and the evaluation; the teacher arms
    differ only in their sft/rl stages (constant learning rates, so sft-continued's first warm-up steps are the rl
    arm's warm-up)."""
    if arm not in ARMS:
        raise ValueError(f"arm {arm!r}: choose from {', '.join(ARMS)}")
    teacher = arm in TEACHER_ARMS
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
    return {
        "apiVersion": "rlt.dev/v1alpha1",
        "kind": "RLTRun",
        "metadata": {"name": run_name(arm, seed)},
        "spec": {
            "method": "rlt",
            "seed": seed,
            "teacher": {"model": s.model},
            "student": {"model": s.model},
            "dataset": {"source": f"builtin:{s.task}", "size": s.train_rows, "seed": 0},
            "resources": {"trainer": {"gpus": 1}},  # one trainer process: the batch sizes are per run
            "stages": {
                "sft": sft,
                "rl": {
                    "enabled": arm == "rl",
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
                },
                # one explanation per question, kept whatever its reward: filtering would be a second treatment
                "distill": {
                    "enabled": teacher,
                    "samplesPerQuestion": 1,
                    "temperature": s.explain_temperature,
                    "maxNewTokens": s.cap,
                    "batchSize": 16,
                },
                "student": {
                    "enabled": True,
                    "epochs": s.student_epochs,
                    "learningRate": s.student_lr,
                    "batchSize": s.student_batch,
                    "perDeviceBatchSize": s.student_batch,
                    "maxLength": 512,
                    "gradientCheckpointing": False,
                    "saveSteps": 10_000,
                },
                "evaluate": {
                    "enabled": True,
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


# ---- sft-convergence: the sft stage with a held-out loss at each epoch's end


def stop_epoch(losses: list[float], patience: int) -> tuple[int, bool]:
    """(best epoch, 1-based; whether to stop now): stop once the loss has not improved for `patience` evaluations."""
    best = min(range(len(losses)), key=lambda i: (losses[i], i)) + 1
    return best, len(losses) - best >= patience


def heldout_loss(model: Any, rows: list[dict[str, list[int]]]) -> float:
    """Mean token loss on the completions of tokenised sft rows (the completion-only loss SFT trains on)."""
    import torch

    was_training = model.training
    model.eval()
    total, tokens = 0.0, 0
    with torch.no_grad():
        for r in rows:
            ids = torch.tensor([r["input_ids"]], device=model.device)
            mask = torch.tensor(r["completion_mask"][1:], device=model.device, dtype=torch.float32)
            logits = model(ids).logits[0, :-1].float()
            nll = torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="none")
            total += float((nll * mask).sum())
            tokens += int(mask.sum())
    model.train(was_training)
    return total / tokens


def convergence_callback(
    rows: list[dict[str, list[int]]],
    patience: int,
    record: Path,
    evaluate: Callable[[Any], float] | None = None,
) -> Any:
    """A transformers TrainerCallback: the held-out loss at each epoch's end; training stops once it has not
    improved for `patience` evaluations, and the best epoch's weights are put back before the stage saves its final
    model (early stopping with the best model restored, as the protocol says). The losses go to `record`.
    `evaluate(model)` replaces the held-out loss on `rows` (the tests script the losses with it)."""
    from transformers import TrainerCallback

    score = evaluate or (lambda model: heldout_loss(model, rows))

    class ConvergenceStop(TrainerCallback):  # type: ignore[misc]
        def __init__(self) -> None:
            self.losses: list[float] = []
            self.best_state: dict[str, Any] | None = None

        def on_epoch_end(self, args: Any, state: Any, control: Any, **kw: Any) -> Any:
            model = kw["model"]
            self.losses.append(score(model))
            best, stop = stop_epoch(self.losses, patience)
            if best == len(self.losses):
                self.best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
            control.should_training_stop = control.should_training_stop or stop
            record.write_text(json.dumps({"losses": self.losses, "best_epoch": best, "stopped": stop}))
            return control

        def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> Any:
            if self.best_state is not None:
                kw["model"].load_state_dict(self.best_state)
            return control

    return ConvergenceStop()


@contextlib.contextmanager
def convergence_stop(s: Settings, record: Path) -> Iterator[None]:
    """Within it, the trainer of the sft stage gets ConvergenceStop (the stage itself is rlt's, unchanged)."""
    from rlt.method.prompts import Formatter, resolve_format
    from rlt.spec.inputs import FormatSpec
    from rlt.stages import trainer as stage_trainer
    from rlt.stages.sft import sft_rows

    original = stage_trainer.TrainerRun.trainer
    formatter = Formatter(resolve_format(FormatSpec()))

    def trainer(self: Any, trainer_cls: Any, args: Any, rows: Any, *more: Any, **kw: Any) -> Any:
        built = original(self, trainer_cls, args, rows, *more, **kw)
        if self.stage == "sft":
            tokenised = sft_rows(loss_rows(s), formatter, self.tokenizer, "reject", 384)
            built.add_callback(convergence_callback(tokenised, s.patience, record))
        return built

    stage_trainer.TrainerRun.trainer = trainer  # type: ignore[method-assign]
    try:
        yield
    finally:
        stage_trainer.TrainerRun.trainer = original  # type: ignore[method-assign]


# ---- one unit: train (or not) the arm's teacher, distil, evaluate; append its row


def unit(s: Settings, out: Path, arm: str, seed: int, traces: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """One unit's row. `traces`: the raw or friendly arm's questions when not the training rows (round five's
    step 0, benchmarks/headroom_students.py); the teacher arms always train on the training rows."""
    from rlt.contract.layout import PER_QUESTION_FILE, REPORT_JSON, RunLayout
    from rlt.data.jsonl import read_jsonl, write_jsonl
    from rlt.data.models import quiet_libraries
    from rlt.run.runner import run_local
    from rlt.spec.loading import parse_run

    if traces is not None and arm in TEACHER_ARMS:
        raise ValueError(f"arm {arm!r}: a teacher arm trains on the training rows, no other traces")
    quiet_libraries()
    t0 = time.perf_counter()
    earlier = read_rows(pieces_file(out, arm, seed))
    heldout_file = out / "heldout.jsonl"
    write_jsonl(heldout_file, heldout_rows(s))  # every unit: deterministic, and never another settings' rows
    run = parse_run(run_spec(s, arm, seed, str(heldout_file.resolve())))
    layout = RunLayout.for_run(out, run.name)
    only = None
    if arm in ("raw", "friendly"):
        rows = training_rows(s) if traces is None else traces
        write_trace_dataset(layout.distill_dataset, rows if arm == "raw" else friendly_rows(rows))
        only = ["student", "evaluate"]
    convergence = layout.root / "convergence.json"
    with convergence_stop(s, convergence) if arm == "sft-convergence" else contextlib.nullcontext():
        summary = run_local(run, out, metrics_port=None, show_progress=False, only=only)
    report = json.loads((layout.eval_dir / REPORT_JSON).read_text())
    graded = list(read_jsonl(layout.eval_dir / PER_QUESTION_FILE))
    if report["questions"] != s.heldout or len(graded) != s.heldout:
        raise SystemExit(f"{layout.eval_dir}: {report['questions']} questions evaluated, {s.heldout} held out")
    row: dict[str, Any] = {
        "arm": arm,
        "seed": seed,
        "pass1": report["accuracy"],
        "correct": [int(q["accuracy"] > 0.5) for q in graded],
        "questions": report["questions"],
        "stage_seconds": {k: v.get("seconds") for k, v in summary.get("stages", {}).items()},
        "seconds": round(time.perf_counter() - t0 + sum(p["seconds"] for p in earlier), 1),
        "pieces": len(earlier) + 1,
        "settings": "protocol" if s == Settings() else "quick" if s == QUICK else "other",
        "device": device_name(),
        "ended": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    if arm in TEACHER_ARMS:
        explained = list(read_jsonl(layout.distill_dataset))
        row["explanations"] = {
            "mean_reward": statistics.fmean(r["reward"] for r in explained),
            "closed": statistics.fmean(float(r["closed"]) for r in explained),
            "states_solution": statistics.fmean(
                float(protocol.mentions(r["reasoning_trace"], r["solution"])) for r in explained
            ),
        }
    if convergence.exists():
        row["convergence"] = json.loads(convergence.read_text())
    return row


def device_name() -> str:
    """Where the unit ran (a pairing across machines would mix fp32 on CPU with bf16 on a GPU)."""
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


# ---- the runner: units in order, a deadline guard, rows appended as units end, resumable


def run_units(
    seeds: list[int],
    units_path: Path,
    run_unit: Callable[[str, int, float], dict | None],
    deadline: float,
    first: dict[str, float],
    clock: Callable[[], float] = time.time,
    log: Callable[[str], None] = print,
) -> list[dict]:
    """Run the missing (seed, arm) units, seed by seed in ARMS order. run_unit(arm, seed, estimate) returns the
    unit's row, or None when it was stopped at the deadline. No unit starts that the longest of its arm's last
    three units (`first[arm]` before any ran) says cannot end by the deadline, except that a RESUMABLE arm starts
    with PIECE seconds left (a piece of it: the next run continues it)."""

    def budget(arm: str, rows: list[dict], left: float) -> tuple[float, float | None]:
        need = unit_estimate([r["seconds"] for r in rows if r["arm"] == arm], first[arm])
        piece = arm in RESUMABLE and left >= PIECE
        if need > left and not piece:
            return need, None
        return need, PIECE if piece and need > left else need

    def stopped_note(arm: str) -> str:
        return " (it continues from its last checkpoint next time)" if arm in RESUMABLE else ""

    units = [(arm, seed) for seed in seeds for arm in ARMS]  # no pass@1 in the log: the pilot is blind
    return run_missing_units(units, units_path, run_unit, deadline, budget, clock, log, stopped_note=stopped_note)


def unit_runner(out: Path, quick: bool, lock: str | None, deadline: float) -> Callable[[str, int, float], dict | None]:
    """Each unit is this script's --unit in a process group of its own (SIGTERM GRACE seconds before the deadline,
    killed whole at it), its output in out/unit-<arm>-seed<seed>.log; it leaves its row in
    out/unit-<arm>-seed<seed>.json, which the runner appends."""
    wanted = "quick" if quick else "protocol"

    def run(arm: str, seed: int, need: float) -> dict | None:
        result = out / f"unit-{arm}-seed{seed}.json"
        if result.exists():  # measured by an earlier, interrupted runner: not rerun
            row = dict(json.loads(result.read_text()))
            if row["settings"] != wanted:
                raise SystemExit(f"{result}: a {row['settings']} unit, this run is {wanted}: use another --out")
            return row
        with heavy_lock(lock, deadline - need) as held:
            if not held or time.time() + need > deadline:
                return None
            cmd = [sys.executable, "-u", __file__, "--out", str(out), "--unit", arm, "--seed", str(seed)]
            started = time.time()
            logfile = out / f"unit-{arm}-seed{seed}.log"
            print(f"[unit] seed {seed} {arm}: started, output in {logfile}", flush=True)
            status = run_until(cmd + (["--quick"] if quick else []), deadline, GRACE, logfile)
            if status is None:  # stopped: its seconds so far count when a later piece finishes it
                append_row(pieces_file(out, arm, seed), {"seconds": round(time.time() - started, 1)})
                return None
        if lock:
            time.sleep(COURTESY)
        if status:
            raise SystemExit(f"unit {arm} seed {seed} failed (exit {status}); see {out}/unit-{arm}-seed{seed}.log")
        return dict(json.loads(result.read_text()))

    return run


def pieces_file(out: Path, arm: str, seed: int) -> Path:
    """The seconds of a unit's pieces stopped at a deadline (a resumable unit's earlier runs)."""
    return out / f"unit-{arm}-seed{seed}.pieces.jsonl"


# ---- analysis


def pass_table(rows: list[dict], settings: str = "protocol") -> dict[int, dict[str, float]]:
    """seed -> arm -> pass@1 of the units run with `settings` (protocol: the --quick check's rows are left out)."""
    table: dict[int, dict[str, float]] = {}
    for r in rows:
        if r.get("settings", "protocol") == settings:
            table.setdefault(r["seed"], {})[r["arm"]] = r["pass1"]
    return table


def differences(table: dict[int, dict[str, float]], a: str, b: str) -> list[float]:
    """pass@1(a) − pass@1(b) of each seed that has both, in seed order."""
    return [t[a] - t[b] for _, t in sorted(table.items()) if a in t and b in t]


def rule(lo: float, hi: float) -> str:
    """The pre-registered reading of d's interval."""
    if lo > 0:
        return "PASS"
    if hi < MARGIN:
        return "FAIL"
    return "inconclusive"


def decide(d: list[float], fixed: int | None = SEEDS_FIXED) -> dict[str, Any]:
    """The verdict once the sized number of seeds is in (read on the first `fixed` seeds only); before that the
    interval is a description."""
    used = d[:fixed] if fixed is not None and len(d) >= fixed else d
    m, lo, hi = protocol.one_sample_interval(used)  # paired: d per seed against 0
    out: dict[str, Any] = {"seeds": len(used), "d": [m, lo, hi]}
    if fixed is None:
        out["verdict"] = f"not in ({len(d)} seeds; the seed count is fixed after the {len(PILOT)}-seed pilot)"
    elif len(d) < fixed:
        out["verdict"] = f"not in ({len(d)} of {fixed} seeds)"
    else:
        out["verdict"] = rule(lo, hi)  # `used` is the first `fixed` seeds here
    return out


def sizing(d: list[float]) -> dict[str, Any]:
    """Seeds needed from the pilot's spread of d alone (its mean is not read: a variance-only internal pilot)."""
    if len(d) < len(PILOT):
        raise ValueError(f"the pilot needs all {len(PILOT)} seeds with both primary arms (got {len(d)})")
    sd = statistics.stdev(d)
    raw = protocol.seeds_needed(sd, EFFECT, power=0.8, two_arms=False)
    return {"sd": sd, "seeds_needed": raw, "seeds": min(MAX_SEEDS, max(MIN_SEEDS, raw))}


def analyse(path: Path, plot: Path | None = None, settings: str = "protocol") -> dict[str, Any]:
    table = pass_table(read_rows(path), settings)
    if settings == "protocol" and SEEDS_FIXED is None:  # the pilot is blind: no arm's figure before the sizing
        print("| seed | " + " | ".join(ARMS) + " |")
        print("|---|" + "---|" * len(ARMS))
        for seed, t in sorted(table.items()):
            print(f"| {seed} | " + " | ".join("done" if a in t else "—" for a in ARMS) + " |")
        print("blind until the seed count is fixed: after the pilot seeds, --size prints it from d's spread alone")
        return {"seeds": len(differences(table, *PRIMARY)), "verdict": "not in (blind pilot)"}
    print("| seed | " + " | ".join(ARMS) + " | d = rl − sft-continued |")
    print("|---|" + "---|" * (len(ARMS) + 1))
    for seed, t in sorted(table.items()):
        cells = [f"{t[a]:.3f}" if a in t else "—" for a in ARMS]
        d = f"{t['rl'] - t['sft-continued']:+.3f}" if all(a in t for a in PRIMARY) else "—"
        print(f"| {seed} | {' | '.join(cells)} | {d} |")
    res = decide(differences(table, *PRIMARY))
    m, lo, hi = res["d"]
    print(f"primary d = rl − sft-continued: {m:+.3f} [{lo:+.3f}, {hi:+.3f}] (95 % paired t, {res['seeds']} seeds)")
    for a, b in SECONDARY:
        sm, slo, shi = protocol.one_sample_interval(differences(table, a, b))
        print(f"secondary {a} − {b}: {sm:+.3f} [{slo:+.3f}, {shi:+.3f}]")
    print(f"verdict (pre-registered rule, margin {MARGIN}): {res['verdict']}")
    if plot is not None and table:
        draw(table, res, plot)
        print(f"plot: {plot}")
    return res


def draw(table: dict[int, dict[str, float]], res: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4), gridspec_kw={"width_ratios": [3, 1]})
    for seed, t in sorted(table.items()):
        xs = [i for i, a in enumerate(ARMS) if a in t]
        left.plot(xs, [t[ARMS[i]] for i in xs], "o-", alpha=0.6, label=f"seed {seed}")
    left.set_xticks(range(len(ARMS)), ARMS)
    left.set_ylabel("held-out pass@1 of the distilled student")
    left.set_title("each seed across the arms (lines join one seed)", fontsize=10)
    left.grid(alpha=0.3)
    left.legend(fontsize=7, ncol=2)
    m, lo, hi = res["d"]
    d = differences(table, *PRIMARY)
    right.plot([0] * len(d), d, "o", alpha=0.5)
    if math.isfinite(lo):
        right.errorbar([0.3], [m], yerr=[[m - lo], [hi - m]], fmt="s", capsize=5, color="k")
    right.axhline(0, color="k", lw=0.8)
    right.axhline(MARGIN, color="grey", ls="--", lw=0.8)
    right.set_xticks([0, 0.3], ["seeds", "mean, 95 %"])
    right.set_title(f"d = rl − sft-continued\n{res['verdict']}", fontsize=9)
    right.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--out", default=DEFAULT_OUT, help="the units' run folders (--quick: OUT-quick unless given)")
    p.add_argument(
        "--units", type=Path, help=f"the finished units (default {UNITS_FILE.name}; --quick: OUT/units.jsonl)"
    )
    p.add_argument("--seeds", type=lambda v: [int(x) for x in v.split(",")], default=list(PILOT))
    p.add_argument("--deadline", help="HH:MM UTC: no unit runs past it")
    p.add_argument("--minutes", type=float, help="or: no unit runs past this many minutes from now")
    p.add_argument("--quick", action="store_true", help="the tiny model and sizes: checks that every arm runs")
    p.add_argument("--nice", type=int, default=19)
    p.add_argument("--lock", default="/tmp/rlt-heavy.lock", help="taken per unit; '' for none")
    p.add_argument("--analyse", action="store_true", help="print the table, d's interval and the verdict")
    p.add_argument("--plot", type=Path, help="with --analyse: draw the table and d here")
    p.add_argument("--size", action="store_true", help="after the pilot: the seeds needed, from d's spread only")
    p.add_argument("--unit", choices=ARMS, help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.units is None:  # --quick's rows never go to the committed file
        quick_out = args.out + ("-quick" if args.out == DEFAULT_OUT else "")
        args.units = Path(quick_out) / "units.jsonl" if args.quick else UNITS_FILE
    if args.analyse:
        analyse(args.units, args.plot, "quick" if args.quick else "protocol")
        return
    if args.size:
        table = pass_table(read_rows(args.units))
        pilot = {seed: t for seed, t in table.items() if seed in PILOT}
        res = sizing(differences(pilot, *PRIMARY))
        print(
            f"pilot seeds {list(PILOT)}: sd of d {res['sd']:.4f}; seeds_needed(sd, effect {EFFECT}, power 0.8, "
            f"paired) = {res['seeds_needed']} -> {res['seeds']} seeds (kept within {MIN_SEEDS}..{MAX_SEEDS})"
        )
        return
    s = QUICK if args.quick else Settings()
    out = Path(args.out)
    if args.quick and out == Path(DEFAULT_OUT):
        out = Path(DEFAULT_OUT + "-quick")  # never the protocol's folder: its units would be taken as measured
    if args.unit:
        row = unit(s, out, args.unit, args.seed)
        (out / f"unit-{args.unit}-seed{args.seed}.json").write_text(json.dumps(row))
        return
    end = deadline_ts(args.deadline, args.minutes, dt.datetime.now(dt.UTC))
    os.nice(max(0, args.nice - os.nice(0)))
    stop_on_sigterm()
    out.mkdir(parents=True, exist_ok=True)
    print(f"settings: {json.dumps(asdict(s))}", flush=True)
    first = {a: v / (60 if args.quick else 1) for a, v in FIRST_ESTIMATE.items()}
    run_units(args.seeds, args.units, unit_runner(out, args.quick, args.lock or None, end), end, first)
    analyse(args.units, None, "quick" if args.quick else "protocol")


if __name__ == "__main__":
    main()
