"""Rollouts ahead of the update (spec.stages.rl.generation.overlap): oneStepOff samples step k+1's rows while the
trainer scores, runs the reference pass and updates on step k's; partialRollouts keeps two steps' rollouts in flight
on the generators and holds their unfinished rows through each weight push.

Inside optimizer step k (TRL's global_step = k; the policy holds θ_k), one step off:
  1. the rollout in flight (step k's prompts, sampled on θ_{k-1}) is joined; its rows are step k's;
  2. the behaviour weights become θ_k (served: TRL's weight push, which first waits for every rank's rollout in
     flight, and which every rank waits for before it samples again; in-process: a copy of the policy) and step
     k+1's prompts, peeked from the dataloader, start sampling on θ_k in a background thread;
  3. step k's rows are scored and trained on: θ_k → θ_{k+1}.
Partial rollouts (served only): step k+1's rollout started at step k−1 is still decoding when θ_k is pushed. Only
step k's rollout is joined before the push; the push is wrapped as vLLM's pause (keep: the running rows stay where
they are), TRL's push, the running rows' KV cache dropped (recomputed under θ_k when they are scheduled again) and
resume; then step k+2's prompts start on θ_k beside step k+1's. An engine's decode slots stay full across steps
instead of emptying at the end of each rollout (docs/goodput.md, "the decode tail"). A row's tokens then come from
up to two policies, each token's behaviour log-prob the one its sampler used, and the row's content depends on when
the push met it: such a run is not the same run to run (the seeds still fix each policy's draws).

A row is trained at most `depth` optimizer steps after the weights that sampled its first token (steps_off_policy:
1, or 2 with partial rollouts): rows from older weights, or for other prompts than the step's, are dropped and the
step samples on-policy. The first step, the first of each epoch (nothing to peek past an epoch's end) and the first
after a resume sample on-policy.

Every rollout of the mode samples from a seed of its own, rollout_seed(spec.seed, the step that trains on it, rank):
a torch.Generator in-process; served, vLLM's per-request seed, one request and seed per group (group_seed). The
background rollout runs while the step draws from torch's shared generator (TRL shuffles the batch); on that shared
generator the draws of the two threads would interleave by timing, and so would the whole run. Seeded, the run is
the same however the threads are scheduled (one step off).

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
import queue
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from rlt.spec.budgets import VLLM_MAX_NUM_SEQS
from rlt.spec.stages.rl import NO_OVERLAP, ONE_STEP_OFF, PARTIAL_ROLLOUTS

if TYPE_CHECKING:
    from multiprocessing.connection import Connection
    from multiprocessing.process import BaseProcess

    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase
    from trl.trainer.grpo_trainer import GRPOTrainer, RolloutFunc

    from rlt.method.generation import Samples
    from rlt.spec.resources import GeneratorResources
    from rlt.spec.stages import RlStage
    from rlt.stages.record import PhaseTimer

log = logging.getLogger(__name__)

# optimizer steps between the weights that sample a row's first token and the update that trains on it
STEPS_OFF_POLICY = {NO_OVERLAP: 0, ONE_STEP_OFF: 1, PARTIAL_ROLLOUTS: 2}
OVERLAP_OF_DEPTH = {v: k for k, v in STEPS_OFF_POLICY.items()}


def steps_off_policy(st: RlStage) -> int:
    """How many optimizer steps a row may be off-policy: the one place the runtime reads generation.overlap."""
    return STEPS_OFF_POLICY[st.generation.overlap]


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
                strip_deepspeed_hooks(self.model)
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
            # the copy is whole on every rank, so no rank waits for another's shards; HF's ZeRO-3 default would
            # all-reduce each token from this thread, between the step's own collectives: a deadlock on 2 ranks
            synced_gpus=False,
        )
        return s.completion_ids, s.logprobs


HOOK_DICTS = ("_forward_pre_hooks", "_forward_hooks", "_backward_pre_hooks", "_backward_hooks")


def strip_deepspeed_hooks(model: torch.nn.Module) -> int:
    """Removes DeepSpeed's module hooks from a copy of the policy; how many. Under ZeRO-3 a deep copy keeps some of
    them (its start-of-forward hook, which TRL's gathering does not take off): the copy's forward would then run
    ZeRO-3's collectives from the background thread, between the step's own on the main thread, and two ranks would
    deadlock. The copy holds every weight whole; it needs none of them."""
    removed = 0
    for module in model.modules():
        for name in HOOK_DICTS:
            hooks = getattr(module, name, None)
            if not hooks:
                continue
            for key, hook in list(hooks.items()):
                fn = getattr(hook, "func", hook)  # a functools.partial's function
                if (getattr(fn, "__module__", None) or "").startswith("deepspeed"):
                    del hooks[key]
                    removed += 1
    return removed


class ServedBehaviour:
    """The generators (vLLM's OpenAI server) sampled by each rank for its own rows over HTTP: no collective runs in
    the background thread. TRL's weight push keeps the server's weights; `refresh` has nothing to do. The HTTP client
    runs in a process of its own (ClientProcess), unless `generate` (a stand-in with ClientProcess's call) says
    otherwise."""

    def __init__(
        self,
        base_url: str,
        st: RlStage,
        timeout: float,
        generate: Callable[..., list[Samples]] | None = None,
        clients: int = 1,
        in_flight: int | None = None,
    ) -> None:
        self.base_url, self.st, self.timeout = base_url, st, timeout
        self.in_flight = in_flight  # groups at the generators at once (groups_in_flight); None: all
        # a client per rollout in flight (each serves one rollout's requests at a time), handed to whichever asks
        self.clients: queue.SimpleQueue[Callable[..., list[Samples]]] = queue.SimpleQueue()
        for _ in range(clients):
            self.clients.put(generate or ClientProcess())

    def refresh(self, trainer: GRPOTrainer) -> None:
        return None

    def __call__(self, prompt_ids: list[list[int]], seed: int) -> Sampled:
        # vLLM seeds sample j of every prompt of one request with seed + j: prompts sharing a request would share
        # their random draws (tests/training/test_served_behaviour.py), so each group (a prompt's repeats, as one
        # prompt with n samples) goes as a request of its own, on a seed of its own, `in_flight` at a time
        groups: dict[tuple[int, ...], list[int]] = {}
        for i, ids_in in enumerate(prompt_ids):
            groups.setdefault(tuple(ids_in), []).append(i)
        requests = [Request(list(p), len(rows), group_seed(seed, p)) for p, rows in groups.items()]
        st = self.st
        generate = self.clients.get()
        try:
            answers = generate(
                self.base_url,
                requests,
                in_flight=self.in_flight,
                temperature=st.temperature,
                top_p=st.top_p,
                max_new_tokens=st.max_completion_length,
                timeout=self.timeout,
            )
        finally:
            self.clients.put(generate)
        ids: list[list[int]] = [[] for _ in prompt_ids]
        logprobs: list[list[float]] = [[] for _ in prompt_ids]
        for rows, s in zip(groups.values(), answers, strict=True):
            for i, c, lp in zip(rows, s.completion_ids, s.logprobs, strict=True):  # n per prompt, in sample order
                ids[i], logprobs[i] = c, lp
        return ids, logprobs


def groups_in_flight(st: RlStage, generator: GeneratorResources, ranks: int) -> int:
    """How many of a served rollout's groups one rank keeps at the generators at once: vLLM's max-num-seqs per
    engine, shared by the `ranks` trainer ranks and the rollouts each keeps in flight (steps_off_policy), in groups of
    numGenerations. More would wait in vLLM's queue, where a request gets no byte while the sequences before it
    decode, and server_generate takes serverTimeoutSeconds without a byte for a cut stream (one request per rank
    before kept its bytes flowing while any of its sequences ran)."""
    engines = max(1, generator.engines)
    per_rank = VLLM_MAX_NUM_SEQS * engines // max(1, ranks * steps_off_policy(st))
    return max(1, per_rank // st.num_generations)


class Request(NamedTuple):
    """One group's request: its prompt, its samples (n) and its seed (vLLM draws sample j with seed + j)."""

    prompt_ids: list[int]
    n: int
    seed: int


def group_seed(seed: int, prompt_ids: tuple[int, ...] | list[int]) -> int:
    """The seed of a rollout's group (a prompt's repeats): its own for each prompt, so no two groups share draws, and
    from the rollout's seed and the prompt alone, so a group's draws do not depend on what else the rollout holds
    (nor its tokens, where the server's numerics do not depend on its batch: the CPU test server's float32).
    62 bits: vLLM's seed is an int64 and it adds the sample index."""
    digest = hashlib.sha256(f"rlt-group/{seed}/{','.join(map(str, prompt_ids))}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 2


class ClientProcess:
    """generate_all (a rollout's requests) run in a child process (spawned, daemonic: it ends with the trainer).

    In a thread of the trainer, the streamed answer's Python work (a JSON event per chunk of tokens) takes the GIL
    from the update between its torch calls, and waits for it (benchmarks/overlap.py, arm oneStepOff-thread). Here the
    background thread only waits on a pipe, without the GIL; the token ids and log-probs come back whole. Started on
    the first call; one rollout at a time."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.conn: Connection | None = None
        self.proc: BaseProcess | None = None

    def __call__(self, base_url: str, requests: list[Request], **kw: Any) -> list[Samples]:
        """generate_all's answer, from the child."""
        from rlt.method.generation import Samples

        with self.lock:
            conn = self.started()
            try:
                conn.send((base_url, requests, kw))
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
        return [
            Samples([list(r.prompt_ids) for _ in range(r.n)], ids, logprobs)
            for r, (ids, logprobs) in zip(requests, answer, strict=True)
        ]

    def started(self) -> Connection:
        if self.conn is None:
            import multiprocessing

            ctx = multiprocessing.get_context("spawn")  # a fork of a trainer would copy its threads' locks
            self.conn, child = ctx.Pipe()
            self.proc = ctx.Process(target=serve_client, args=(child,), name="rlt-rollout-client", daemon=True)
            self.proc.start()
            child.close()
        return self.conn


# The name each server serves its model under, asked once per rollout client (ClientProcess's child, one per rl
# stage's trainer: the generators serve one model for a stage) and forgotten when a rollout fails, so that a server
# serving another model is asked again.
SERVED_NAMES: dict[str, str] = {}


def generate_all(base_url: str, requests: list[Request], in_flight: int | None = None, **kw: Any) -> list[Samples]:
    """Each request's samples, rlt.method.generation.server_generate with `kw` (its sampling arguments and timeout),
    in the order asked; `in_flight` at the server at a time (None: all), the next sent as one finishes. The server
    batches them as it would one request. A failure cancels the requests still running and is raised."""
    from rlt.method.generation import served_model, server_generate
    from rlt.method.pipeline import as_completed

    if base_url not in SERVED_NAMES:
        SERVED_NAMES[base_url] = served_model(base_url, kw["timeout"])
    model = SERVED_NAMES[base_url]

    def one(i: int, cancel: threading.Event) -> Samples:
        r = requests[i]
        return server_generate(base_url, [r.prompt_ids], n=r.n, seed=r.seed, cancel=cancel, model=model, **kw)

    try:
        got = dict(as_completed(one, range(len(requests)), in_flight=in_flight or len(requests)))
    except BaseException:
        SERVED_NAMES.pop(base_url, None)
        raise
    return [got[i] for i in range(len(requests))]


def serve_client(conn: Connection) -> None:
    """ClientProcess's child: generate_all for each rollout on `conn`, answered with ("ok", [(ids, logprobs) per
    request]) or ("error", the message), until the parent closes its end."""
    while True:
        try:
            base_url, requests, kw = conn.recv()
        except EOFError:
            return
        try:
            got = generate_all(base_url, requests, **kw)
            conn.send(("ok", [(s.completion_ids, s.logprobs) for s in got]))
        except Exception as e:  # the parent raises it on the calling thread
            conn.send(("error", f"{type(e).__name__}: {e}"))


class Behaviour(Sampler, Protocol):
    def refresh(self, trainer: GRPOTrainer) -> None: ...


@dataclass
class InFlight:
    prompts: list[str]
    version: int  # the global_step whose weights sample its first tokens
    rows: Future[dict[str, Any]]


class RolloutAhead:
    """TRL's rollout_func for rollouts ahead of the update (the module's docstring says the order). `rollout` is the
    method's rollout on the calling thread (timed into the step's timer), `rollout_ahead` the same rollout built on a
    timer of its own: its phases overlap the step's and are reported apart. `depth`: how many steps ahead rollouts
    start (steps_off_policy), one background thread each."""

    def __init__(
        self, rollout: RolloutFunc, rollout_ahead: RolloutFunc, behaviour: Behaviour, timer: PhaseTimer, depth: int = 1
    ) -> None:
        self.rollout, self.rollout_ahead, self.behaviour, self.timer = rollout, rollout_ahead, behaviour, timer
        self.depth = depth
        self.next_prompts: list[list[str]] = []  # the next steps' prompts, in order (set by `peeking`)
        self.in_flight: dict[int, InFlight] = {}  # by the global_step that trains on the rows
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
        """The rows in flight for `step` if they are its prompts sampled at most `depth` steps ago; rollouts for
        steps already past (none run in order; kept for safety) are dropped."""
        for past in [s for s in self.in_flight if s < step]:
            self.drop(self.in_flight.pop(past), step, "an earlier step's")
        done = self.in_flight.pop(step, None)
        if done is None:
            return None
        with self.timer.phase("generate"):  # the part of the rollout the step waits for
            rows = done.rows.result()  # re-raises the background rollout's error here
        if done.prompts != prompts or step - done.version > self.depth:
            self.drop(done, step, "the same" if done.prompts == prompts else "other")
            return None
        return rows

    def drop(self, done: InFlight, step: int, which: str) -> None:
        self.counts["dropped"] += 1
        log.warning("rollout ahead dropped at step %d: sampled at step %d for %s prompts", step, done.version, which)

    def start_next(self, trainer: GRPOTrainer) -> None:
        """Start the peeked steps' rollouts not yet in flight, up to `depth` steps ahead, on this step's weights."""
        upcoming, self.next_prompts = self.next_prompts, []
        now = trainer.state.global_step
        for step, nxt in enumerate(upcoming[: self.depth], start=now + 1):
            if step >= trainer.state.max_steps:
                return  # no step left to use it
            if step in self.in_flight:
                continue
            self.refreshed(trainer)
            self.in_flight[step] = InFlight(nxt, now, self.started(nxt, trainer, step))

    def started(self, prompts: list[str], trainer: GRPOTrainer, step: int) -> Future[dict[str, Any]]:
        rows: Future[dict[str, Any]] = Future()

        def work() -> None:
            try:
                rows.set_result(self.sampled(self.rollout_ahead, prompts, trainer, step))
            except BaseException as e:  # handed to the step that takes the rows
                rows.set_exception(e)

        # a daemon: a stopping stage does not wait for the next steps' rollouts
        threading.Thread(target=work, name=f"rlt-rollout-ahead-{step}", daemon=True).start()
        return rows

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

    def join(self, upto: int | None = None) -> None:
        """Wait for the rollouts in flight for steps up to `upto` (all without it), kept for their steps: the
        behaviour weights may change after this."""
        for step in sorted(self.in_flight):
            if upto is None or step <= upto:
                with self.timer.phase("generate"):
                    self.in_flight[step].rows.exception()


def peeking(trainer_cls: type) -> type:
    """A GRPOTrainer class whose get_batch_samples also takes the next optimizer steps' batches (as many as the
    trainer's RolloutAhead, `trainer.rollout_ahead`, starts ahead: its depth) from the epoch iterator and tells it
    their prompts. The trainer loop sets gradient sync itself (transformers 5: it prefetches a step's batches too),
    so reading steps early changes nothing else."""

    class Peeking(trainer_cls):  # type: ignore[misc]  # a base known only at run time
        rollout_ahead: RolloutAhead | None = None
        _peeked: tuple[Iterator[Any], list[list[Any]]] | None = None  # the iterator, the steps' batches read early

        def get_batch_samples(
            self, epoch_iterator: Iterator[Any], num_batches: int, device: torch.device
        ) -> tuple[list[Any], Any]:
            held, self._peeked = self._peeked, None
            early = held[1] if held is not None and held[0] is epoch_iterator else []
            if early:
                batches = early.pop(0)
                count = self._get_num_items_in_batch(batches, device)
            else:
                batches, count = super().get_batch_samples(epoch_iterator, num_batches, device)
            depth = self.rollout_ahead.depth if self.rollout_ahead is not None else 1
            while len(early) < depth:
                upcoming, _ = super().get_batch_samples(epoch_iterator, num_batches, device)
                if not upcoming:
                    break  # the epoch's end
                early.append(upcoming)
            if early:
                self._peeked = (epoch_iterator, early)
            if self.rollout_ahead is not None:
                # a step's first micro-batch is its whole generation batch (TRL: steps_per_generation = GA)
                self.rollout_ahead.next_prompts = [[row["prompt"] for row in b[0]] for b in early]
            return batches, count

    Peeking.__name__ = Peeking.__qualname__ = f"Peeking{trainer_cls.__name__}"
    return Peeking


def behaviour_is_old_policy(trainer: GRPOTrainer) -> None:
    """In-process: the rows' behaviour log-probs become TRL's old_per_token_logps (TRL leaves them unset when the
    generation batch is one optimizer step, taking the policy's own, detached: ratio 1), so GRPO's clipped ratio is
    π_θ/μ. Served (vLLM), TRL's importance sampling is the correction, its ratio made from the update's forward
    (rlt.stages.folded_ratio), which also leaves old_per_token_logps unset: setting it here too would correct twice
    (the clip around π_θ/μ, then the ratio again), so nothing is wrapped."""
    if trainer.use_vllm:
        return
    generate_and_score: Callable[..., dict[str, Any]] = trainer._generate_and_score_completions

    def with_behaviour(*a: Any, **kw: Any) -> dict[str, Any]:
        out = generate_and_score(*a, **kw)
        if out.get("old_per_token_logps") is None and out.get("sampling_per_token_logps") is not None:
            out["old_per_token_logps"] = out["sampling_per_token_logps"]
        return out

    trainer._generate_and_score_completions = with_behaviour  # type: ignore[method-assign]  # this trainer only


def wait_before_weight_push(
    trainer: GRPOTrainer, ahead: RolloutAhead, hold: Hold | None = None, timer: PhaseTimer | None = None
) -> None:
    """TRL pushes the policy's weights to the generators at the start of a step: the step's own rollout must have
    finished first, and every rank waits for the push to end before it sends the next rollout (only rank 0 talks to
    the server: the others would leave TRL's push at once, and their requests would meet the old weights or the old
    prefix cache). One step off, that rollout is all there is in flight (a request served across the push would mix
    two policies). With partial rollouts (`hold`: held_engine) the later steps' rollouts go on decoding: rank 0
    pushes inside `hold`, which keeps their rows through the push and makes them go on under the new weights.
    `timer`: the push, the hold's calls to the server and the ranks' wait for them are its "weight_sync" phase (the
    wait for the step's rollout is not: the rollout times itself)."""
    push: Callable[..., None] = trainer.vllm_generation.sync_weights  # TRL's is unannotated

    def after_rollouts(*a: Any, **kw: Any) -> None:
        ahead.join(upto=trainer.state.global_step)
        trainer.accelerator.wait_for_everyone()
        with timer.phase("weight_sync") if timer is not None else nullcontext():
            if hold is not None and trainer.accelerator.is_main_process:
                with hold():
                    push(*a, **kw)
            else:
                push(*a, **kw)
            trainer.accelerator.wait_for_everyone()

    trainer.vllm_generation.sync_weights = after_rollouts  # type: ignore[method-assign]  # this trainer only


Hold = Callable[[], AbstractContextManager[None]]


def resume_engine(base_url: str, timeout: float) -> None:
    """POST /resume (idempotent): a trainer killed inside held_engine's pause leaves the generators paused, and the
    next rollout would wait on them until its timeout; the stage sends it before its first step."""
    import requests

    r = requests.post(f"{base_url}/resume", timeout=timeout)
    if r.status_code != 200:
        raise RuntimeError(f"vLLM server {base_url}: POST /resume answered {r.status_code}: {r.text[:300]}")


def held_engine(base_url: str, timeout: float) -> Hold:
    """A context for the weight push with rows in flight on vLLM's server (0.31 in the CUDA images, 0.32 on CPU; dev
    mode; benchmarks/inflight_probe.py holds and preempts rows this way on the CPU server, every row then going on
    token for token): the scheduler
    paused with its running rows kept (POST /pause?mode=keep); after the block, their KV cache dropped, so each row
    goes on over a cache the new weights compute from its prompt and tokens so far (POST
    /reset_prefix_cache?reset_running_requests=true), and resumed (POST /resume, also when the block fails)."""

    def post(path: str, **params: str) -> None:
        import requests

        r = requests.post(f"{base_url}{path}", params=params, timeout=timeout)
        # /reset_prefix_cache answers 200 with {"success": false} when blocks are still held: rows would go on over
        # a cache the old weights computed, so that is a failure too
        failed = (
            r.status_code == 200 and "json" in r.headers.get("content-type", "") and r.json().get("success") is False
        )
        if r.status_code != 200 or failed:
            raise RuntimeError(f"vLLM server {base_url}: POST {path} answered {r.status_code}: {r.text[:300]}")

    @contextmanager
    def held() -> Iterator[None]:
        # clear_cache false: the KV cache is dropped once, after the push (vLLM 0.31/0.32 drop it at the pause too by
        # default, which the push would make stale anyway, and its docs say a future one will not)
        post("/pause", mode="keep", clear_cache="false")
        try:
            yield
            post("/reset_prefix_cache", reset_running_requests="true")
        finally:
            post("/resume")

    return held
