"""The catalogue of every metric rlt exports: one source for the exporters, the docs and the dashboards.

All are `rlt_*`, except the operator's reconcile and API-client series, which carry controller-runtime's and
client-go's names (CONTROLLER_RUNTIME_NAMES) so dashboards and alerts made for Go operators read them as they are.

Base units, `_total` counters, bounded labels only (namespace, run, stage, method, plus the small
fixed `component` / `phase` sets below). `docs/metrics.md` is generated from this table and a test
keeps them equal.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from rlt.contract.api import Phase
from rlt.contract.env import METRICS_PORT

RUN_LABELS = ("namespace", "run", "stage", "method")

# Bounded label values.
REWARD_COMPONENTS = (
    "r_ss",  # mean + α·min of the student's solution log-probs
    "r_kl",  # mean + α·max of Δ = teacher − student log-prob over the explanation
    "format_penalty",  # mean penalty for unclosed explanations
    "solution_logprob_mean",
    "solution_logprob_min",
    "kl_mean",
    "kl_max",
    "kl_teacher_logprob",  # kl_mean = kl_teacher_logprob + kl_student_ce: the teacher's own mean log-prob of E
    "kl_student_ce",  # the student's mean cross-entropy on E (the style-mismatch share of r_KL)
)
STEP_PHASES = ("generate", "score", "update", "weight_sync")
# What rlt_rank_imbalance_ratio compares across the ranks' micro-steps (rlt.stages.balance): the update's (rl, sft,
# student) and, `passes_`, rl's reference and old-policy forwards.
IMBALANCE_MEASURES = ("tokens", "seconds", "passes_tokens", "passes_seconds")
# What an evaluation measured: the run's student, an explicit model, the untrained student, or a `rlt compare` arm.
EVAL_MODELS = ("student", "custom", "baseline", "untrained", "rl_teacher", "sft_teacher", "dataset_traces")
# The names other modules use (the stage record, evaluate, distill, the operator's handlers and progress reads): they
# take them from here, never retype them (tests/unit/test_metrics_catalogue.py greps for literals).
STEP = "rlt_step"
TOTAL_STEPS = "rlt_total_steps"
REWARD_MEAN = "rlt_reward_mean"
GENERATED_TOKENS = "rlt_generated_tokens_total"
CHECKPOINT_STEP = "rlt_checkpoint_step"
CHECKPOINT_TIME = "rlt_checkpoint_timestamp_seconds"
DISTILL_ROWS = "rlt_distill_rows_total"
STAGE_COMPLETED = "rlt_stage_completed"
EVAL_ACCURACY = "rlt_eval_accuracy"
EVAL_QUESTIONS = "rlt_eval_questions_total"
EVAL_ANSWERS = "rlt_eval_answers_total"
# controller-runtime's reconcile series (sigs.k8s.io/controller-runtime/pkg/internal/controller/metrics) and
# client-go's request counter (k8s.io/client-go/tools/metrics, as controller-runtime registers it), same labels.
RECONCILES = "controller_runtime_reconcile_total"
RECONCILE_ERRORS = "controller_runtime_reconcile_errors_total"
RECONCILE_SECONDS = "controller_runtime_reconcile_time_seconds"
REST_CLIENT_REQUESTS = "rest_client_requests_total"
CONTROLLER_RUNTIME_NAMES = (RECONCILES, RECONCILE_ERRORS, RECONCILE_SECONDS, REST_CLIENT_REQUESTS)
CONTROLLER = "rltrun"  # the `controller` label's value: the one controller of this operator
# controller-runtime's `result` values: an error, done, or done and due again after a delay (RequeueAfter).
RECONCILE_RESULTS = ("success", "error", "requeue_after")
CHILD_REFUSALS = "rlt_operator_child_refusals_total"
RUN_PHASE = "rlt_run_phase"
RUN_INFO = "rlt_run_info"
RUN_RESTARTS = "rlt_run_restarts"
RUN_STEP = "rlt_run_step"
RUN_CONDITION = "rlt_run_condition"
RUN_LAST_RECONCILE = "rlt_run_last_reconcile_timestamp_seconds"
RUN_STEP_TIME = "rlt_run_step_timestamp_seconds"
OPERATOR_ACTIVE = "rlt_operator_active"
OPERATOR_BUILD_INFO = "rlt_operator_build_info"
RANK_IMBALANCE = "rlt_rank_imbalance_ratio"
# metrics.jsonl key -> rlt_rcl_* gauge (written by the rcl stages, exported by the Recorder)
RCL_GAUGES = {
    "rcl_apg": "rlt_rcl_apg",
    "rcl_ndr": "rlt_rcl_ndr",
    "rcl_tes": "rlt_rcl_tes",
    "rcl_acc_with": "rlt_rcl_accuracy_with_guidance",
    "rcl_acc_without": "rlt_rcl_accuracy_without_guidance",
    "rcl_teaching_tokens": "rlt_rcl_teaching_tokens",
    "rcl_format_ok": "rlt_rcl_guidance_wellformed_ratio",
    "rcl_leak_rate": "rlt_rcl_answer_leak_ratio",
    "rcl_ndr_samples": "rlt_rcl_ndr_samples",
}
# metrics.jsonl key -> rlt_* gauge of the rl stage's step record (exported by the Recorder)
RL_GAUGES = {
    "pairing_coverage": "rlt_reward_pairing_coverage",
    "importance_sampling_clipped": "rlt_importance_sampling_clipped_ratio",
}
# The one list of names for a stage's per-step figures: metrics.jsonl key -> (metric, value of its extra label).
# The Recorder exports these to Prometheus and logs them to experiment tracking as `metric` or `metric/label`.
STEP_KEYS: dict[str, tuple[str, str | None]] = {
    "reward": (REWARD_MEAN, None),
    "reward_std": ("rlt_reward_std", None),
    "kl": ("rlt_policy_kl", None),
    "loss": ("rlt_loss", None),
    **{c: ("rlt_reward_component", c) for c in REWARD_COMPONENTS},
    **{f"seconds_{p}": ("rlt_step_phase_seconds", p) for p in STEP_PHASES},
    "step_seconds": ("rlt_step_seconds", None),
    "generated_tokens": (GENERATED_TOKENS, None),
    "scored_tokens": ("rlt_scored_tokens_total", None),
    **{k: (v, None) for k, v in (RCL_GAUGES | RL_GAUGES).items()},
    **{f"rank_imbalance_{m}": (RANK_IMBALANCE, m) for m in IMBALANCE_MEASURES},
    "accuracy": (EVAL_ACCURACY, "model"),  # label value: the evaluated model (set per stage)
}
# What the operator reads back from rank 0's /metrics for status.progress: metric -> status.progress field
# (operator/rlt_operator/status/progress.py). Every name is a TRAINER_METRICS entry (checked where METRIC_DEFS is built).
PROGRESS_FIELDS = {
    STEP: "step",
    TOTAL_STEPS: "totalSteps",
    REWARD_MEAN: "rewardMean",
    CHECKPOINT_STEP: "checkpointStep",
    GENERATED_TOKENS: "generatedTokens",
}
STEP_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 2500)


@dataclass(frozen=True)
class MetricDef:
    name: str
    kind: str  # gauge | counter | histogram
    help: str
    labels: tuple[str, ...] = RUN_LABELS
    source: str = "trainer"  # trainer | operator
    # (label, its values) for a label with a bounded set of values beyond the run's (which rules and panels may name)
    bounded: tuple[tuple[str, tuple[str, ...]], ...] = ()


def per_value(name: str, kind: str, what: str, label: str, values: tuple[str, ...]) -> MetricDef:
    """A trainer metric with one label beyond the run's; its help names the label's values."""
    return MetricDef(
        name, kind, f"{what} ({label}: {', '.join(values)}).", RUN_LABELS + (label,), bounded=((label, values),)
    )


TRAINER_METRICS: tuple[MetricDef, ...] = (
    MetricDef(STEP, "gauge", "Current optimizer step of the stage."),
    MetricDef(TOTAL_STEPS, "gauge", "Planned optimizer steps of the stage."),
    MetricDef(REWARD_MEAN, "gauge", "Mean total reward R of the last step's completions."),
    MetricDef("rlt_reward_std", "gauge", "Standard deviation of R over the last step's completions."),
    per_value(
        "rlt_reward_component",
        "gauge",
        "Mean of one reward component over the last step",
        "component",
        REWARD_COMPONENTS,
    ),
    MetricDef(
        "rlt_reward_pairing_coverage",
        "gauge",
        "Share of the last step's explanation tokens (teacher's and student's) that got a teacher/student pair "
        "in r_KL (docs/reward.md).",
    ),
    MetricDef(
        "rlt_importance_sampling_clipped_ratio",
        "gauge",
        "Share of the last step's sequences (or tokens) whose vLLM importance ratio was masked or clipped; only "
        "when stages.rl.generation.importanceSampling is on.",
    ),
    MetricDef("rlt_policy_kl", "gauge", "GRPO KL of the policy to its reference at the last step."),
    MetricDef("rlt_loss", "gauge", "Training loss at the last logged step."),
    MetricDef(GENERATED_TOKENS, "counter", "Completion tokens generated by the teacher."),
    MetricDef("rlt_scored_tokens_total", "counter", "Tokens scored by the student (explanation + solution)."),
    per_value(
        "rlt_step_phase_seconds", "histogram", "Seconds spent per optimizer step in each phase", "phase", STEP_PHASES
    ),
    MetricDef("rlt_step_seconds", "histogram", "Wall seconds per optimizer step."),
    per_value(
        RANK_IMBALANCE,
        "gauge",
        "How much longer the last step's micro-steps lasted than if every rank had the same work: the sum over "
        "micro-steps of the largest rank's figure over the sum of the ranks' mean (1 = balanced; rl, sft and student "
        "stages, several ranks). tokens: the tokens each rank's model computed in the update; seconds: each rank's "
        "own micro-step time, near 1 under ZeRO-3, whose per-layer gathers put the wait for the slowest rank inside "
        "every rank's time; passes_tokens, passes_seconds: the same for rl's reference and old-policy forwards",
        "measure",
        IMBALANCE_MEASURES,
    ),
    MetricDef(CHECKPOINT_STEP, "gauge", "Step of the last checkpoint written."),
    MetricDef(CHECKPOINT_TIME, "gauge", "Unix time of the last checkpoint written."),
    MetricDef(DISTILL_ROWS, "counter", "Rows written to the distillation dataset."),
    MetricDef(STAGE_COMPLETED, "gauge", "1 once the stage has finished, else 0."),
    # method rcl (docs/rcl.md): per rl step over the step's questions, and once per evaluate stage
    *(
        MetricDef(f"rlt_rcl_{key}", "gauge", text)
        for key, text in (
            ("apg", "RCL adaptive performance gain: mean over questions of student accuracy with − without guidance."),
            ("ndr", "RCL non-degradation rate: 1 − share of questions right without guidance and wrong with it."),
            (
                "ndr_samples",
                "RCL non-degradation rate per guidance sample: 1 − share of guidance samples after which the "
                "student did worse than alone (any drop counts); stricter than rlt_rcl_ndr, which the target is defined on.",
            ),
            ("tes", "RCL teaching efficiency: APG per 100 teaching (guidance) tokens."),
            ("accuracy_with_guidance", "RCL mean student accuracy with the teacher's guidance (0–1)."),
            ("accuracy_without_guidance", "RCL mean student accuracy without guidance, the shared baseline (0–1)."),
            ("teaching_tokens", "RCL mean guidance length in teacher tokens."),
            ("guidance_wellformed_ratio", "RCL share of teacher outputs with closed guidance tags."),
            ("answer_leak_ratio", "RCL share of guidances that state the reference answer."),
        )
    ),
    per_value(
        EVAL_ACCURACY,
        "gauge",
        "Evaluation pass@1 (mean over questions of the share of correct answers) so far",
        "model",
        EVAL_MODELS,
    ),
    MetricDef(EVAL_QUESTIONS, "counter", "Questions evaluated, per evaluated model.", RUN_LABELS + ("model",)),
    MetricDef(
        EVAL_ANSWERS,
        "counter",
        "Answers generated and graded (questions × samples), per evaluated model.",
        RUN_LABELS + ("model",),
    ),
)

OPERATOR_LABELS = ("namespace", "run")
OPERATOR_METRICS: tuple[MetricDef, ...] = (
    MetricDef(
        RECONCILES,
        "counter",
        f"Reconciles of RLTRuns by result (controller: {CONTROLLER}; result: {', '.join(RECONCILE_RESULTS)}), "
        "as controller-runtime counts them.",
        ("controller", "result"),
        "operator",
        bounded=(("controller", (CONTROLLER,)), ("result", RECONCILE_RESULTS)),
    ),
    MetricDef(
        RECONCILE_ERRORS,
        "counter",
        "Reconciles that failed (an API error or a bug; the loop retries), as controller-runtime counts them.",
        ("controller",),
        "operator",
        bounded=(("controller", (CONTROLLER,)),),
    ),
    MetricDef(
        RECONCILE_SECONDS,
        "histogram",
        "Seconds per reconcile.",
        ("controller",),
        "operator",
        bounded=(("controller", (CONTROLLER,)),),
    ),
    MetricDef(
        REST_CLIENT_REQUESTS,
        "counter",
        "Requests to the API server by HTTP status (code; <error>: no answer), method and host: Kopf's (watches, "
        "finalizers, Events of its own) and the operator's client's, as client-go counts them.",
        ("code", "method", "host"),
        "operator",
    ),
    MetricDef(
        CHILD_REFUSALS,
        "counter",
        "Writes of a run's child the API server refused (kind: Job, ConfigMap, ...; verb: create, patch, delete; "
        "reason: the Status reason, e.g. Forbidden, Invalid): a quota, an admission webhook, RBAC.",
        ("kind", "verb", "reason"),
        "operator",
    ),
    MetricDef(
        RUN_PHASE,
        "gauge",
        f"1 for the run's current phase (phase: {', '.join(Phase)}), else 0.",
        OPERATOR_LABELS + ("phase",),
        "operator",
        bounded=(("phase", tuple(Phase)),),
    ),
    MetricDef(
        RUN_INFO,
        "gauge",
        "Always 1; labels carry the run's method and current stage.",
        OPERATOR_LABELS + ("method", "stage"),
        "operator",
    ),
    MetricDef(RUN_RESTARTS, "gauge", "Gang restarts of the run (status.restarts).", OPERATOR_LABELS, "operator"),
    MetricDef(RUN_STEP, "gauge", "status.progress.step as seen by the operator.", OPERATOR_LABELS, "operator"),
    MetricDef(
        RUN_STEP_TIME,
        "gauge",
        "Unix time the run's step last changed (status.progress.stepTime, kept across operator restarts; else when "
        "the operator saw its stage or step change, or first saw it): how long the run has made no progress (alert "
        "RLTRunStalled).",
        OPERATOR_LABELS,
        "operator",
    ),
    MetricDef(
        RUN_CONDITION,
        "gauge",
        "1 per condition of the run's status, labelled with its status and reason (one series per condition type).",
        OPERATOR_LABELS + ("type", "status", "reason"),
        "operator",
    ),
    MetricDef(
        RUN_LAST_RECONCILE,
        "gauge",
        "Unix time of the run's last successful reconcile (0: seen but never reconciled, so it has no status).",
        OPERATOR_LABELS,
        "operator",
    ),
    MetricDef(
        OPERATOR_ACTIVE,
        "gauge",
        "1 on the replica that works, 0 on a paused standby (or any replica whose peering object is missing).",
        (),
        "operator",
    ),
    MetricDef(
        OPERATOR_BUILD_INFO,
        "gauge",
        "Always 1; labels carry the replica's rlt version and its Kopf's (which version each replica runs, e.g. "
        "during a rolling upgrade).",
        ("version", "kopf_version"),
        "operator",
    ),
)

ALL_METRICS = TRAINER_METRICS + OPERATOR_METRICS
METRIC_DEFS = {d.name: d for d in ALL_METRICS}
_unknown = [m for m in PROGRESS_FIELDS if m not in METRIC_DEFS]
if _unknown:  # a renamed metric must not leave the operator reading a name nobody exports
    raise RuntimeError(f"PROGRESS_FIELDS names metrics that are not defined: {_unknown}")


def build(defs: tuple[MetricDef, ...], registry: CollectorRegistry) -> dict[str, Any]:
    """Instantiate prometheus_client collectors for `defs` in `registry`, keyed by metric name."""
    out: dict[str, Any] = {}  # Gauge, Counter or Histogram by name: their methods differ
    for d in defs:
        if d.kind == "gauge":
            out[d.name] = Gauge(d.name, d.help, d.labels, registry=registry)
        elif d.kind == "counter":
            # prometheus_client appends _total itself.
            out[d.name] = Counter(d.name.removesuffix("_total"), d.help, d.labels, registry=registry)
        elif d.kind == "histogram":
            buckets = STEP_BUCKETS if d.name.startswith(STEP) else Histogram.DEFAULT_BUCKETS
            out[d.name] = Histogram(d.name, d.help, d.labels, buckets=buckets, registry=registry)
        else:  # pragma: no cover - guarded by the catalogue test
            raise ValueError(f"unknown metric kind {d.kind!r} for {d.name}")
    return out


class TrainerMetrics:
    """The trainer's exporter: one registry, labels fixed per run, stage switched as the run advances."""

    def __init__(
        self, run: str, namespace: str = "local", method: str = "rlt", registry: CollectorRegistry | None = None
    ):
        self.registry = registry or CollectorRegistry()
        self._m = build(TRAINER_METRICS, self.registry)
        self._base = {"namespace": namespace, "run": run, "method": method}
        self.stage = "none"

    def serve(self, port: int, addr: str = "127.0.0.1") -> int:
        """Start the /metrics HTTP server (port 0 = any free port); returns the bound port."""
        server, _thread = start_http_server(port, addr=addr, registry=self.registry)
        self._server = server
        return server.server_port

    def shutdown(self) -> None:
        server = getattr(self, "_server", None)
        if server is not None:
            server.shutdown()
            server.server_close()

    def _labels(self, name: str, **extra: str) -> Any:  # a Gauge, Counter or Histogram child, as `build` keys them
        return self._m[name].labels(**self._base, stage=self.stage, **extra)

    def set(self, name: str, value: float, **extra: str) -> None:
        self._labels(name, **extra).set(value)

    def inc(self, name: str, amount: float = 1.0, **extra: str) -> None:
        self._labels(name, **extra).inc(amount)

    def observe(self, name: str, value: float, **extra: str) -> None:
        self._labels(name, **extra).observe(value)


