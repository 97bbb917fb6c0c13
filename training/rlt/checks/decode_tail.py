"""The rollout's decoding step by step (issue 51): how long an engine takes for its rows and how much of that its
decode slots sit empty, the tail of the last rows. Pure and torch-free (the operator sizes the grace period with it).

The model, stated so a reader can redo it:
- a vLLM engine decodes in steps, one token for every live sequence per step; a step is memory-bandwidth bound: it
  reads the weights of the engine's shard once and every live sequence's KV cache at its current length (prompt +
  tokens so far), so it lasts STEP_OVERHEAD_S + bytes / (bandwidth × efficiency);
- calibration: the full-batch rate stays rlt.checks.gpu_figures.DECODE_TOKENS_PER_S (scaled by bandwidth), the one
  source of truth: an engine whose `slots` are kept full makes that many tokens/s per sequence. Kept full by
  continuous batching, a live sequence's age is length-biased: a row of c tokens is live for c steps, so the live
  rows hold sum(c²) / (2 sum(c)) completion tokens on average (maxCompletionLength / 3 for lengths spread from 0).
  The efficiency is what makes that state's step last 1 / rate; the roofline gives only other states' steps
  relative to it, e.g. a lone sequence's rate over the full batch's;
- completion lengths: spread evenly from (2 × share - 1) × longest to longest (share: MEAN_COMPLETION_SHARE of
  rlt.checks.step_time, 0.5: from 0 to maxCompletionLength), so they average the plan's mean and one reaches the cap
  (the plan's longest completion);
- continuous batching (vLLM's scheduler): an engine takes its rows in arrival order, at most `slots` live; a row that
  finishes frees its slot for the next queued row at the next step, so the slots stay full until the queue is empty
  and only the last `slots` rows decode as the batch empties (the tail). Arrival order is unrelated to length: the
  figures are the mean over ORDERS seeded shuffles (deterministic);
- the slots are the plan's (rlt.checks.gpu_memory.kv_sequences: the KV cache at the mean row's length, at most
  VLLM_MAX_NUM_SEQS); an engine kept full holds shorter rows on average, so vLLM may run more: the plan errs slow;
- not modelled: each row's prefill (chunked prefill mixes it into decode steps), preemption when the KV cache
  overflows, the step overhead growing with the batch (sampling), speculative decoding.
benchmarks/decode_tail.py measures the shape on the real vLLM CPU server: a lone row ×5.9 a batch of 64's
per-sequence rate, and 64 rows spread over 1..960 tokens ending at 0.45 of the earlier bound, within 2 % of a step
law a + c × bytes fitted on two same-length batches (a CPU step is bound by compute and vLLM's overhead, not by
bandwidth: the shape carries over, the GPU's ×2.9 is the roofline's)."""

from __future__ import annotations

import heapq
import random
from collections import deque
from dataclasses import dataclass
from functools import lru_cache

# vLLM's per-step work outside the memory reads (scheduling, sampling, detokenising; CUDA graphs on): a few ms on a
# GPU host. An estimate, not measured here; it bounds how much faster than the full batch a lone sequence runs.
STEP_OVERHEAD_S = 0.003
ORDERS = 8  # seeded arrival orders the rollout's figures average


@dataclass(frozen=True)
class Engine:
    """One vLLM engine as the roofline sees it (per GPU of its tensor-parallel group: each reads its shard)."""

    weight_bytes: float  # the weights' shard, read once a step
    kv_bytes_per_token: float  # one token's KV cache in the shard, read once a step per live token
    prompt: int  # tokens of each row's prompt
    slots: int  # sequences decoded at once
    full_rate: float  # tokens/s per sequence with the slots kept full (DECODE_TOKENS_PER_S, scaled)
    bandwidth: float  # bytes/s of one GPU: only for the efficiency the calibration implies
    overhead: float = STEP_OVERHEAD_S


@dataclass(frozen=True)
class Rollout:
    """An engine's rollout of `rows` rows, mean over ORDERS arrival orders (seconds of one engine)."""

    seconds: float  # until its last row finishes
    empty: float  # the steps' seconds × the share of slots empty in each: the decode slots empty
    full: float  # while every slot is live (the queue not yet empty)
    rows: int
    slots: int
    shortest: int  # completion tokens of the shortest and longest rows
    longest: int
    full_rate: float  # tokens/s per sequence at full slots (the calibration)
    lone_rate: float  # tokens/s of a lone sequence at the longest row's end (prompt + longest)
    efficiency: float  # the share of the memory bandwidth the calibration implies at full slots
    overhead: float

    @property
    def tail(self) -> float:
        """Seconds after the queue empties: the last rows decoding as the batch empties."""
        return self.seconds - self.full


