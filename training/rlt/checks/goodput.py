"""Goodput: the share of the GPU-seconds a stage holds that does the work its algorithm needs, and where the rest
goes, per generation/training mode of the rl stage (docs/goodput.md). Pure arithmetic over the step's phases
(rlt.checks.step_time, rlt.checks.stage_terms.rl).

Useful work: the rollout's decoding at full decode slots, the reward's scoring, the reference forward and the update's
forward and backward, each at balanced ranks. Losses, each named: a side of the pipeline idle while the other works,
decode slots empty in the rollout's tail, the weight sync, a colocated engine's wake and sleep, the rank imbalance,
gradient-checkpoint recompute, the time saves block and generator GPUs vLLM does not run on. `strict` counts the
update and the decoding only (the plan's figure before issue 51), printed beside it.

The modes of rl (stages.rl.generation.mode / overlap):
- separate (server, none): generator pods decode while the trainers wait, then the trainers score, pass and update
  while the generators wait; today's;
- one step off (server, oneStepOff): the generators decode step k+1 while the trainers work on step k; a step lasts
  the longer of the two, then the weight sync; a row is trained at most one optimizer step after the weights that
  sampled it;
- partial rollouts (server, partialRollouts): two steps' rollouts in flight, their rows held through each push, so
  an engine's slots stay full: a step lasts the longest of the step's tokens decoded at full slots (plus the running
  rows' KV recompute after the push), the trainers' phases and half a lone rollout's decoding (its time past the
  other two is that rollout's decode tail), then the weight sync; at most two steps off-policy;
- colocated (colocate): every GPU of the run is a trainer GPU hosting a vLLM engine, asleep during the update; the
  phases run in turn on all GPUs, plus the in-place sync and the engine's wake and sleep; it must fit in memory
  (rlt.checks.colocated)."""

from __future__ import annotations

from rlt.checks.plan_terms import Goodput, StepTime

__all__ = ["Goodput", "goodput", "goodput_line"]  # Goodput lives beside StepTime, in the Plan it is part of


def goodput(t: StepTime, asynchronous: bool = True) -> Goodput:
    """The stage's goodput over one step period (a step plus its share of the saves: the local write when
    `asynchronous`, else the whole save to the volume). Trainers and generators each account for every second."""
    save = t.save_blocked(asynchronous) / max(1, t.save_steps)
    period = t.step + save
    T, G = t.trainer_gpus, t.generator_gpus
    # generator GPUs with an engine: a GPU beyond tensorParallelSize × dataParallelSize holds its period for nothing
    E = G if t.engine_gpus is None else min(G, t.engine_gpus)
    decoders = E or (T if t.rollout else 0)  # colocate/inprocess decode on the trainer GPUs
    held = (T + G) * period
    work = t.update_work + t.scoring + t.passes_work
    useful = T * work + decoders * t.busy_generation
    if t.partial_rollouts:
        # the slots a finishing rollout leaves are the next one's, so no tail while either side sets the step; when
        # half a lone rollout's decoding sets it (its longest rows decode two steps long), the time past the longer
        # side is that rollout's tail: its last rows decode with the other slots empty
        tail = max(0.0, t.step - t.transfer - max(t.decoding_held, t.trainer_phases))
    else:
        tail = t.generating - t.busy_generation
    if G:
        trainers_idle = t.step - t.trainer_phases - t.transfer
        generators_idle = t.step - t.decoding_held - t.transfer - (tail if t.partial_rollouts else 0.0)
    else:
        trainers_idle = generators_idle = 0.0
    losses = [
        ("trainers idle while the generators decode", T * trainers_idle),
        ("generators idle while the trainers score, pass and update", E * generators_idle),
        ("decode slots empty (the longest completions' tail)", decoders * tail),
        ("KV cache recomputed after each weight push (partial rollouts)", E * t.kv_recompute),
        ("weight sync", (T + E) * t.transfer),
        ("engine wake/sleep", T * t.engine_switch),
        ("rank imbalance", T * (t.imbalance - 1) * (t.update_work + t.recompute + t.passes_work)),
        ("gradient-checkpoint recompute", T * t.recompute),
        ("saves (time they block)", (T + E) * save),
        ("generator GPUs with no engine (tensorParallelSize × dataParallelSize < gpus)", (G - E) * period),
    ]
    ranked = sorted(((name, v / held) for name, v in losses if v > 1e-9), key=lambda x: -x[1])
    strict = (T * t.update_work + decoders * t.busy_generation) / held
    return Goodput(useful / held, strict, ranked, period, T + G)


def goodput_line(stage: str, g: Goodput, label: str = "") -> str:
    """The plan's line for a stage's goodput, computed once by `goodput` (the text and `-o json` show the same)."""
    lost = ", ".join(f"{name} {v:.0%}" for name, v in g.losses if v >= 0.005)
    return (
        f"{stage}{label}: {g.share:.0%} of the {g.gpus} GPUs' held GPU-seconds do the algorithm's work (update, "
        f"scoring, passes, full decode slots; {g.strict:.0%} counting the update and decoding only); step "
        f"{g.period / 60:.1f} min; lost: {lost}"
    )
