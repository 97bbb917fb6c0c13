"""`rlt compare FILE`: the paper's core claim at small scale — does the RL teacher teach better?

With the same taught questions and the same student budget, three students are distilled: from the RL
teacher's explanations, from the SFT-only teacher's explanations and from the dataset's own reasoning
traces. They and the untrained student are evaluated on the same held-out questions. Then, for every
explanation a teacher wrote, its RLT reward is set against the student's improvement on the question it
taught (definitions in docs/evaluation.md). Every number of the report is read from a stage's output.

Layout under OUTPUT/<run>/compare/ (RunLayout.compare_dir, .compare_arm): rl_teacher/ (sft, rl, distill,
student, eval, eval-taught), sft_teacher/ (sft → ../rl_teacher/sft, distill, ...), dataset_traces/, untrained/,
and report.{json,md}, accuracy.png, correlation.png. A re-run follows `rlt run`'s rules (spec/fingerprint.py): a
stage done under the same spec is skipped, one whose input was redone is done again, one finished under other
run-wide or own settings (e.g. another spec.dataset.evalFraction) is refused in one line before anything trains; an
evaluation is reused only for the same model output, questions and settings (compare-key.json beside its report).

The steps: run the arms' stages and evaluations (`Compare`), then, from typed records, the pure report
(rlt.run.compare_report: `teaching_points`, `correlations`, `build_report`), then the files (`write_compare`).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlt.contract.layout import (
    COMPARE_KEY_FILE,
    REPLACED_DIR,
    REPORT_JSON,
    REPORT_MD,
    STAMP_FORMAT,
    RunLayout,
    atomic_write_json,
    atomic_write_text,
    format_time,
)
from rlt.contract.method_registry import method_info
from rlt.contract.stage_registry import (
    method_stages,
    producer_of,
    stage_function,
    stage_info,
    stages_before,
)
from rlt.data.dataset import load_data
from rlt.data.errors import DataError
from rlt.data.eval_set import EvalSet, evaluation_set, resolve_answer_type
from rlt.data.jsonl import read_jsonl, write_jsonl
from rlt.run.compare_render import TEACHER_ARMS, UNTRAINED, render_markdown
from rlt.run.compare_report import (
    ARMS,
    ArmResult,
    Point,
    build_report,
    correlations,
    pearson,
    teaching_points,
    wilson_interval,
    write_compare,
)
from rlt.run.lock import lock_run_folder
from rlt.spec import fingerprint
from rlt.spec.inputs import ModelRef
from rlt.spec.loading import SpecError, parse_run
from rlt.spec.run import RLTRun
from rlt.spec.stages import reward_settings, student_temperature, trained_student
from rlt.stages.context import StageContext
from rlt.stages.evaluate import EvalReport, evaluate_model, read_report, read_results

# the report's parts, named here as well for the callers of `rlt compare`
__all__ = [
    "ARMS",
    "ArmResult",
    "Compare",
    "Point",
    "arm_stages",
    "build_report",
    "compare_stages",
    "correlations",
    "pearson",
    "run_compare",
    "teaching_points",
    "wilson_interval",
]

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from rlt.contract.metrics import TrainerMetrics


def arm_stages(method: str, enabled: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """The stages behind each arm's student, all enabled in the arm's spec (a stage's fingerprint covers every earlier
    enabled stage, so a student distilled from a teacher that was trained again is never reused), from the stage
    table's roles: the RL teacher's arm runs every stage of the method before its student (sft → rl → distill, and
    any stage added between them); the SFT-only teacher's drops the teacher stages after the first; the dataset's
    traces stand in for the first dataset stage's product, read by the student directly. `enabled`: the stages the
    file enables once compare's defaults are filled in (compare_stages)."""
    own = [s for s in method_stages(method) if s in enabled]
    student = producer_of("student", own)
    if student is None:
        raise ValueError(f"rlt compare: method {method} has no stage producing a student")
    chain = (*(s for s in stages_before(student) if s in own), student)
    teachers = [s for s in chain if stage_info(s).produces == "teacher"]
    datasets = [s for s in chain if stage_info(s).produces == "dataset"]
    if not teachers or not datasets:
        raise ValueError(f"rlt compare: method {method} has no teacher or dataset stage before {student}")
    return {
        "rl_teacher": chain,
        "sft_teacher": tuple(s for s in chain if s not in teachers[1:]),
        "dataset_traces": (datasets[0], student),
    }