def tracking_name(metric: str, label: str | None = None) -> str:
    """Name of a figure in TensorBoard / MLflow / W&B: the metric name, plus `/label-value` for labelled ones."""
    return metric if label is None else f"{metric}/{label}"


TRAINER_METRICS_PORT = 9400  # rank 0's rlt_* exporter: local runs, pods (RLT_METRICS_PORT) and the operator's reads


def parse_metrics_port(value: str) -> int:
    """A metrics port as a person writes it: 1-65535, 0 = any free port, -1 = off; anything else is a ValueError
    (a port past 65535 would fail only at the bind, after the run's files are written)."""
    try:
        port = int(value)
    except ValueError:
        port = None
    if port is None or not -1 <= port <= 65535:
        raise ValueError(f"{value!r} is not a port number (1-65535; 0 = any free port, -1 = off)")
    return port


def metrics_port_from_env() -> int | None:
    """$RLT_METRICS_PORT as `rlt run` and `rlt stage` read it (parse_metrics_port); None when unset."""
    value = os.environ.get(METRICS_PORT.name, "").strip()
    if not value:
        return None
    try:
        return parse_metrics_port(value)
    except ValueError as err:
        raise ValueError(f"{METRICS_PORT.name}={err}") from None


def markdown_table() -> str:
    """The docs table (docs/metrics.md embeds it between markers)."""
    rows = ["| metric | type | labels | source | meaning |", "|---|---|---|---|---|"]
    for d in ALL_METRICS:
        shown = d.name if d.kind != "histogram" else f"{d.name}_bucket/_sum/_count"
        rows.append(f"| `{shown}` | {d.kind} | {', '.join(d.labels) or '—'} | {d.source} | {d.help} |")
    return "\n".join(rows)