def completion_lengths(rows: int, longest: int, share: float) -> tuple[int, ...]:
    """`rows` completion lengths spread evenly from (2 × share - 1) × longest to longest (at least 1 token): they
    average share × longest, and the longest reaches it."""
    if not 0.5 <= share <= 1:
        raise ValueError(f"MEAN_COMPLETION_SHARE {share}: the even spread up to the longest needs 0.5-1")
    low = (2 * share - 1) * longest
    if rows == 1:
        return (longest,)
    return tuple(max(1, round(low + (longest - low) * i / (rows - 1))) for i in range(rows))


def live_age(lengths: tuple[int, ...]) -> float:
    """The completion tokens a live row holds on average in an engine kept full: sum(c²) / (2 sum(c))."""
    return sum(c * c for c in lengths) / (2 * sum(lengths))


def _full_bytes(e: Engine, lengths: tuple[int, ...]) -> float:
    """Bytes one step reads with every slot live at the kept-full state's mean length (the calibration)."""
    return e.weight_bytes + e.slots * (e.prompt + live_age(lengths)) * e.kv_bytes_per_token


def _memory(e: Engine) -> float:
    """The memory-bound part of a full step: 1 / full_rate less the step overhead."""
    memory = 1 / e.full_rate - e.overhead
    if memory <= 0:
        raise ValueError(f"a full step of {1 / e.full_rate:.4f} s is within the step overhead {e.overhead} s")
    return memory


def step_seconds(e: Engine, lengths: tuple[int, ...], kv_tokens: float) -> float:
    """One step reading the weights and `kv_tokens` tokens of KV cache, calibrated so the kept-full state lasts
    1 / full_rate."""
    return e.overhead + _memory(e) * (e.weight_bytes + kv_tokens * e.kv_bytes_per_token) / _full_bytes(e, lengths)


def _one_order(e: Engine, lengths: tuple[int, ...], order: list[int]) -> tuple[float, float, float]:
    """(seconds, empty slot-share seconds, seconds at full slots) of one arrival order. Between two rows finishing
    the live set is fixed and every live row grows by a token a step, so each span sums in closed form."""
    per_byte = _memory(e) / _full_bytes(e, lengths)
    queue = deque(order)
    live: list[tuple[int, int]] = []  # (the step it ends at, the step it started at)
    started = 0  # sum of the live rows' start steps: their KV tokens at step j are n × (prompt + j) - started
    now = 0
    seconds = empty = full = 0.0

    def admit() -> None:
        nonlocal started
        while queue and len(live) < e.slots:
            heapq.heappush(live, (now + queue.popleft(), now))
            started += now

    admit()
    while live:
        end = live[0][0]
        k, n = end - now, len(live)
        steps_sum = k * now + k * (k - 1) / 2  # sum of j over now .. end - 1
        kv_tokens = n * e.prompt * k + n * steps_sum - k * started
        span = k * e.overhead + per_byte * (k * e.weight_bytes + kv_tokens * e.kv_bytes_per_token)
        seconds += span
        empty += span * (1 - n / e.slots)
        full += span if n == e.slots else 0.0
        now = end
        while live and live[0][0] == now:
            started -= heapq.heappop(live)[1]
        admit()
    return seconds, empty, full


@lru_cache(maxsize=64)
def rollout(e: Engine, rows: int, longest: int, share: float) -> Rollout:
    """An engine's rollout of `rows` rows of completions up to `longest` tokens averaging share × longest."""
    lengths = completion_lengths(rows, longest, share)
    runs = []
    for seed in range(ORDERS):
        order = list(lengths)
        random.Random(seed).shuffle(order)
        runs.append(_one_order(e, lengths, order))
    seconds, empty, full = (sum(r[i] for r in runs) / ORDERS for i in range(3))
    return Rollout(
        seconds=seconds,
        empty=empty,
        full=full,
        rows=rows,
        slots=e.slots,
        shortest=min(lengths),
        longest=longest,
        full_rate=e.full_rate,
        lone_rate=1 / step_seconds(e, lengths, e.prompt + longest),
        efficiency=_full_bytes(e, lengths) / (e.bandwidth * _memory(e)),
        overhead=e.overhead,
    )


def tail_line(stage: str, r: Rollout) -> str:
    """The plan's line on the decode tail, with its numbers."""
    return (
        f"{stage} decode tail: each engine's {r.slots} slots decode its {r.rows} rows (completions spread "
        f"evenly over {r.shortest}-{r.longest} tokens, mean over {ORDERS} arrival orders): the slots stay full "
        f"{r.full / 60:.1f} min at {r.full_rate:.0f} tokens/s per sequence, then the last rows' tail "
        f"{r.tail / 60:.1f} min as the batch empties, a lone sequence at {r.lone_rate:.0f} tokens/s "
        f"(×{r.lone_rate / r.full_rate:.1f} the full batch's: the roofline's weights + KV bytes a step, "
        f"{r.efficiency:.0%} of the memory bandwidth and {r.overhead * 1e3:.0f} ms a step reproduce the full rate; "
        "rlt.checks.decode_tail); slots empty "
        f"{r.empty / r.seconds:.0%} of the decoding's {r.seconds / 60:.1f} min"
    )
