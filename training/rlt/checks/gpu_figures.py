"""The GPU figures a plan's times come from: per GPU model, its dense bf16 peak, memory and memory bandwidth (public
spec sheets), chosen from the spec's GPU product where it names one, else the H100 SXM (rlt.checks.step_time's
constants); and `rlt plan --calibration FILE`, which replaces the figures a GPU check measured (benchmarks/
gpu_check.py's JSON) and says which it did not apply and why. Torch-free: the operator sizes the grace period with
the same figures.

Decoding is memory-bandwidth bound (each decode step reads the weights and the batch's KV cache once), so the plan
scales its per-sequence decode rate (rlt.checks.step_time.DECODE_TOKENS_PER_S, an H100's) by the GPU's bandwidth."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path

from rlt.spec.run import RLTRunSpec

# NVIDIA's GPU feature discovery labels a node with its GPU's product name (nvidia.com/gpu.product=
# NVIDIA-H100-80GB-HBM3): a run that selects nodes by it says which GPU the plan is for.
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"


@dataclass(frozen=True)
class GpuModel:
    """A GPU's spec-sheet figures: dense bf16 tensor FLOP/s (no sparsity), memory (MiB, as GPU feature discovery
    labels it) and memory bandwidth (bytes/s)."""

    name: str
    peak_flops: float
    memory_mib: int
    bandwidth: float


# Public spec sheets (NVIDIA A100/H100/H200 datasheets), SXM parts unless named.
GPU_MODELS = {
    "A100": GpuModel("A100 SXM 80GB", 312e12, 81920, 2.039e12),
    "H100-PCIE": GpuModel("H100 PCIe", 756e12, 81559, 2.0e12),
    "H100": GpuModel("H100 SXM", 989e12, 81559, 3.35e12),
    "H200": GpuModel("H200 SXM", 989e12, 143771, 4.8e12),
}
DEFAULT_GPU_MODEL = "H100"  # the step-time constants' GPU; the spec names no GPU type otherwise
# Per sequence, vLLM at a full batch, a 7B teacher on one H100 (rlt.spec.budgets assumes 10 as a floor); other GPUs:
# scaled by memory bandwidth (figures).
DECODE_TOKENS_PER_S = 30.0


@dataclass(frozen=True)
class Figures:
    """What a plan's times are computed with, and where each figure comes from."""

    gpu: GpuModel
    peak_flops: float
    decode_tokens_per_s: float  # per sequence at a full decode batch, the teacher's engine
    local_write_rate: float | None = None  # measured local-disk write rate (None: the step-time default)
    sources: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Calibration:
    """What a GPU check measured, as the plan uses it: the figures it replaces, and what it measured but the plan
    does not apply (each with why)."""

    gpu: str | None
    peak_flops: float | None
    gpu_memory_mib: int | None
    local_write_rate: float | None
    not_applied: tuple[str, ...] = ()
    path: str = ""


_CALIBRATION: ContextVar[Calibration | None] = ContextVar("rlt_plan_calibration", default=None)


def gpu_model_of(spec: RLTRunSpec) -> tuple[GpuModel, str]:
    """The GPU model the spec's nodeSelector names (nvidia.com/gpu.product), else the H100 SXM, and why."""
    product = spec.scheduling.node_selector.get(GPU_PRODUCT_LABEL)
    if product is not None:
        found = model_named(product)
        if found is not None:
            return found, f"spec.scheduling.nodeSelector {GPU_PRODUCT_LABEL}={product}"
        return GPU_MODELS[DEFAULT_GPU_MODEL], (
            f"the default {GPU_MODELS[DEFAULT_GPU_MODEL].name}: {GPU_PRODUCT_LABEL}={product} is none of "
            f"{', '.join(m.name for m in GPU_MODELS.values())}"
        )
    return GPU_MODELS[DEFAULT_GPU_MODEL], f"the default {GPU_MODELS[DEFAULT_GPU_MODEL].name} (no {GPU_PRODUCT_LABEL})"


def model_named(product: str) -> GpuModel | None:
    """The table's model a product name (label or nvidia-smi's) is: H200 before H100, PCIe before SXM."""
    up = product.upper()
    for key in ("H200", "H100-PCIE", "H100", "A100"):
        if key.split("-")[0] in up and (key != "H100-PCIE" or "PCIE" in up):
            return GPU_MODELS[key]
    return None