# Used when the file leaves the student / evaluate stage disabled (documented in docs/evaluation.md):
# a small budget that a 135M student on a 2-core CPU finishes in minutes.
DEFAULT_STUDENT = {
    "enabled": True,
    "epochs": 2,
    "batchSize": 4,
    "perDeviceBatchSize": 4,
    "learningRate": 5.0e-5,
    "lrScheduler": "constant",
    "warmupRatio": 0.0,
    "maxLength": 512,
    "overLong": "best_fit",
    "gradientCheckpointing": False,
}
DEFAULT_EVALUATE = {
    "enabled": True,
    "samples": 2,
    "temperature": 0.7,
    "maxNewTokens": 128,
    "limit": 16,
    "batchSize": 16,
}


def derive(run: RLTRun, stages: dict[str, Any]) -> RLTRun:
    """A copy of the run whose stages are replaced by `stages` (camelCase, validated like the file)."""
    doc = run.model_dump(mode="json", by_alias=True, exclude_none=True)
    doc.pop("status", None)
    doc["spec"]["stages"] = stages
    return parse_run(doc, f"{run.name} (compare)")


def compare_stages(run: RLTRun) -> dict[str, Any]:
    """The file's stages, with the compare defaults for a disabled student or evaluate stage."""
    st = run.spec.stages
    if not method_info(run.spec.method).comparable:
        raise SpecError(
            run.name, [f"spec.method: {run.spec.method!r} cannot be compared (compare distils RLT teachers)"]
        )
    if not (st.sft.enabled and st.rl.enabled):
        off = [name for name, on in (("sft", st.sft.enabled), ("rl", st.rl.enabled)) if not on]
        raise SpecError(
            run.name,
            [f"spec.stages.{s}.enabled: false; rlt compare needs stages sft and rl (its two teachers)" for s in off],
        )
    out = run.spec.stages.model_dump(mode="json", by_alias=True, exclude_none=True)
    out["distill"]["enabled"] = True
    if not st.student.enabled:
        out["student"] = dict(DEFAULT_STUDENT)
    if not st.evaluate.enabled:
        out["evaluate"] = {
            **DEFAULT_EVALUATE,
            **({"dataset": out["evaluate"]["dataset"]} if "dataset" in out["evaluate"] else {}),
        }
    return out


def with_enabled(stages: dict[str, Any], enabled: Sequence[str]) -> dict[str, Any]:
    return {k: {**v, "enabled": k in enabled} for k, v in stages.items()}


# --------------------------------------------------------------------------- running the arms


