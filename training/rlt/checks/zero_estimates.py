"""DeepSpeed's ZeRO-2/ZeRO-3 model-state estimators, in the configuration rlt runs them (no CPU offload, no
zero.Init: the Trainer loads the model before DeepSpeed partitions it), written out so that `rlt validate` plans a
multi-GPU run without importing DeepSpeed and torch (seconds, and DeepSpeed's accelerator warning).

The expressions are DeepSpeed 0.19's `estimate_zero2_model_states_mem_needs` (runtime/zero/stage_1_and_2.py) and
`estimate_zero3_model_states_mem_needs` (runtime/zero/stage3.py) with cpu_offload=False, zero_init=False and their
default additional_buffer_factor, float arithmetic included; tests/unit/test_door_speed.py holds them equal to the
installed DeepSpeed's on generated sizes, so a DeepSpeed that changes its estimate turns that test red."""

from __future__ import annotations

BUFFER_FACTOR = 1.5  # DeepSpeed's additional_buffer_factor default


def zero2_states(total_params: int, gpus_per_node: int, nodes: int) -> tuple[int, int]:
    """(host bytes, GPU bytes) of ZeRO 1/2 without offload: the 16-bit parameters whole on every GPU, gradients,
    fp32 master weights and Adam's two moments (18 bytes per parameter) split over every rank."""
    total_gpus = nodes * gpus_per_node
    gpu = 2 * total_params + int(18 * total_params / total_gpus)
    host = total_params * 4 * gpus_per_node * BUFFER_FACTOR
    return int(host), int(gpu)


def zero3_states(total_params: int, largest_layer_params: int, gpus_per_node: int, nodes: int) -> tuple[int, int]:
    """(host bytes, GPU bytes) of ZeRO-3 without offload or zero.Init: the largest layer gathered in fp32 plus 18
    bytes per parameter split over every rank; on the host every rank of a node loads the whole model first."""
    total_gpus = nodes * gpus_per_node
    gpu = 4 * largest_layer_params + int(18 * total_params / total_gpus)
    host = total_params * 4 * gpus_per_node * BUFFER_FACTOR
    return int(host), int(gpu)