def figures(spec: RLTRunSpec) -> Figures:
    """The figures of the spec's GPU, with the calibration in force (`calibrated`) replacing what it measured."""
    model, why = gpu_model_of(spec)
    cal = _CALIBRATION.get()
    if cal is not None and cal.gpu is not None:
        model, why = model_named(cal.gpu) or model, f"{cal.path}: {cal.gpu}"
    reference = GPU_MODELS[DEFAULT_GPU_MODEL]
    decode = DECODE_TOKENS_PER_S * model.bandwidth / reference.bandwidth
    sources = {
        "GPU": f"{model.name} ({why})",
        "peak": f"{model.peak_flops / 1e12:.0f} TFLOP/s dense bf16 ({model.name} spec sheet)",
        "decode": f"{decode:.0f} tokens/s per sequence ({DECODE_TOKENS_PER_S:.0f} on an H100 × the "
        f"{model.name}'s memory bandwidth {model.bandwidth / 1e12:.2f} / {reference.bandwidth / 1e12:.2f} TB/s)",
    }
    peak, local = model.peak_flops, None
    if cal is not None:
        if cal.peak_flops is not None:
            peak = cal.peak_flops
            sources["peak"] = f"{peak / 1e12:.0f} TFLOP/s (measured: {cal.path}, bf16 matmul 8192³)"
        local = cal.local_write_rate
    return Figures(model, peak, decode, local, sources)


def spec_gpu_model_memory(spec: RLTRunSpec) -> tuple[int, str] | None:
    """The memory of the calibrated GPU, or of the GPU product the spec names; None when neither says."""
    cal = _CALIBRATION.get()
    if cal is not None and cal.gpu_memory_mib is not None:
        return cal.gpu_memory_mib * 2**20, f"{cal.path}: nvidia-smi {cal.gpu_memory_mib} MiB"
    if spec.scheduling.node_selector.get(GPU_PRODUCT_LABEL) is None:
        return None
    model, why = gpu_model_of(spec)
    return model.memory_mib * 2**20, f"{model.name} ({why})"


def calibration() -> Calibration | None:
    """The calibration in force (`calibrated`), or None."""
    return _CALIBRATION.get()


@contextmanager
def calibrated(cal: Calibration | None) -> Iterator[None]:
    """Plan with `cal`'s measured figures in force (None: the spec-sheet figures)."""
    token = _CALIBRATION.set(cal)
    try:
        yield
    finally:
        _CALIBRATION.reset(token)


# What a GPU check can plausibly measure; a figure outside is a damaged or hand-edited file, refused naming its field
# (a negative rate would plan negative step times, a tiny one overflow them).
FLOPS_RANGE = (1e12, 1e17)  # dense bf16 matmul, FLOP/s: a GPU of this decade is 100-2,500 TFLOP/s
MEMORY_MIB_RANGE = (1024, 2**22)  # 1 GiB to 4 TiB
RATE_RANGE = (1e6, 1e12)  # bytes/s written: 1 MB/s to 1 TB/s
TOKENS_PER_S_RANGE = (1e-3, 1e6)


def _measured(value: object, where: str, bounds: tuple[float, float]) -> float | None:
    """A figure of the check's JSON, None when absent; refused, naming its field, when it is not a number within
    `bounds`."""
    if value is None:
        return None
    low, high = bounds
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise ValueError(f"{where}: {value!r} is not a number from {low:g} to {high:g}")
    return float(value)


def _part(parts: dict[str, object], *names: str) -> dict[str, object]:
    """parts.<names...> of the check's JSON ({} when absent), refused when it is not an object."""
    node: object = parts
    for i, name in enumerate(names):
        node = node.get(name) if isinstance(node, dict) else None
        if node is None:
            return {}
        if not isinstance(node, dict):
            where = ".".join(("parts", *names[: i + 1]))
            raise ValueError(f"{where}: expected an object, got {type(node).__name__}")
    assert isinstance(node, dict)
    return node


