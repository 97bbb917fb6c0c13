"""The kubelet emulator's pod model and its pure rules (rlt_sandbox.kubelet_emulator says what is emulated):
one emulated pod (PodRun), the image stand-in (ImageEnv), why a pod waits or cannot start, $(VAR) expansion,
image references, and the Job controller's podFailurePolicy and terminal conditions."""

from __future__ import annotations

import fnmatch
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlt.contract.layout import format_time
from rlt_operator.config.kinds import CHILDREN, Kind


def _now() -> str:
    return format_time()


def job_terminal_conditions(interim: str, final: str, why: dict[str, str]) -> list[dict[str, Any]]:
    """A finished Job's conditions as the Job controller writes them (Kubernetes 1.31+): the interim condition
    (SuccessCriteriaMet / FailureTarget) with the final one (Complete / Failed); a real API server refuses
    Complete without SuccessCriteriaMet, and Complete without completionTime."""
    now = _now()
    return [
        {"type": t, "status": "True", "lastProbeTime": now, "lastTransitionTime": now, **why} for t in (interim, final)
    ]


LOOPBACK = "127.0.0.1"
JOB_INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
DEFAULT_GRACE_SECONDS = 30  # a pod's terminationGracePeriodSeconds when its spec has none (Kubernetes' default)
# The operator's children from its kind table, and the Secrets a pod's env and volumes may name (the kubelet's).
PATHS = {
    **{child.plural: child.collection_path("{ns}") for child in CHILDREN},
    "secrets": Kind("", "v1", "secrets", "Secret", ("get",)).collection_path("{ns}"),
}
_VAR_REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)|\$\$")


@dataclass(frozen=True)
class ImageEnv:
    """What stands in for one container image here: its bin folder (put first on PATH) and its image-level env."""

    bin_dir: str
    env: dict[str, str] = field(default_factory=dict)


def log_tail(path: Path, lines: int = 80, limit: int = 2048) -> str:
    """What the kubelet keeps of a failed container's log as its termination message (FallbackToLogsOnError):
    the last 80 lines, at most 2048 bytes."""
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    tail = b"\n".join(data.splitlines()[-lines:])[-limit:]
    return tail.decode(errors="replace")


class PodWaiting(Exception):
    """What a scheduler or kubelet reports while the pod stays Pending (a node selector no node matches, a missing
    Secret): the pod is not failed, and each pass tries again, so fixing the cause lets it start."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason, self.message = reason, message


# The one emulated node: a pod whose nodeSelector asks for anything else is Unschedulable, as on a cluster.
NODE_LABELS = {"kubernetes.io/hostname": "localhost", "kubernetes.io/os": "linux"}


class PodConfigError(Exception):
    """The pod cannot start as rendered (the kubelet's CreateContainerConfigError)."""


class ApiRefused(RuntimeError):
    """The API server refused a write (status >= 300, not 404): its code and the message of its Status."""

    def __init__(self, what: str, code: int, message: str):
        super().__init__(f"{what}: {code} {message}")
        self.code, self.message = code, message


# A container image reference as the runtime parses it: [host[:port]/]path[:tag][@digest], lowercase path
# components (the reference grammar of the OCI distribution spec, written out here).
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_HOST = r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*|\[[0-9a-fA-F:]+\])"
IMAGE_REFERENCE = re.compile(
    rf"(?:{_HOST}(?::[0-9]+)?/)?{_COMPONENT}(?:/{_COMPONENT})*(?::[\w][\w.-]{{0,127}})?(?:@[a-z0-9]+(?:[.+_-][a-z0-9]+)*:[0-9a-fA-F]{{32,}})?"
)
IMAGE_BACKOFF_CAP = 300.0  # the kubelet's image pull back-off: 10 s doubling, at most 5 min