class Compare:
    def __init__(
        self,
        run: RLTRun,
        output: str | Path,
        device: str | None,
        show_progress: bool,
        metrics: TrainerMetrics | None = None,
    ) -> None:
        self.stages = compare_stages(run)
        enabled = [name for name, settings in self.stages.items() if settings.get("enabled")]
        self.arm_stages = arm_stages(run.spec.method, enabled)
        # the student stage, the teacher stage both teacher arms share, the stage the dataset's traces stand in for
        self.student_stage = self.arm_stages["rl_teacher"][-1]
        self.shared_teacher = self.arm_stages["sft_teacher"][0]
        self.traces_stage = self.arm_stages["dataset_traces"][0]
        self.run = derive(run, with_enabled(self.stages, enabled))
        self.run_layout = RunLayout.for_run(output, run.name)
        self.root = self.run_layout.compare_dir
        self.device, self.show_progress, self.metrics = device, show_progress, metrics
        # the run's device and prompt format, resolved once for the steps outside a stage
        self.base = StageContext(self.run, self.layout(UNTRAINED), metrics, device, show_progress)

    def layout(self, arm: str) -> RunLayout:
        return self.run_layout.compare_arm(arm)

    def ctx(self, arm: str, enabled: Sequence[str]) -> StageContext:
        run = derive(self.run, with_enabled(self.stages, enabled))
        return StageContext(run, self.layout(arm), self.metrics, self.device, self.show_progress)

    def plan(self, arm: str, names: Sequence[str]) -> list[fingerprint.StagePlan]:
        """`rlt run`'s decisions for stages of an arm; StaleStageError when one finished under another spec."""
        ctx = self.ctx(arm, self.arm_stages[arm])
        return fingerprint.plan_stages(
            ctx.layout,
            ctx.spec,
            list(names),
            has_checkpoint=ctx.layout.has_complete_checkpoint,
            restart_hint=f"use a new --output-dir folder, or move {self.root} aside to compare from scratch",
        )

    def check_finished_stages(self) -> None:
        """Before anything trains: every finished stage of every arm must be reusable under this spec."""
        for arm, names in self.arm_stages.items():
            # the shared teacher stage is the RL teacher's
            self.plan(arm, [n for n in names if not (arm == "sft_teacher" and n == self.shared_teacher)])

    def stage(self, arm: str, name: str) -> None:
        [plan] = self.plan(arm, [name])
        ctx = self.ctx(arm, self.arm_stages[arm])
        if plan.action == "skip":
            print(f"[compare] {arm}/{name}: done before, skipped", flush=True)
            return
        if plan.action == "start_over":
            print(f"[compare] {arm}/{name}: {plan.note}; moved to {fingerprint.start_over(ctx.layout, name)}")
        elif plan.action == "continue":
            fingerprint.reopen(ctx.layout, name)
            print(f"[compare] {arm}/{name}: {plan.note}", flush=True)
        print(f"[compare] {arm}/{name}: starting", flush=True)
        t0 = time.perf_counter()
        stage_function(name, self.run.spec.method)(ctx)
        print(f"[compare] {arm}/{name}: done in {time.perf_counter() - t0:.0f} s", flush=True)

    # ---- the three distillation sets
    def distilled(self, arm: str) -> Path:
        """The dataset the arm's student trains on (the stage table's one lookup, as the student stage does)."""
        return self.layout(arm).input_of(self.student_stage, "dataset", self.arm_stages[arm])

    def teachers(self) -> None:
        for name in self.arm_stages["rl_teacher"][:-1]:
            self.stage("rl_teacher", name)
        shared = self.shared_teacher
        link = self.layout("sft_teacher").stage_dir(shared)
        if not link.exists():  # the SFT-only teacher is the RL teacher's starting point, not a second SFT run
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(os.path.relpath(self.layout("rl_teacher").stage_dir(shared), link.parent))
        for name in self.arm_stages["sft_teacher"][1:-1]:
            self.stage("sft_teacher", name)

    def dataset_traces(self) -> None:
        """The dataset's own traces for exactly the questions the teachers explained."""
        layout = self.layout("dataset_traces")
        stage = self.traces_stage
        if self.plan("dataset_traces", [stage])[0].action == "skip":
            return
        formatter = self.base.formatter
        taught = read_jsonl(self.distilled("rl_teacher"))
        by_row = {r["row"]: r for r in load_data(self.run.spec.dataset, formatter.fmt).train}
        rows = []
        for t in taught:
            src = by_row.get(t["source_row"])
            if src is None or src["question"] != t["question"]:
                raise DataError(f"compare: dataset row {t['source_row']} is not the question the teacher explained")
            if not src.get("reasoning_trace"):
                raise DataError(
                    f"compare: dataset row {t['source_row']} has no reasoning_trace for the dataset arm "
                    "(map spec.dataset.columns.reasoningTrace)"
                )
            rows.append(
                {
                    "question": src["question"],
                    "reasoning_trace": src["reasoning_trace"],
                    "solution": src["solution"],
                    "reward": None,
                    "closed": True,
                    "source_row": src["row"],
                    "messages": formatter.student_messages(src["question"], src["reasoning_trace"], src["solution"]),
                }
            )
        write_jsonl(layout.product(stage), rows)
        fingerprint.record(layout, self.ctx("dataset_traces", self.arm_stages["dataset_traces"]).spec, stage)
        atomic_write_text(layout.stage_done(stage), "dataset traces\n")

    def check_same_questions(self) -> list[dict[str, Any]]:
        sets = {arm: read_jsonl(self.distilled(arm)) for arm in ARMS}
        keys = {arm: [(r["source_row"], r["question"]) for r in rows] for arm, rows in sets.items()}
        first = keys["rl_teacher"]
        for arm, k in keys.items():
            if k != first:
                raise RuntimeError(f"compare: arm {arm} was distilled on other questions than rl_teacher")
        return sets["rl_teacher"]

    # ---- evaluation
    def eval_set(self) -> EvalSet:
        # the evaluate stage's rows (rlt.data.eval_set): the door has refused a spec without any
        return evaluation_set(self.run.spec, self.base.formatter.fmt)

    def eval_key(self, arm: str, ref: ModelRef, evalset: EvalSet) -> dict[str, Any]:
        """What an evaluation's numbers depend on: the model (and the student stage that wrote it), the questions,
        the evaluate settings."""
        student = None if arm == UNTRAINED else fingerprint.recorded_fields(self.layout(arm), self.student_stage)
        return {
            "model": ref.model_dump(mode="json", by_alias=True, exclude_none=True),
            "studentStage": fingerprint.fingerprint_of(student) if student is not None else None,
            "questions": fingerprint.fingerprint_of([[r.get("row"), r["question"]] for r in evalset.rows]),
            "evaluate": self.run.spec.stages.evaluate.model_dump(mode="json", by_alias=True, exclude_none=True),
        }

    def evaluate(self, arm: str, ref: ModelRef, evalset: EvalSet, out: Path) -> EvalReport:
        """The arm's report on `evalset` in `out`: read when an earlier run wrote it for the same key, else
        evaluated now (an outdated report moves aside)."""
        key = self.eval_key(arm, ref, evalset)
        if (out / REPORT_JSON).exists():
            old = json.loads((out / COMPARE_KEY_FILE).read_text()) if (out / COMPARE_KEY_FILE).exists() else key
            if old == key:
                return read_report(out)
            dest = out.parent / REPLACED_DIR / f"{out.name}-{format_time(fmt=STAMP_FORMAT)}"
            dest.parent.mkdir(parents=True, exist_ok=True)
            out.rename(dest)
            print(f"[compare] {arm}: {out.name} was evaluated for another model or settings; moved to {dest}")
        report = evaluate_model(self.ctx(arm, ("evaluate",)), ref, arm, evalset, out)
        if report is None:
            raise RuntimeError("rlt compare runs in one process; evaluate_model returned no report")
        atomic_write_json(out / COMPARE_KEY_FILE, key)
        return report

    def student_model(self, arm: str) -> ModelRef:
        base = trained_student(self.run.spec)
        return base.model_copy(update={"model": str(self.layout(arm).product(self.student_stage)), "revision": None})

    def logprob_gains(
        self,
        rows: list[dict[str, Any]],
        before: PreTrainedModel,
        after: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
    ) -> list[float]:
        """Per row: mean tempered log-prob of the solution given question + explanation, after minus before."""
        from rlt.method.scoring import ScoreRequest, SpanScorer

        spec = self.run.spec
        temperature = student_temperature(spec)
        requests = []
        for r in rows:
            text, _, s_span = self.base.formatter.student_chat(
                tokenizer, r["question"], r["reasoning_trace"], r["solution"]
            )
            requests.append(ScoreRequest(text, [s_span], group=r["question"]))
        means = []
        for model in (before, after):
            scorer = SpanScorer(model, tokenizer, temperature, reward_settings(spec).batch_size, True)
            means.append([float(sc[0].logprobs.mean()) for sc in scorer.score(requests)])
        return [a - b for b, a in zip(*means, strict=True)]

    def run_all(self) -> dict[str, Any]:
        from rlt.data.models import load_model, load_tokenizer

        started = time.perf_counter()
        # Refusals first: held-out questions must exist and no finished stage may come from another spec.
        evalset = self.eval_set()
        self.check_finished_stages()
        self.teachers()
        self.dataset_traces()
        taught = self.check_same_questions()
        for arm in ARMS:
            self.stage(arm, self.student_stage)

        base_ref = trained_student(self.run.spec)
        taught_set = EvalSet(
            [{"question": r["question"], "solution": r["solution"], "row": r["source_row"]} for r in taught],
            resolve_answer_type("auto", self.run.spec.dataset.source),
            "taught questions",
        )
        base_layout = self.layout(UNTRAINED)
        untrained = (
            self.evaluate(UNTRAINED, base_ref, evalset, base_layout.eval_dir),
            self.evaluate(UNTRAINED, base_ref, taught_set, base_layout.taught_eval_dir),
            base_layout,
        )
        arms = []
        for arm in ARMS:
            layout = self.layout(arm)
            arms.append(
                ArmResult(
                    arm,
                    read_jsonl(self.distilled(arm)),
                    json.loads(layout.student_dataset_report.read_text())["counts"],
                    self.evaluate(arm, self.student_model(arm), evalset, layout.eval_dir),
                    self.evaluate(arm, self.student_model(arm), taught_set, layout.taught_eval_dir),
                    layout,
                    Path(self.student_model(arm).model),
                )
            )

        # per explanation: reward vs the student's improvement on the question it taught
        device = self.base.compute_device
        tokenizer = load_tokenizer(base_ref, padding_side="right")
        before_model = load_model(base_ref, device)
        taught_before = per_question_accuracy(base_layout.taught_eval_dir)
        points: list[Point] = []
        for a in arms:
            if a.name not in TEACHER_ARMS:
                continue
            after_model = load_model(self.student_model(a.name), device)
            gains = self.logprob_gains(a.distill_rows, before_model, after_model, tokenizer)
            del after_model
            taught_after = per_question_accuracy(a.layout.taught_eval_dir)
            points += teaching_points(a.name, a.distill_rows, taught_after, taught_before, gains)
        report = build_report(self.run, taught, evalset, untrained, arms, points, time.perf_counter() - started)
        write_compare(self.root, report)
        return report


