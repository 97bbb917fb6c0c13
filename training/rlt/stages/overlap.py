"""One step off-policy rollouts (spec.stages.rl.generation.overlap oneStepOff): step k+1's rows are sampled while the
trainer scores, runs the reference/old-policy passes and updates on step k's.

Inside optimizer step k (TRL's global_step = k; the policy holds θ_k):
  1. the rollout in flight (step k's prompts, sampled on θ_{k-1}) is joined; its rows are step k's;
  2. the behaviour weights become θ_k (served: TRL's weight push, which first waits for every rank's rollout in
     flight, and which every rank waits for before it samples again; in-process: a copy of the policy) and step
     k+1's prompts, peeked from the dataloader, start sampling on θ_k in a background thread;
  3. step k's rows are scored and trained on: θ_k → θ_{k+1}.
A row is trained by the step right after the weights that sampled it, never later (MAX_STEPS_OFF_POLICY): rows
from older weights, or for other prompts than the step's, are dropped and the step samples on-policy. The first step,
the first of each epoch (nothing to peek past an epoch's end) and the first after a resume sample on-policy.

Every rollout of the mode samples from a seed of its own, rollout_seed(spec.seed, the step that trains on it, rank):
a torch.Generator in-process, vLLM's per-request seed served. The background rollout runs while the step draws from
torch's shared generator (TRL shuffles the batch); on that shared generator the draws of the two threads would
interleave by timing, and so would the whole run. Seeded, the run is the same however the threads are scheduled.

The correction is TRL's: each row keeps the behaviour policy's log-prob of every sampled token (the rollout's
"logprobs", TRL's sampling_per_token_logps). Served, TRL's vLLM importance sampling weighs each token by
exp(log π_θk − log μ) (capped: importanceSamplingCap); in-process the behaviour log-probs are the rows'
old_per_token_logps, so GRPO's clipped ratio π_θ/μ does it. The r_KL teacher term reads the same behaviour log-probs:
the reward of an explanation is that of the policy that wrote it.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import logging
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from multiprocessing.connection import Connection
    from multiprocessing.process import BaseProcess

    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase
    from trl.trainer.grpo_trainer import GRPOTrainer, RolloutFunc

    from rlt.method.generation import Samples
    from rlt.spec.stages import RlStage
    from rlt.stages.record import PhaseTimer

log = logging.getLogger(__name__)

ONE_STEP_OFF = "oneStepOff"  # spec.stages.rl.generation.overlap
MAX_STEPS_OFF_POLICY = 1  # optimizer steps between the weights that sample a row and the update that trains on it


def steps_off_policy(st: RlStage) -> int:
    """How many optimizer steps a row may be off-policy: the one place the runtime reads generation.overlap."""
    return MAX_STEPS_OFF_POLICY if st.generation.overlap == ONE_STEP_OFF else 0


Sampled = tuple[list[list[int]], list[list[float]]]  # completion ids, the sampled tokens' log-probs


class Sampler(Protocol):
    """Samples one completion per prompt id list (TRL's layout repeats each prompt G times) with the behaviour
    policy's log-prob of every sampled token, its random draws from `seed` alone."""

    def __call__(self, prompt_ids: list[list[int]], seed: int) -> Sampled: ...


def rollout_seed(seed: int, step: int, rank: int) -> int:
    """The sampling seed of the rollout that `step` trains on, on `rank` (spec.seed): its own, so a rollout sampled in
    the background draws the same tokens whenever it runs, and the ranks draw apart. 62 bits: vLLM's seed is an int64
    and server_generate adds the sample index."""
    digest = hashlib.sha256(f"rlt-rollout/{seed}/{step}/{rank}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 2


_thread = threading.local()


def behaviour_sampler() -> Callable[[list[list[int]]], Sampled] | None:
    """The sampler a one-step-off rollout runs with, its seed bound (rlt.stages.rl.sample_policy asks), None
    outside one."""
    return getattr(_thread, "sampler", None)


@contextmanager
def sampling_with(sampler: Sampler, seed: int) -> Iterator[None]:
    """Rollouts on this thread sample through `sampler` with `seed` (rlt.stages.rl.sample_policy) inside the
    block."""
    _thread.sampler = functools.partial(sampler, seed=seed)
    try:
        yield
    finally:
        _thread.sampler = None


class LocalBehaviour:
    """In-process behaviour policy: a frozen copy of the policy, refreshed from it before each rollout starts, so the
    background sampling never reads weights the optimizer is changing."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, st: RlStage) -> None:
        self.tokenizer, self.st = tokenizer, st
        self.model: PreTrainedModel | None = None

    def refresh(self, trainer: GRPOTrainer) -> None:
        from trl.models import unwrap_model_for_generation

        # gathered whole under ZeRO-3 (a collective: the main thread calls this, on every rank)
        with unwrap_model_for_generation(trainer.model_wrapped, trainer.accelerator) as policy:
            if self.model is None:
                self.model = copy.deepcopy(policy).eval().requires_grad_(False)
                # TRL sets the policy's own `forward` (trl.trainer.utils, the fused LM head) to a closure over the
                # policy's bound forward, which a deep copy keeps: the copy would sample with the policy's live
                # weights, mid-update. Without it the copy runs its class's forward on its own weights.
                vars(self.model).pop("forward", None)
            else:
                self.model.load_state_dict(policy.state_dict())

    def __call__(self, prompt_ids: list[list[int]], seed: int) -> Sampled:
        import torch

        from rlt.method.generation import sample_with_logprobs

        assert self.model is not None, "refresh() before sampling"
        st = self.st
        # a generator of its own: torch's shared one is drawn by the training step on the other thread meanwhile
        generator = torch.Generator(device=next(self.model.parameters()).device).manual_seed(seed)
        s = sample_with_logprobs(
            self.model,
            self.tokenizer,
            prompt_ids,
            temperature=st.temperature,
            top_p=st.top_p,
            max_new_tokens=st.max_completion_length,
            generator=generator,
        )
        return s.completion_ids, s.logprobs


class ServedBehaviour:
    """The generators (vLLM's OpenAI server) sampled by each rank for its own rows over HTTP: no collective runs in
    the background thread. TRL's weight push keeps the server's weights; `refresh` has nothing to do. The HTTP client
    runs in a process of its own (ClientProcess), unless `generate` says otherwise."""

    def __init__(
        self, base_url: str, st: RlStage, timeout: float, generate: Callable[..., Samples] | None = None
    ) -> None:
        self.base_url, self.st, self.timeout = base_url, st, timeout
        # rlt.method.generation.server_generate's arguments
        self.generate: Callable[..., Samples] = generate or ClientProcess()

    def refresh(self, trainer: GRPOTrainer) -> None:
        return None

    def __call__(self, prompt_ids: list[list[int]], seed: int) -> Sampled:
        st = self.st
        # vLLM seeds sample j of every prompt of a request with seed + j: a group's repeats go as one prompt with n
        # samples (the same prompt twice under one seed would be the same sequence twice)
        groups: dict[tuple[int, ...], list[int]] = {}
        for i, ids_in in enumerate(prompt_ids):
            groups.setdefault(tuple(ids_in), []).append(i)
        by_size: dict[int, list[tuple[int, ...]]] = {}
        for prompt, rows in groups.items():
            by_size.setdefault(len(rows), []).append(prompt)
        ids: list[list[int]] = [[] for _ in prompt_ids]
        logprobs: list[list[float]] = [[] for _ in prompt_ids]
        for n, prompts in sorted(by_size.items()):
            s = self.generate(
                self.base_url,
                [list(p) for p in prompts],
                n=n,
                temperature=st.temperature,
                top_p=st.top_p,
                max_new_tokens=st.max_completion_length,
                timeout=self.timeout,
                seed=seed + n * 10_000,  # requests of other sizes draw apart too
            )
            rows = [i for p in prompts for i in groups[p]]  # server_generate's order: prompt-major, n per prompt
            for i, c, lp in zip(rows, s.completion_ids, s.logprobs, strict=True):
                ids[i], logprobs[i] = c, lp
        return ids, logprobs


class ClientProcess:
    """rlt.method.generation.server_generate run in a child process (spawned, daemonic: it ends with the trainer).

    In a thread of the trainer, the streamed answer's Python work (a JSON event per chunk of tokens) takes the GIL
    from the update between its torch calls, and waits for it (benchmarks/overlap.py, arm oneStepOff-thread). Here the
    background thread only waits on a pipe, without the GIL; the token ids and log-probs come back whole. Started on
    the first call; one request at a time."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.conn: Connection | None = None
        self.proc: BaseProcess | None = None

    def __call__(self, base_url: str, prompt_ids: list[list[int]], **kw: Any) -> Samples:
        from rlt.method.generation import Samples

        with self.lock:
            conn = self.started()
            try:
                conn.send((base_url, prompt_ids, kw))
                status, answer = conn.recv()
            except (EOFError, OSError):  # the child died (killed, out of memory): the next call starts another
                proc, self.conn, self.proc = self.proc, None, None
                if proc is not None:
                    proc.join(5)
                code = proc.exitcode if proc is not None else None
                raise RuntimeError(
                    f"vLLM server {base_url}: the rollout's client process ended (exit code {code}) before it answered"
                ) from None
        if status != "ok":
            raise RuntimeError(answer)  # server_generate's own error, named by the child
        ids, logprobs = answer
        return Samples([list(p) for p in prompt_ids for _ in range(kw["n"])], ids, logprobs)

    def started(self) -> Connection:
        if self.conn is None:
            import multiprocessing

            ctx = multiprocessing.get_context("spawn")  # a fork of a trainer would copy its threads' locks
            self.conn, child = ctx.Pipe()
            self.proc = ctx.Process(target=serve_client, args=(child,), name="rlt-rollout-client", daemon=True)
            self.proc.start()
            child.close()
        return self.conn


def serve_client(conn: Connection) -> None:
    """ClientProcess's child: server_generate for each request on `conn`, answered with ("ok", (ids, logprobs)) or
    ("error", the message), until the parent closes its end."""
    from rlt.method.generation import server_generate

    while True:
        try:
            base_url, prompt_ids, kw = conn.recv()
        except EOFError:
            return
        try:
            s = server_generate(base_url, prompt_ids, **kw)
            conn.send(("ok", (s.completion_ids, s.logprobs)))
        except Exception as e:  # the parent raises it on the calling thread
            conn.send(("error", f"{type(e).__name__}: {e}"))


class Behaviour(Sampler, Protocol):
    def refresh(self, trainer: GRPOTrainer) -> None: ...


@dataclass
class InFlight:
    prompts: list[str]
    version: int  # the global_step whose weights sample it
    rows: Future[dict[str, Any]]


class RolloutAhead:
    """TRL's rollout_func for one-step-off training (the module's docstring says the order). `rollout` is the method's
    rollout on the calling thread (timed into the step's timer), `rollout_ahead` the same rollout built on a timer of
    its own: its phases overlap the step's and are reported apart."""

    def __init__(self, rollout: RolloutFunc, rollout_ahead: RolloutFunc, behaviour: Behaviour, timer: PhaseTimer):
        self.rollout, self.rollout_ahead, self.behaviour, self.timer = rollout, rollout_ahead, behaviour, timer
        self.next_prompts: list[str] | None = None  # set by `peeking`'s get_batch_samples
        self.in_flight: InFlight | None = None
        self.behaviour_step = -1  # the global_step whose weights the behaviour holds
        self.counts = {"ahead": 0, "on_policy": 0, "dropped": 0}

    def __call__(self, prompts: list[str], trainer: GRPOTrainer) -> dict[str, Any]:
        step = trainer.state.global_step
        rows = self.take(prompts, step)
        if rows is None:  # on-policy: the step's own weights
            self.counts["on_policy"] += 1
            self.refreshed(trainer)
            rows = self.sampled(self.rollout, prompts, trainer, step)
        else:
            self.counts["ahead"] += 1
        self.start_next(trainer)
        return rows

    def take(self, prompts: list[str], step: int) -> dict[str, Any] | None:
        """The rows in flight if they are this step's prompts sampled at most MAX_STEPS_OFF_POLICY steps ago."""
        if self.in_flight is None:
            return None
        done, self.in_flight = self.in_flight, None
        with self.timer.phase("generate"):  # the part of the rollout the step waits for
            rows = done.rows.result()  # re-raises the background rollout's error here
        if done.prompts != prompts or step - done.version > MAX_STEPS_OFF_POLICY:
            self.counts["dropped"] += 1
            log.warning(
                "one-step-off rollout dropped at step %d: sampled at step %d for %s prompts",
                step,
                done.version,
                "the same" if done.prompts == prompts else "other",
            )
            return None
        return rows

    def start_next(self, trainer: GRPOTrainer) -> None:
        nxt, self.next_prompts = self.next_prompts, None
        if nxt is None or trainer.state.global_step + 1 >= trainer.state.max_steps:
            return  # nothing peeked (an epoch's end), or no step left to use it
        self.refreshed(trainer)
        rows: Future[dict[str, Any]] = Future()
        step = trainer.state.global_step + 1  # the step that trains on these rows

        def work() -> None:
            try:
                rows.set_result(self.sampled(self.rollout_ahead, nxt, trainer, step))
            except BaseException as e:  # handed to the step that takes the rows
                rows.set_exception(e)

        # a daemon: a stopping stage does not wait for the next step's rollout
        threading.Thread(target=work, name="rlt-rollout-ahead", daemon=True).start()
        self.in_flight = InFlight(nxt, trainer.state.global_step, rows)

    def refreshed(self, trainer: GRPOTrainer) -> None:
        """The behaviour weights := this step's policy (once per step)."""
        if self.behaviour_step != trainer.state.global_step:
            self.behaviour.refresh(trainer)
            self.behaviour_step = trainer.state.global_step

    def sampled(self, rollout: RolloutFunc, prompts: list[str], trainer: GRPOTrainer, step: int) -> dict[str, Any]:
        """`rollout` on the behaviour policy, seeded for the step that trains on its rows (rollout_seed): sampled
        ahead or on-policy, in the background or not, a step's rows are the same draws."""
        seed = rollout_seed(trainer.args.seed, step, trainer.accelerator.process_index)
        with sampling_with(self.behaviour, seed):
            return rollout(prompts, trainer)

    def join(self) -> None:
        """Wait for the rollout in flight (kept for its step): the behaviour weights may change after this."""
        if self.in_flight is not None:
            with self.timer.phase("generate"):
                self.in_flight.rows.exception()


def peeking(trainer_cls: type) -> type:
    """A GRPOTrainer class whose get_batch_samples also takes the next optimizer step's batches from the epoch
    iterator and tells the trainer's RolloutAhead (`trainer.rollout_ahead`) their prompts. The trainer loop sets
    gradient sync itself (transformers 5: it prefetches a step's batches too), so reading one step early changes
    nothing else."""

    class Peeking(trainer_cls):  # type: ignore[misc]  # a base known only at run time
        rollout_ahead: RolloutAhead | None = None
        _peeked: tuple[Iterator[Any], list[Any]] | None = None

        def get_batch_samples(
            self, epoch_iterator: Iterator[Any], num_batches: int, device: torch.device
        ) -> tuple[list[Any], Any]:
            held, self._peeked = self._peeked, None
            if held is not None and held[0] is epoch_iterator:
                batches = held[1]
                count = self._get_num_items_in_batch(batches, device)
            else:
                batches, count = super().get_batch_samples(epoch_iterator, num_batches, device)
            upcoming, _ = super().get_batch_samples(epoch_iterator, num_batches, device)
            if upcoming:
                self._peeked = (epoch_iterator, upcoming)
            if self.rollout_ahead is not None:
                # a step's first micro-batch is its whole generation batch (TRL: steps_per_generation = GA)
                self.rollout_ahead.next_prompts = [row["prompt"] for row in upcoming[0]] if upcoming else None
            return batches, count

    Peeking.__name__ = Peeking.__qualname__ = f"Peeking{trainer_cls.__name__}"
    return Peeking


def behaviour_is_old_policy(trainer: GRPOTrainer) -> None:
    """In-process: the rows' behaviour log-probs become TRL's old_per_token_logps (TRL leaves them unset when the
    generation batch is one optimizer step, taking the policy's own, detached: ratio 1), so GRPO's clipped ratio is
    π_θ/μ. Served with TRL's importance sampling, TRL computes old_per_token_logps itself and this does nothing."""
    generate_and_score: Callable[..., dict[str, Any]] = trainer._generate_and_score_completions

    def with_behaviour(*a: Any, **kw: Any) -> dict[str, Any]:
        out = generate_and_score(*a, **kw)
        if out.get("old_per_token_logps") is None and out.get("sampling_per_token_logps") is not None:
            out["old_per_token_logps"] = out["sampling_per_token_logps"]
        return out

    trainer._generate_and_score_completions = with_behaviour  # type: ignore[method-assign]  # this trainer only


def wait_before_weight_push(trainer: GRPOTrainer, ahead: RolloutAhead) -> None:
    """TRL pushes the policy's weights to the generators at the start of a step: every rank's rollout in flight must
    have finished first (a request served across the push would mix two policies), and every rank waits for the
    push to end before it sends the next rollout (only rank 0 talks to the server: the others would leave TRL's
    push at once, and their requests would meet the old weights or the old prefix cache)."""
    push: Callable[..., None] = trainer.vllm_generation.sync_weights  # TRL's is unannotated

    def after_rollouts(*a: Any, **kw: Any) -> None:
        ahead.join()
        trainer.accelerator.wait_for_everyone()
        push(*a, **kw)
        trainer.accelerator.wait_for_everyone()

    trainer.vllm_generation.sync_weights = after_rollouts  # type: ignore[method-assign]  # this trainer only
