"""Selective gradient checkpointing (issue 51): how many decoder layers of a Trainer stage keep their activations
instead of recomputing them in the backward pass, and what the recompute then costs. Pure, torch-free; the plan
(rlt.checks.stage_terms.trainer) prints the choice and charges it, the trainer (rlt.stages.checkpoint_layers) runs
it, both through `choose`.

A checkpointed decoder layer keeps only its input (hidden × bytes per token) and runs its forward a second time in
the backward pass: 2 FLOPs per parameter of the layer per token, a quarter of the update's work. A kept layer keeps
what its backward reads (rlt.checks.plan_terms.layer_bytes_per_token, as autograd saves it: 31 × hidden × 2 bytes
per token for Qwen2.5-7B in bf16, flash/SDPA attention, no length² term): 3.4 GiB for a 16k-token row of
Qwen2.5-7B against 0.11 GiB. The loss is TRL's fused LM head (chunked log-probs, never the whole logits:
rlt.checks.plan_terms.lm_head_loss_bytes), charged with every layer's activations. With `uncheckpointedLayers`
unset the stage keeps as many layers as fit: the GPU less CHECKPOINT_MARGIN, less every term held through the step
(model states, DeepSpeed's buffers, the CUDA context, the stage's frozen models), must hold the update's
activations and loss tiles for the longest micro-batch the stage allows (perDeviceBatchSize rows of its longest
row). The other phases (rl's scoring, the colocated engine awake) come and go outside the update and are checked
as they were."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from rlt.checks.gpu_memory import GiB

# The share of the GPU the automatic choice leaves free: what the plan's terms do not count, PyTorch's caching
# allocator's blocks it cannot reuse for a differently sized tensor (5-10 % at a long-row update's peak is common)
# and the backward's transients (a layer's activation gradients while it runs). A stated margin, not measured on a GPU.
CHECKPOINT_MARGIN = 0.10


@dataclass(frozen=True)
class LayerChoice:
    """The decoder layers of a stage's model and how many of them, the last ones, keep their activations."""

    stage: str
    layers: int
    kept: int
    how: str  # where the number comes from, with the memory figures
    problem: str = ""  # uncheckpointedLayers asks for more layers than the model has: the plan fails, naming it
    # of the checkpointed layers, the last `selective` (just before the kept ones) keep their matmuls' and
    # attention's outputs and recompute only the ops between them, `selective_cost` of a layer's forward each
    selective: int = 0
    selective_cost: float = 0.0

    @property
    def checkpointed(self) -> int:
        return self.layers - self.kept

    @property
    def recomputed(self) -> float:
        """Layers' forwards the backward runs again: each fully checkpointed layer's, a share of each selective's."""
        return self.checkpointed - self.selective + self.selective * self.selective_cost

    def line(self) -> str:
        if self.kept >= self.layers:
            return f"{self.stage}: no gradient checkpointing: all {self.layers} decoder layers keep their activations ({self.how})"
        kept = {0: "none keeps its activations", 1: "the last keeps its activations"}.get(
            self.kept, f"the last {self.kept} keep their activations"
        )
        selective = (
            f", {self.selective} of them selectively (their matmuls' and attention's outputs kept, the ops between "
            f"recomputed: {self.selective_cost:.2f} of a layer's forward)"
            if self.selective
            else ""
        )
        return (
            f"{self.stage}: gradient checkpointing on {self.checkpointed} of {self.layers} decoder layers"
            f"{selective}, {kept} ({self.how})"
        )


def field_name(stage: str) -> str:
    return f"stages.{stage}.uncheckpointedLayers"


def choose(
    stage: str,
    layers: int,
    checkpointing: bool,
    asked: int | None,
    gpu_memory: int | None,
    held: int,
    update_phase: Callable[[int], int],
) -> LayerChoice:
    """The layers of a `layers`-layer model that keep their activations: all without `checkpointing`; `asked`
    (uncheckpointedLayers) when set; with no GPU (`gpu_memory` None: a CPU run, which no GPU memory bounds) none;
    else the most whose update fits: `held` bytes held through the step plus `update_phase(kept)` (activations and
    loss tiles of the longest micro-batch) within the GPU less CHECKPOINT_MARGIN. More layers asked than the model
    has is a `problem` naming the field (the trainer raises it, the plan fails with it)."""
    if not checkpointing:
        return LayerChoice(stage, layers, layers, f"stages.{stage}.gradientCheckpointing false")
    if asked is not None:
        problem = (
            f"{field_name(stage)}: {asked} is more than the {layers} decoder layers of the stage's model; at most "
            f"{layers}, or unset for the plan's choice"
            if asked > layers
            else ""
        )
        return LayerChoice(stage, layers, min(asked, layers), f"{field_name(stage)}: {asked}", problem)
    if gpu_memory is None:
        return LayerChoice(stage, layers, 0, f"{field_name(stage)} unset on CPU: no GPU memory to fill")
    margin, room = update_room(gpu_memory, held)
    kept = max((k for k in range(layers + 1) if update_phase(k) <= room), default=0)
    # the first layer kept takes the room of the layer the backward recomputes (plan_terms.activations)
    base, one = update_phase(0), update_phase(min(2, layers)) - update_phase(min(1, layers))
    how = (
        f"{field_name(stage)} unset, the plan's choice: {gib(gpu_memory)} GPU - {gib(held)} held through the step - "
        f"{gib(margin)} margin ({CHECKPOINT_MARGIN:.0%}, rlt.checks.checkpoint_layers.CHECKPOINT_MARGIN) leaves "
        f"{gib(room)} for the update; its activations and loss tiles need {gib(base)} with every layer "
        f"recomputed, {gib(one)} more per layer kept beyond the first"
    )
    if update_phase(kept) > room:
        how += ": not even every layer recomputed fits"
    return LayerChoice(stage, layers, kept, how)


