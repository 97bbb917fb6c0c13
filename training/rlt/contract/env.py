"""The environment of a run's pods, as one table: every variable the operator writes into a trainer or generator pod,
and every variable rlt reads, with who writes it, who reads it and what it means.

The operator's builders write these names and the trainer reads them through this table, never as a literal
(tests/unit/test_pod_env.py checks both ways); docs/operator.md embeds the table (`markdown_table`). The operator
pod's own settings (RLT_RESYNC_SECONDS, ...) are the chart's and rlt_operator.config.settings', not listed here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EnvVar:
    name: str
    writer: str
    reader: str
    meaning: str


OPERATOR_ALL = "operator: every pod of the run"
OPERATOR_TRAINER = "operator: trainer pods"

# --------------------------------------------------------------------------- rlt's own
RUN_YAML = EnvVar(
    "RLT_RUN_YAML",
    OPERATOR_TRAINER + " (init and main container)",
    "`rlt stage` and `rlt preflight` (`--config env:RLT_RUN_YAML`, rlt.spec.loading)",
    "the run as YAML, a snapshot taken when the gang was created: a pod that starts late reads what its peers read",
)
NAMESPACE = EnvVar(
    "RLT_NAMESPACE",
    OPERATOR_ALL,
    "rlt.run.runner (the `namespace` label of the rlt_* series)",
    "the RLTRun's namespace",
)
STAGE = EnvVar(
    "RLT_STAGE",
    OPERATOR_ALL,
    "rlt.stages.record.trace_line",
    "the stage the pod runs; set, the rlt-world and rlt-shard lines are printed (a pod's log)",
)
METRICS_PORT = EnvVar(
    "RLT_METRICS_PORT",
    OPERATOR_TRAINER + "; the trainer image",
    "rlt.contract.metrics.metrics_port_from_env (`rlt run`, `rlt stage`)",
    "rank 0's port for the rlt_* series (0: any free port, -1: off)",
)
CAPACITY_CHECK = EnvVar(
    "RLT_CAPACITY_CHECK",
    "the user, in spec.env",
    "rlt.checks.preflight",
    "`false` skips the preflight's capacity check where the plan is wrong for the hardware",
)
STOP_MARKER = EnvVar(
    "RLT_STOP_MARKER",
    "`rlt launch` (rlt.cli.launch), for the launcher it starts",
    "rlt.stages.preemption",
    "a file to which each rank that stopped on SIGTERM appends a line: agreed (the gang saved) or after-error",
)
FAILURE_NOTE = EnvVar(
    "RLT_FAILURE_NOTE",
    "`rlt launch` (rlt.cli.launch), for the launcher it starts",
    "rlt.cli.launch.note_failure (a command that raised, or `rlt stage`'s one-line errors)",
    "a file to which each failing rank appends its exit code, rank and one line: `rlt launch` says the first cause "
    "(not a rank that lost its peer) last, where the pod's termination message (its log's last 2 KiB) keeps it, "
    "and exits with its config or data error code (the launchers exit 1 for any failed rank)",
)
CACHE = EnvVar(
    "RLT_CACHE",
    "the user; the sandbox's pods",
    "rlt.data.models.cache_root",
    "where the built-in models are built once (default ~/.cache/rlt)",
)
TRACE = EnvVar(
    "RLT_TRACE",
    "the user",
    "rlt.stages.record.trace_line",
    "`1`: the rlt-world, rlt-shard and rlt-distill-written lines in a single local run too",
)
LOCAL_CHECKPOINTS = EnvVar(
    "RLT_LOCAL_CHECKPOINTS",
    "operator: trainer pods, a local volume (resources.trainer.localCheckpoints); the user elsewhere",
    "rlt.stages.trainer (rlt.stages.staged_saves)",
    "set: checkpoints are written there first and copied to the run's volume in the background (marker last)",
)

# --------------------------------------------------------------------------- libraries'
HF_HOME = EnvVar(
    "HF_HOME", OPERATOR_ALL, "huggingface_hub, transformers", "the Hugging Face cache, on the run's volume"
)
HOME = EnvVar("HOME", OPERATOR_ALL, "vLLM, Triton, torch extensions, matplotlib", "the pod's emptyDir")
XDG_CACHE_HOME = EnvVar("XDG_CACHE_HOME", OPERATOR_ALL, "the same libraries", "under the pod's emptyDir")
TMPDIR = EnvVar("TMPDIR", OPERATOR_ALL, "tempfile", "the pod's emptyDir (the root filesystem is read-only)")
HF_TOKEN = EnvVar(
    "HF_TOKEN", OPERATOR_ALL + ", from spec.hfTokenSecret", "huggingface_hub; rlt.contract.outputs", "the Hub token"
)
MASTER_ADDR = EnvVar("MASTER_ADDR", OPERATOR_TRAINER, "accelerate launch, torchrun", "pod 0 of the gang")
MASTER_PORT = EnvVar("MASTER_PORT", OPERATOR_TRAINER, "accelerate launch, torchrun", "the rendezvous port")
NNODES = EnvVar("NNODES", OPERATOR_TRAINER, "people reading the pod", "pods in the gang")
NPROC_PER_NODE = EnvVar("NPROC_PER_NODE", OPERATOR_TRAINER, "people reading the pod", "processes per pod")
WORLD_SIZE = EnvVar(
    "WORLD_SIZE",
    OPERATOR_TRAINER + "; the launcher, per rank",
    "rlt.stages.context.world_size",
    "processes in the gang",
)
NODE_RANK = EnvVar(
    "NODE_RANK",
    OPERATOR_TRAINER + " (the Job's completion index)",
    "accelerate launch; rlt.stages.record",
    "this pod's index in the gang",
)
RANK = EnvVar("RANK", "the launcher (torchrun), per rank", "rlt.stages.context, record, distill", "this process's rank")
LOCAL_RANK = EnvVar(
    "LOCAL_RANK", "the launcher (torchrun), per rank", "rlt.stages.context.rank_device", "this process's GPU in the pod"
)
GROUP_RANK = EnvVar(
    "GROUP_RANK", "the launcher (torchrun), per rank", "rlt.stages.record", "NODE_RANK, as torchrun says"
)
ELASTIC_RUN_ID = EnvVar(
    "TORCHELASTIC_RUN_ID",
    "the launcher (torchrun), the same for every rank of one launch",
    "rlt.stages.distill_parts",
    "the launch a distill row was written in: ranks deal only the rows of earlier launches",
)
ELASTIC_RESTART_COUNT = EnvVar(
    "TORCHELASTIC_RESTART_COUNT", "the launcher (torchrun)", "rlt.stages.distill_parts", "its restarts of the ranks"
)
SHUTDOWN_TIMEOUT = EnvVar(
    "TORCH_ELASTIC_SHUTDOWN_TIMEOUT",
    OPERATOR_TRAINER,
    "torchrun",
    "seconds torchrun waits for its ranks after forwarding SIGTERM (they save meanwhile)",
)
VLLM_DEV_MODE = EnvVar(
    "VLLM_SERVER_DEV_MODE", "operator: generator pods", "vLLM", "the weight-update endpoints the trainer calls"
)
ALLOC_CONF = EnvVar(
    "PYTORCH_CUDA_ALLOC_CONF",
    OPERATOR_TRAINER + " (`expandable_segments:True`)",
    "torch's CUDA caching allocator",
    "segments that grow in place: micro-batches of very different lengths do not fragment the GPU's memory into "
    "blocks none of the next fits (out-of-memory with gigabytes free)",
)
VLLM_CACHE_ROOT = EnvVar(
    "VLLM_CACHE_ROOT",
    "operator: generator pods",
    "vLLM (its torch.compile and CUDA-graph caches)",
    "on the run's volume: a restarted generator reuses the compiled graphs instead of compiling for minutes again",
)

POD_ENV: tuple[EnvVar, ...] = (
    RUN_YAML,
    NAMESPACE,
    STAGE,
    METRICS_PORT,
    CAPACITY_CHECK,
    STOP_MARKER,
    FAILURE_NOTE,
    CACHE,
    TRACE,
    LOCAL_CHECKPOINTS,
    HF_HOME,
    HOME,
    XDG_CACHE_HOME,
    TMPDIR,
    HF_TOKEN,
    MASTER_ADDR,
    MASTER_PORT,
    NNODES,
    NPROC_PER_NODE,
    WORLD_SIZE,
    NODE_RANK,
    RANK,
    LOCAL_RANK,
    GROUP_RANK,
    SHUTDOWN_TIMEOUT,
    VLLM_DEV_MODE,
    ALLOC_CONF,
    VLLM_CACHE_ROOT,
)


def markdown_table() -> str:
    """The docs table (docs/operator.md embeds it between markers)."""
    rows = ["| variable | written by | read by | meaning |", "|---|---|---|---|"]
    rows += [f"| `{v.name}` | {v.writer} | {v.reader} | {v.meaning} |" for v in POD_ENV]
    return "\n".join(rows)