def read_calibration(path: str) -> Calibration:
    """A GPU check's JSON (benchmarks/gpu_check.py) as a Calibration. Replaced: the dense bf16 matmul rate
    (parts.peak), the GPU model and memory (parts.driver's nvidia-smi line), the local-disk write rate of a Trainer
    checkpoint (parts.grpo, else parts.throughput.save): the fast tier the periodic saves block on. Measured but not
    applied, each said: the MFU and the decode rate (a 0.5B model on one GPU, HF generate: not the 7B ZeRO-3 update
    nor the vLLM engine the plan's constants are for). A file that is not a GPU check is refused naming what is
    missing, a figure out of range naming its field."""
    try:
        text = Path(path).read_text()
    except OSError as err:  # not there, a folder, unreadable: the system's words, not a Python repr
        raise ValueError(f"--calibration {path}: {err.strerror or err}") from err
    try:
        report = json.loads(text)
        parts = report["parts"]
    except (ValueError, KeyError, TypeError) as err:
        what = f"no {err}" if isinstance(err, KeyError) else str(err)
        raise ValueError(f"--calibration {path}: not a GPU check's JSON (benchmarks/gpu_check.py): {what}") from err
    try:
        return _calibration(parts, path)
    except ValueError as err:
        raise ValueError(f"--calibration {path}: {err}") from err


def _calibration(parts: object, path: str) -> Calibration:
    if not isinstance(parts, dict):
        raise ValueError(f"parts: expected an object, got {type(parts).__name__}")
    peak = _measured(_part(parts, "peak").get("bf16_matmul_flops"), "parts.peak.bf16_matmul_flops", FLOPS_RANGE)
    driver = _part(parts, "driver")
    gpu = driver.get("gpu")
    if gpu is not None and not isinstance(gpu, str):
        raise ValueError(f"parts.driver.gpu: expected a GPU name, got {gpu!r}")
    memory = None
    for piece in str(driver.get("nvidia_smi", "")).split(","):
        if piece.strip().endswith("MiB") and piece.strip().split()[0].isdigit():
            mib = _measured(int(piece.strip().split()[0]), "parts.driver.nvidia_smi (MiB)", MEMORY_MIB_RANGE)
            memory = int(mib) if mib is not None else None
    grpo, throughput = _part(parts, "grpo"), _part(parts, "throughput")
    local = _measured(grpo.get("save_bytes_per_s"), "parts.grpo.save_bytes_per_s", RATE_RANGE)
    if local is None:
        save = _part(parts, "throughput", "save").get("bytes_per_s")
        local = _measured(save, "parts.throughput.save.bytes_per_s", RATE_RANGE)
    not_applied = []
    train = _measured(throughput.get("train_flops_per_s"), "parts.throughput.train_flops_per_s", FLOPS_RANGE)
    if train and peak:
        not_applied.append(
            f"MFU {train / peak:.2f} of the measured peak (Qwen2.5-0.5B, 1024-token rows, one GPU, no ZeRO: the "
            "plan's UTILISATION is a 7B long-sequence ZeRO-3 update's, kept)"
        )
    gen = _part(parts, "throughput", "generate")
    decode = _measured(
        gen.get("tokens_per_s_per_sequence"),
        "parts.throughput.generate.tokens_per_s_per_sequence",
        TOKENS_PER_S_RANGE,
    )
    if decode:
        not_applied.append(
            f"decode {decode:.1f} tokens/s per sequence (HF generate of a 0.5B model, batch {gen.get('batch')}: "
            "the plan's rate is a vLLM engine's at a full batch, kept, scaled by bandwidth)"
        )
    if peak is None and gpu is None and local is None:
        raise ValueError("no measured part (parts.peak, parts.driver, parts.grpo) passed")
    return Calibration(
        gpu=gpu,
        peak_flops=peak,
        gpu_memory_mib=memory,
        local_write_rate=local,
        not_applied=tuple(not_applied),
        path=path,
    )


def calibration_lines(cal: Calibration) -> list[str]:
    """What `rlt plan --calibration` prints: each figure replaced, each measured one kept and why."""
    lines = [f"calibration {cal.path}: replaced:"]
    if cal.gpu is not None:
        lines[0] += f" GPU model {cal.gpu}"
    if cal.gpu_memory_mib is not None:
        lines[0] += f"; GPU memory {cal.gpu_memory_mib} MiB"
    if cal.peak_flops is not None:
        lines[0] += f"; PEAK_FLOPS {cal.peak_flops / 1e12:.0f} TFLOP/s (measured bf16 matmul)"
    if cal.local_write_rate is not None:
        lines[0] += f"; local write rate {cal.local_write_rate / 1e6:.0f} MB/s (the periodic save's blocked write)"
    lines += [f"calibration: measured, not applied: {why}" for why in cal.not_applied]
    return lines