def update_room(gpu_memory: int, held: int) -> tuple[int, int]:
    """(the margin, the bytes left for the update's activations and loss tiles) on a GPU of `gpu_memory` bytes with
    `held` bytes held through the step."""
    margin = int(CHECKPOINT_MARGIN * gpu_memory)
    return margin, gpu_memory - margin - held


def recompute_share(params: int, layer_params: int, choice: LayerChoice) -> float:
    """The recompute as a share of a forward over all `params` (2 FLOPs a parameter a token): the checkpointed
    layers' parameters only (`layer_params` over every decoder layer), a selective layer's at its cost; the head and
    the embedding are outside the layers and never recomputed."""
    if not choice.layers or not params:
        return 0.0
    return layer_params * choice.recomputed / choice.layers / params


def choose_selective(choice: LayerChoice, fits: Callable[[int, int], bool], cost: float) -> LayerChoice:
    """The plan's `choice` with selective checkpointing (issue 51): a selective layer keeps about half of a kept
    layer's activations (rlt.checks.plan_terms.selective_bytes_per_token) and recomputes `cost` of a forward, so
    giving up a kept layer can pay for two selective ones. Over every count of kept layers up to the choice's, the
    most selective layers whose update `fits(kept, selective)`; the pair with the fewest forwards recomputed
    (ties: more kept layers)."""
    best = choice
    for kept in range(choice.kept, -1, -1):
        selective = next((s for s in range(choice.layers - kept, -1, -1) if fits(kept, s)), None)
        if selective is None:
            continue
        candidate = replace(choice, kept=kept, selective=selective, selective_cost=cost)
        if candidate.recomputed < best.recomputed - 1e-9:
            best = candidate
    if best is choice:
        return choice
    return replace(
        best,
        how=f"{choice.how}; {choice.kept} kept with none selective would recompute {choice.recomputed:.0f} forwards, "
        f"{best.kept} kept and {best.selective} selective in the same room recompute {best.recomputed:.1f} "
        "(rlt.checks.checkpoint_layers.choose_selective)",
    )


def gib(n: int | float) -> str:
    return f"{n / GiB:.1f} GiB"


@dataclass(frozen=True)
class LayerSchedule:
    """The layers kept per micro-batch (issue 51): the plan's choice (`floor`) is sized for the stage's longest
    micro-batch, and activations grow with the tokens, so a shorter micro-batch keeps more layers in the same room
    and recomputes fewer. `steps`: (share of the longest micro-batch's tokens, layers kept) for each count above
    `floor` that fits, rising shares and falling counts; a micro-batch past the last share keeps `floor`."""

    layers: int
    floor: int
    steps: tuple[tuple[float, int], ...]

    def kept_for(self, share: float) -> int:
        """Layers kept by a micro-batch of `share` of the longest micro-batch's tokens."""
        for most, kept in self.steps:
            if share <= most:
                return kept
        return self.floor

    def line(self, stage: str, longest: int) -> str:
        if not self.steps:
            return f"{stage}: every micro-batch keeps {self.floor} layers (no shorter one fits more)"
        shown = (
            self.steps if len(self.steps) <= 4 else (*self.steps[:2], self.steps[len(self.steps) // 2], self.steps[-1])
        )
        parts = [f"{kept} up to {math.floor(most * longest)} tokens" for most, kept in shown]
        return (
            f"{stage}: per micro-batch, a shorter one keeps more decoder layers' activations in the room the "
            f"longest ({longest} tokens, {self.floor} kept) leaves: {', '.join(parts)} "
            f"({len(self.steps)} steps; rlt.checks.checkpoint_layers.LayerSchedule)"
        )


def schedule(choice: LayerChoice, fits: Callable[[int, float], bool], resolution: int = 4096) -> LayerSchedule:
    """The LayerSchedule of a plan's `choice`: for each count of kept layers above `choice.kept`, the largest share
    of the longest micro-batch (to 1/`resolution`) whose update `fits` beside what the step holds. `fits(kept,
    share)` must grow false with the share (activations grow with the tokens)."""
    steps: list[tuple[float, int]] = []
    for kept in range(choice.layers, choice.kept, -1):
        low, high = 0, resolution  # fits at low/resolution (0: none), not at high (1.0 is the floor's)
        while high - low > 1:
            mid = (low + high) // 2
            low, high = (mid, high) if fits(kept, mid / resolution) else (low, mid)
        if low and (not steps or low / resolution > steps[-1][0]):
            steps.append((low / resolution, kept))
    return LayerSchedule(choice.layers, choice.kept, tuple(steps))


def spread_checkpointed_share(plan: LayerSchedule, low: float, high: float, points: int = 512) -> float:
    """The checkpointed layers' share of the decoder layers, token-weighted, over micro-batches spread evenly from
    `low` to `high` of the longest micro-batch's tokens (the plan's stated spread: rlt.checks.step_time), each
    keeping plan.kept_for(its share). A step's recompute is this share of its layers' forward."""
    if not plan.layers:
        return 0.0
    shares = [low + (high - low) * (i + 0.5) / points for i in range(points)]
    done = sum(s * (plan.layers - plan.kept_for(s)) / plan.layers for s in shares)
    return done / sum(shares)