def image_problem(image: str, missing: list[str]) -> tuple[str, str] | None:
    """(reason, pattern or message) when the image cannot be pulled here: a reference that does not parse
    (InvalidImageName), or one matching a pattern of `missing` (ErrImagePull); None when it can."""
    if not image or not IMAGE_REFERENCE.fullmatch(image) or len(image) > 4096:
        return (
            "InvalidImageName",
            f'Failed to apply default image tag "{image}": couldn\'t parse image name "{image}": invalid reference '
            "format",
        )
    hit = next((p for p in missing if fnmatch.fnmatchcase(image, p)), None)
    return ("ErrImagePull", hit) if hit is not None else None


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion: defined variables are replaced, `$$` is a literal `$`, the rest stays."""

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        value: str = env.get(m.group(1), m.group(0))
        return value

    return _VAR_REF.sub(sub, text)


def cluster_dns_pattern(namespaces: list[str]) -> re.Pattern[str]:
    ns = "|".join(re.escape(n) for n in namespaces)
    return re.compile(rf"\b(?:[a-z0-9](?:[-a-z0-9]*[a-z0-9])?\.)+(?:{ns})\.svc(?:\.cluster\.local)?\b")


# A pod's reported state: phase, ready, restarts, exit code, why it waits, init step, init restarts.
Report = tuple[str, bool, int, int | None, str, int, tuple[tuple[int, int], ...]]


@dataclass
class PodRun:
    """One emulated pod: its API object's identity and its container's process."""

    name: str
    owner_kind: str  # Job | StatefulSet
    owner: str
    index: int
    restart_policy: str
    body: dict[str, Any]
    dir: Path
    log_path: Path
    container: dict[str, Any]
    proc: subprocess.Popen[bytes] | None = None
    phase: str = "Pending"
    exit_code: int | None = None
    restarts: int = 0
    ready: bool = False
    message: str = ""
    reported: Report | None = None  # what was last written to the pod's status
    started_at: float = 0.0
    started_wall: str = ""  # when the main container started (its running state's startedAt)
    terminating: bool = False
    kill_at: float = 0.0
    tag: str = ""  # marks every process of the container (its stand-in for a cgroup)
    finished_at: float = 0.0
    failure_action: str | None = None  # a failed Job pod's podFailurePolicy verdict: FailJob | Ignore | Count
    failure_rule: int | None = None  # the index of the rule that gave it (None: no rule matched)
    run: str = ""  # its run (label rlt.dev/run, else its owner): the unit that gets its own ports here
    ports: dict[int, int] = field(default_factory=dict)  # its run's {rendered port: port here}
    waiting: PodWaiting | None = None  # why it stays Pending (retried every pass)
    scheduled: bool = False  # the scheduler's checks passed (node selector, claims): not asked again
    init_containers: list[dict[str, Any]] = field(default_factory=list)
    step: int = 0  # the init container now due (len(init_containers): the main container's turn)
    init_states: dict[int, dict[str, Any]] = field(default_factory=dict)  # init index -> its last state
    init_restarts: dict[int, int] = field(default_factory=dict)
    failed_container: str = ""  # the container whose exit failed the pod
    pull_failures: int = 0  # failed pulls of the image now due, and when the back-off ends
    pull_retry_at: float = 0.0
    pull_failed_at: float = 0.0

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def initializing(self) -> bool:
        return self.step < len(self.init_containers)

    @property
    def current(self) -> dict[str, Any]:
        """The container whose turn it is: the next init container, else the main one."""
        return self.init_containers[self.step] if self.initializing else self.container

    def log_of(self, name: str) -> Path:
        """A container's log file (the main one's is `log_path`)."""
        return self.log_path if name == self.container["name"] else self.dir / f"init-{name}.log"

    def message_file(self, name: str) -> Path:
        """A container's terminationMessagePath, here."""
        return self.dir / f"{name}.termination-log"


def failure_action(policy: dict[str, Any] | None, status: dict[str, Any]) -> tuple[str, int | None]:
    """The Job controller's podFailurePolicy for one failed pod: the first rule that matches its containers' exit
    codes (onExitCodes; init containers' too, as Kubernetes checks them) or its conditions (onPodConditions) decides
    (FailJob, Ignore, Count); no match counts."""
    for i, rule in enumerate((policy or {}).get("rules") or []):
        on_codes = rule.get("onExitCodes")
        if on_codes:
            values = {int(v) for v in on_codes.get("values") or []}
            codes = [
                cs["state"]["terminated"]["exitCode"]
                for cs in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or [])
                if "terminated" in (cs.get("state") or {})
                and on_codes.get("containerName") in (None, cs["name"])
                and cs["state"]["terminated"]["exitCode"] != 0  # NotIn never matches a success
            ]
            if on_codes["operator"] == "In":
                hit = any(c in values for c in codes)
            elif on_codes["operator"] == "NotIn":
                hit = any(c not in values for c in codes)
            else:
                raise ValueError(f"podFailurePolicy rule {i}: onExitCodes.operator {on_codes['operator']!r}")
        else:
            conds = {(c.get("type"), c.get("status")) for c in status.get("conditions") or []}
            hit = any((c["type"], c.get("status", "True")) in conds for c in rule.get("onPodConditions") or [])
        if hit:
            return rule["action"], i
    return "Count", None
