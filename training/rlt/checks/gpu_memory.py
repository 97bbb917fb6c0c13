"""The GPU the plan assumes and what one vLLM engine's share of it leaves for the KV cache. Torch-free: the operator
sizes the trainer's grace period (rlt.checks.step_time) from the rollout these bound, and `rlt plan`
(rlt.checks.capacity) checks the generators and chooses their tensor parallelism with the same arithmetic."""

from __future__ import annotations

from rlt.checks.model_shape import ModelShape
from rlt.spec.resources import GPU_MEMORY_LABEL
from rlt.spec.run import RLTRunSpec
from rlt.spec.stages import generation

GiB = 2**30
DEFAULT_GPU_MEMORY = 80 * GiB  # an 80 GB A100/H100 (`rlt plan --gpu-memory`)
# vLLM keeps this much of its share for activations and CUDA graphs before sizing the KV cache (its profiling run
# measures it; ~1-2 GiB for a 7B model). Documented constant, not measured here.
VLLM_NON_KV = 2 * GiB
# The fewest sequences of the expected length (prompt + mean completion) whose KV cache one engine must hold before
# tensor parallelism is worth its cost. Decoding is memory-bandwidth bound: each step reads the weights once for the
# whole batch, so a 7B engine's tokens/s keeps growing with the batch up to ~64-128 sequences on an H100. An engine
# that holds 64 on one GPU gains nothing from a second one but two all-reduces per layer per token; below it, TP
# (more KV room per engine) is what lets the batch grow.
MIN_KV_SEQUENCES = 64


def spec_gpu_memory(spec: RLTRunSpec) -> tuple[int, str]:
    """The memory of one GPU of the run's nodes and where the figure comes from: the value of the
    nvidia.com/gpu.memory label (MiB) in spec.scheduling.nodeSelector when the run selects nodes by it, else the
    calibrated GPU's or the named GPU product's (rlt.checks.gpu_figures), else DEFAULT_GPU_MEMORY (the spec names no GPU type otherwise: nvidia.com/gpu is a count)."""
    from rlt.checks.gpu_figures import spec_gpu_model_memory

    mib = spec.scheduling.node_selector.get(GPU_MEMORY_LABEL)  # a positive whole number (rlt.spec.resources)
    if mib is not None:
        return int(mib) * 2**20, f"spec.scheduling.nodeSelector {GPU_MEMORY_LABEL}={mib} (MiB)"
    model = spec_gpu_model_memory(spec)  # a calibration's GPU, or the GPU product the spec selects
    if model is not None:
        return model
    return DEFAULT_GPU_MEMORY, f"the default {DEFAULT_GPU_MEMORY / GiB:.1f} GiB"


def kv_sequences(spec: RLTRunSpec, shape: ModelShape, gpu_memory: int, length: int, tp: int, b: int) -> int:
    """Sequences of `length` tokens whose KV cache one vLLM engine of `tp` GPUs holds at once: its
    gpuMemoryUtilization share of each GPU, less the weights' shard (`b` bytes per parameter) and VLLM_NON_KV."""
    share = int(generation(spec).gpu_memory_utilization * gpu_memory)
    kv_budget = share - shape.params * b // tp - VLLM_NON_KV
    per_seq = length * shape.kv_bytes_per_token * b // tp
    return max(0, kv_budget // per_seq) if per_seq else 0


def tensor_parallel_choice(spec: RLTRunSpec, shape: ModelShape, gpu_memory: int, length: int, b: int) -> int | None:
    """The smallest tensor parallelism (a divisor of the attention heads, at most the generator pod's GPUs) at which
    one engine holds the model and the KV cache of MIN_KV_SEQUENCES sequences of `length` tokens; None when no
    size within the pod does."""
    gpus = max(1, spec.resources.generator.gpus)
    for tp in (t for t in range(1, gpus + 1) if shape.heads % t == 0):
        if kv_sequences(spec, shape, gpu_memory, length, tp, b) >= MIN_KV_SEQUENCES:
            return tp
    return None