def per_question_accuracy(eval_dir: Path) -> dict[int, float]:
    return {q.row: q.accuracy for q in read_results(eval_dir)}


def run_compare(
    run: RLTRun,
    output: str | Path = "results",
    device: str | None = None,
    show_progress: bool = True,
    metrics_port: int | None = None,
) -> dict[str, Any]:
    from rlt.contract.metrics import TrainerMetrics
    from rlt.data.models import quiet_libraries
    from rlt.run.runner import serve_metrics

    compare_stages(run)  # a run it cannot compare is refused before a port or the run's folder is taken
    quiet_libraries()
    metrics = TrainerMetrics(run.name, namespace=run.metadata.namespace or "local", method=run.spec.method)
    if metrics_port is not None:
        # a taken port is a one-line MetricsPortError, as for `rlt run` with --metrics-port
        print(f"metrics: http://127.0.0.1:{serve_metrics(metrics, metrics_port, fallback=False)}/metrics", flush=True)
    lock = lock_run_folder(RunLayout.for_run(output, run.name).root, "rlt compare")  # one command per run folder
    try:
        cmp = Compare(run, output, device, show_progress, metrics)
        report = cmp.run_all()
    finally:
        metrics.shutdown()
        lock.release()
    print("\n" + render_markdown(report), flush=True)
    print(f"report: {cmp.root / REPORT_MD}", flush=True)
    return report
