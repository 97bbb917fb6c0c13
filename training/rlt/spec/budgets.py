"""Time budgets derived from the spec (pure): how long one rank may wait in a collective while another waits on a
rollout. Used for the process group's timeout and the Trainer's `ddp_timeout`, which default to 30 minutes in torch
and transformers: less than one paper-scale rollout (1024 completions of up to 16k tokens) takes.

The figures below are deliberately pessimistic: a timeout that fires hours into a healthy run loses the run, one that
is too long only delays noticing a dead peer (the operator's gang restart notices dead pods on its own)."""

from __future__ import annotations

import math

from rlt.spec.run import RLTRunSpec, stage_settings

# torch.distributed's and transformers' default collective timeout (TrainingArguments.ddp_timeout = 1800).
DEFAULT_COLLECTIVE_TIMEOUT_S = 1800
# vLLM's default --max-num-seqs (vllm.config.SchedulerConfig): sequences one server decodes at once.
VLLM_MAX_NUM_SEQS = 256
# Slowest decode rate per sequence assumed (tokens/s). vLLM decodes a 7B model at 20-60 tokens/s per sequence at
# full batch on an A100/H100; 10 leaves room for long contexts, preemption and slower GPUs.
MIN_DECODE_TOKENS_PER_S = 10.0


def _rounds(sequences: int, servers: int) -> int:
    """Waves of at most VLLM_MAX_NUM_SEQS sequences per server that `sequences` take."""
    return max(1, math.ceil(sequences / (VLLM_MAX_NUM_SEQS * max(1, servers))))


def rollout_seconds(spec: RLTRunSpec, stage: str) -> int:
    """The longest one generation round of `stage` may take: waiting for the server, then the decode waves of the
    round at the slowest assumed rate. 0 for stages that generate nothing. The stage's settings model says what its
    round is (rlt.spec.stages.StageSettings.rollout)."""
    gen = spec.resources.generator
    servers = gen.engines
    rollout = stage_settings(spec, stage).rollout(spec)
    if rollout is None:
        return 0
    tokens = _rounds(rollout.sequences, servers) * rollout.tokens
    return int(rollout.server_wait + math.ceil(tokens / MIN_DECODE_TOKENS_PER_S))


def collective_timeout_seconds(spec: RLTRunSpec, stage: str) -> int:
    """Timeout of the stage's process group and of its Trainer's collectives (`ddp_timeout`): the rollout budget
    plus the default 30 minutes for everything else a step does (scoring, the update, a checkpoint save)."""
    return DEFAULT_COLLECTIVE_TIMEOUT_S + rollout_seconds(spec, stage)
