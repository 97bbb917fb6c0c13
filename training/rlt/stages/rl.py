"""Stage `rl`: GRPO of the teacher with the RLT reward (TRL GRPOTrainer).

Generation goes through a rollout function so that the teacher's log-probs of every sampled token come back
with the sample (in-process sampling, or vLLM's returned logprobs in server mode) and reach the reward: the
r_KL teacher term then costs no extra forward. In server mode TRL keeps the vLLM weights in sync every step.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

from rlt.contract.env import RANK
from rlt.data.dataset import load_data
from rlt.data.errors import DataError, sift_rows
from rlt.data.models import is_cuda, load_model, load_tokenizer, torch_dtype
from rlt.method.generation import sample_with_logprobs
from rlt.method.prompts import Formatter
from rlt.spec.inputs import ModelRef
from rlt.stages import overlap
from rlt.stages.context import StageContext
from rlt.stages.record import PhaseTimer, trace_line
from rlt.stages.reference import keep_reference_in_checkpoints
from rlt.stages.rl_reward import TimedReward, reward_from_spec, scorable_rows
from rlt.stages.start_models import newest_teacher
from rlt.stages.trainer import TrainerRun, trainer_options

if TYPE_CHECKING:
    import torch
    from accelerate import Accelerator
    from transformers import PreTrainedModel, PreTrainedTokenizerBase, Trainer
    from trl.trainer.callbacks import SyncRefModelCallback
    from trl.trainer.grpo_config import GRPOConfig
    from trl.trainer.grpo_trainer import GRPOTrainer, RolloutFunc

    from rlt.method.reward import GrpoReward
    from rlt.method.scoring import SpanScorer
    from rlt.spec.stages import RlStage
    from rlt.stages.balance import BalanceFigures
    from rlt.stages.folded_ratio import FoldedTrainer
    from rlt.stages.preemption import StopRequest

    # TRL's soft update of a reference from a policy: (policy, reference, alpha)
    ParamSync = Callable[[torch.nn.Module, torch.nn.Module, float], None]

log = logging.getLogger(__name__)


def teacher_start(ctx: StageContext) -> ModelRef:
    """RL starts from the SFT model when the run has an SFT stage, else from spec.teacher."""
    return newest_teacher(ctx, "rl")[0]


def rl_rows(
    rows: list[dict[str, Any]],
    formatter: Formatter,
    tokenizer: PreTrainedTokenizerBase,
    max_prompt_tokens: int,
    bad_rows: str,
    where: Callable[[int], str] = lambda i: f"row {i}",
) -> list[dict[str, str]]:
    """`where(row)` names a row as the user's file does ('line N', LoadedData.where)."""

    def problem(r: dict[str, Any]) -> str | None:
        n = len(tokenizer(r["prompt"], add_special_tokens=False).input_ids)
        if n <= max_prompt_tokens:
            return None
        return (
            f"{where(r['row'])}: teacher prompt is {n} tokens, over spec.stages.rl.maxPromptLength="
            f"{max_prompt_tokens} (raise it, or set spec.dataset.badRows: skip)"
        )

    prompted = [{**r, "prompt": formatter.teacher_prompt(tokenizer, r["question"], r["solution"])} for r in rows]
    kept = sift_rows(prompted, problem, bad_rows, "rl", "too long")
    return [{"prompt": r["prompt"], "question": r["question"], "solution": r["solution"]} for r in kept]


def sample_policy(
    trainer: GRPOTrainer,
    tokenizer: PreTrainedTokenizerBase,
    prompt_ids: list[list[int]],
    num_generations: int,
    st: RlStage,
) -> tuple[list[list[int]], list[list[float]]]:
    """Completions of the current policy with the tempered log-prob of every sampled token.

    `prompt_ids` holds each prompt `num_generations` times (TRL's layout). Server mode: TRL's vLLM client, whose
    weights TRL has synced for this step; in-process: the unwrapped policy samples itself; inside a one-step-off
    rollout (rlt.stages.overlap): its behaviour policy."""
    ahead = overlap.behaviour_sampler()
    if ahead is not None:
        return ahead(prompt_ids)
    if trainer.use_vllm:
        _, completion_ids, logprobs, _ = trainer.vllm_generation.generate(
            prompts=prompt_ids, images=None, num_generations=num_generations
        )
        return completion_ids, [[lp[0] for lp in seq] for seq in logprobs]  # sampled token's (processed) logprob
    from trl.models import unwrap_model_for_generation

    args = cast("GRPOConfig", trainer.args)  # a GRPOTrainer's args are its GRPOConfig
    with unwrap_model_for_generation(
        trainer.model_wrapped, trainer.accelerator, gather_deepspeed3_params=args.ds3_gather_for_generation
    ) as m:
        was_training = m.training
        m.eval()
        s = sample_with_logprobs(
            m,
            tokenizer,
            prompt_ids,
            temperature=st.temperature,
            top_p=st.top_p,
            max_new_tokens=st.max_completion_length,
        )
        m.train(was_training)
    return s.completion_ids, s.logprobs


COUNT_LOCK = threading.Lock()


def make_rollout(
    tokenizer: PreTrainedTokenizerBase, timer: PhaseTimer, st: RlStage, counters: dict[str, int]
) -> RolloutFunc:
    def rollout(prompts: list[str], trainer: GRPOTrainer) -> dict[str, Any]:
        # Which rows this rank drew (short hashes): the multi-process tests check that ranks train their own shard.
        drawn = sorted({hashlib.sha1(p.encode()).hexdigest()[:8] for p in prompts})
        trace_line(
            f"rlt-shard stage=rl rank={os.environ.get(RANK.name, '0')} step={trainer.state.global_step} "
            f"prompts={','.join(drawn)}"
        )
        prompt_ids = [tokenizer(p, add_special_tokens=False).input_ids for p in prompts]  # = sft.teacher_prompt_ids
        with timer.phase("generate"):
            group = cast(int, trainer.num_generations)  # grpo_options always sets num_generations
            completion_ids, logprobs = sample_policy(trainer, tokenizer, prompt_ids, group, st)
        with COUNT_LOCK:  # rollouts ahead of the update count from their own threads
            counters["generated_tokens"] += sum(len(c) for c in completion_ids)
        return {
            "prompt_ids": prompt_ids,
            "completion_ids": completion_ids,
            "logprobs": logprobs,
            "teacher_logprobs": logprobs,
        }

    return rollout


# spec.stages.rl.generation.importanceSampling -> TRL's vllm_importance_sampling_mode. "off" is no mode: the
# correction is switched off (vllm_importance_sampling_correction=False) and TRL's mode is left unset.
IS_MODES = {
    "sequenceMask": "sequence_mask",
    "sequenceTruncate": "sequence_truncate",
    "tokenMask": "token_mask",
    "tokenTruncate": "token_truncate",
}


def grpo_config(ctx: StageContext, device: str) -> GRPOConfig:
    """TRL GRPOConfig from spec.stages.rl and its trainerArgs (which may not repeat a key rlt sets)."""
    from trl import GRPOConfig

    return GRPOConfig(**grpo_options(ctx, device), **ctx.spec.stages.rl.trainer_args)


def grpo_options(ctx: StageContext, device: str) -> dict[str, Any]:
    """The GRPOConfig options rlt sets from spec.stages.rl (spec.stages.RL_OWNED_ARGS lists them): one generation
    round per optimizer step, the paper's loss settings."""
    spec, st = ctx.spec, ctx.spec.stages.rl
    world = ctx.world_size()
    ga = st.batch_size // (st.per_device_batch_size * world)
    if ga < 1 or st.batch_size % (st.per_device_batch_size * world):
        raise ValueError(
            f"stages.rl.batchSize ({st.batch_size}) must be a multiple of perDeviceBatchSize × processes "
            f"({st.per_device_batch_size} × {world})"
        )
    gen = st.generation
    depth = overlap.steps_off_policy(st)  # rows sampled steps ahead of the update (rlt.stages.overlap)
    ahead = depth > 0
    server, colocate = gen.mode == "server", gen.mode == "colocate"
    if server and not gen.server_url:
        raise ValueError("stages.rl.generation.serverUrl: required when mode is server (the operator sets it)")
    if colocate and not is_cuda(device):
        raise ValueError(
            "stages.rl.generation.mode: colocate runs vLLM inside the trainer on its GPU; on CPU use "
            "inprocess (vLLM's CPU build cannot take TRL's in-place weight updates)"
        )
    if ahead and server and gen.importance_sampling == "off":
        raise ValueError(
            f"stages.rl.generation.importanceSampling: overlap {overlap.OVERLAP_OF_DEPTH[depth]} needs TRL's importance "
            "sampling (a row is sampled updates before it is trained on); choose a mode, e.g. tokenTruncate"
        )
    correct_is = (server or colocate) and gen.importance_sampling != "off"
    vllm: dict[str, Any] = {"use_vllm": server or colocate, "vllm_mode": "colocate" if colocate else "server"}
    if colocate:  # vLLM shares each rank's GPU with training: unless set, TRL's 30 % (not a generator pod's 90 %)
        share = gen.gpu_memory_utilization if "gpu_memory_utilization" in gen.model_fields_set else 0.3
        # sleep mode: the engine frees its weights and KV cache while the trainer updates, TRL wakes it to generate
        vllm.update(
            vllm_gpu_memory_utilization=share, vllm_max_model_length=gen.max_model_len, vllm_enable_sleep_mode=True
        )
    return dict(
        max_steps=st.steps,
        gradient_accumulation_steps=ga,
        steps_per_generation=ga,
        num_generations=st.num_generations,
        num_iterations=1,
        max_completion_length=st.max_completion_length,
        temperature=st.temperature,
        top_p=st.top_p,
        top_k=0,
        beta=st.beta,
        loss_type=st.loss_type,
        scale_rewards="group",
        mask_truncated_completions=False,
        # TRL cannot soft-update a PEFT model's reference (with LoRA the reference is the frozen base)
        sync_ref_model=st.ref_sync.enabled and st.beta > 0 and spec.teacher.lora is None,
        ref_model_mixup_alpha=st.ref_sync.alpha,
        ref_model_sync_steps=st.ref_sync.steps,
        # the reference model in the teacher's dtype, not the fp32 of a policy holding master weights (master_fp32)
        model_init_kwargs={"dtype": str(torch_dtype(spec.teacher, device)).removeprefix("torch.")},
        **vllm,
        vllm_server_base_url=gen.server_url,
        vllm_server_timeout=gen.server_timeout_seconds,
        # clean sampling (docs/reward.md): nothing but τ and top-p shapes the distribution
        repetition_penalty=1.0,
        min_p=None,
        vllm_importance_sampling_correction=correct_is,
        **({"vllm_importance_sampling_mode": IS_MODES[gen.importance_sampling]} if correct_is else {}),
        vllm_importance_sampling_clip_max=gen.importance_sampling_cap,
        **trainer_options(ctx, "rl", device),
    )


def pairwise_ref_sync(trl_callback: SyncRefModelCallback, zero3: bool) -> SyncRefModelCallback:
    """TRL's reference soft-sync (ref ← α·policy + (1−α)·ref every refSync.steps), done one parameter pair at a time.

    TRL's SyncRefModelCallback gathers EVERY policy and reference parameter at once under ZeRO-3: a full 16-bit copy
    of both models on each GPU for the moment of the sync (2 × 15 GB for a 7B pair, on top of the step's memory). Here
    each (policy, reference) pair is gathered, updated by TRL's own formula on rank 0 and released before the next, so
    the sync costs two of the largest tensors, not two models. `trl_callback` is TRL's instance (its ref model and
    accelerator); the returned callback replaces it."""
    from trl.trainer.callbacks import SyncRefModelCallback

    class PairwiseSyncRefModelCallback(SyncRefModelCallback):
        def sync_target_model(  # type: ignore[override]
            self, model: torch.nn.Module, target_model: torch.nn.Module, alpha: float
        ) -> None:
            if not zero3:
                whole: ParamSync = SyncRefModelCallback._sync_target_model  # TRL's is unannotated
                return whole(model, target_model, alpha)
            import deepspeed

            for target, source in zip(target_model.parameters(), model.parameters(), strict=True):
                with deepspeed.zero.GatheredParameters([source, target], modifier_rank=0):
                    if deepspeed.comm.get_rank() == 0:
                        target.data.mul_(1.0 - alpha).add_(source.data, alpha=alpha)
            return None

    return PairwiseSyncRefModelCallback(ref_model=trl_callback.ref_model, accelerator=trl_callback.accelerator)


def use_pairwise_ref_sync(trainer: Trainer, zero3: bool) -> bool:
    """Swap TRL's reference-sync callback (when the trainer has one) for `pairwise_ref_sync`'s."""
    from trl.trainer.callbacks import SyncRefModelCallback

    for cb in list(trainer.callback_handler.callbacks):
        if type(cb) is SyncRefModelCallback:
            trainer.remove_callback(cb)
            trainer.add_callback(pairwise_ref_sync(cb, zero3))
            return True
    return False


def stoppable_rollout(rollout: RolloutFunc, stop: StopRequest) -> RolloutFunc:
    """The rollout, then the gang's agreement on a stop (rlt.stages.preemption.stop_point): the rollout is the
    longest phase of a step (the longest completion plus the transfer), and no gradient exists yet."""
    from rlt.stages.preemption import stop_point

    def rollout_then_agree(prompts: list[str], trainer: GRPOTrainer) -> dict[str, Any]:
        out = rollout(prompts, trainer)
        stop_point(stop, trainer.state, "after the rollout")
        return out

    return rollout_then_agree


def stoppable_scoring(trainer: GRPOTrainer, stop: StopRequest) -> None:
    """The gang agrees on a stop after the reference and old-policy passes (TRL runs them right before the rewards)
    and after the scoring, still before the step's first backward."""
    from rlt.stages.preemption import stop_point

    calculate: Callable[..., torch.Tensor] = trainer._calculate_rewards  # TRL's is unannotated

    def agreed_around(*a: Any, **kw: Any) -> torch.Tensor:
        stop_point(stop, trainer.state, "after the reference and old-policy passes")
        out = calculate(*a, **kw)
        stop_point(stop, trainer.state, "after the scoring")
        return out

    trainer._calculate_rewards = agreed_around  # type: ignore[method-assign]  # wrapped on this trainer only


def partition_frozen(scorer: SpanScorer, accelerator: Accelerator) -> bool:
    """A frozen scoring model prepared the way TRL prepares its reference and reward models under DeepSpeed
    (trl.models.prepare_deepspeed): under ZeRO-3 its parameters are partitioned across the ranks, so each rank
    holds 1/world of it between steps; each score() call gathers it whole (TRL's unwrap_model_for_generation) and
    partitions it again. Under ZeRO 0-2 nothing changes (TRL then keeps a whole copy per rank too). True when
    partitioned."""
    plugin = getattr(accelerator.state, "deepspeed_plugin", None)
    if plugin is None or plugin.deepspeed_config.get("zero_optimization", {}).get("stage") != 3:
        return False
    from trl.models import prepare_deepspeed, unwrap_model_for_generation

    engine = prepare_deepspeed(scorer.model, accelerator)
    scorer.gathered = lambda: unwrap_model_for_generation(engine, accelerator, gather_deepspeed3_params=True)
    log.info("frozen %s partitioned by ZeRO-3 across %d ranks", type(scorer.model).__name__, accelerator.num_processes)
    return True


def clipped_share(
    ratio: torch.Tensor, completion_mask: torch.Tensor, mode: str, cap: float, floor: float | None
) -> tuple[float, float]:
    """(masked or clipped entries, all entries) of TRL's importance-sampling ratio: per sequence in sequence
    modes (ratio shape [B, 1]), per completion token in token modes. Masking writes 0, truncation clamps."""
    import torch

    valid = torch.ones_like(ratio, dtype=torch.bool) if ratio.shape[-1] == 1 else completion_mask.bool()
    if mode.endswith("mask"):
        hit = ratio == 0
    else:
        hit = ratio >= cap * (1 - 1e-6)
        if floor is not None:
            hit |= ratio <= floor * (1 + 1e-6)
    return float((hit & valid).sum()), float(valid.sum())


def rollout_ahead(
    ctx: StageContext,
    args: GRPOConfig,
    tokenizer: PreTrainedTokenizerBase,
    rollout: RolloutFunc,
    rollout_in_background: RolloutFunc,
    timer: PhaseTimer,
) -> overlap.RolloutAhead | None:
    """The rollouts ahead of the update (rlt.stages.overlap) when generation.overlap asks for them: on the generators
    in server mode (TRL pushes the weights; one client process per rollout in flight), in-process with a copy of the
    policy (one step off only: the spec refuses partial rollouts there)."""
    st = ctx.spec.stages.rl
    depth = overlap.steps_off_policy(st)
    if not depth:
        return None
    if args.use_vllm:
        url = cast(str, st.generation.server_url)  # grpo_options: server mode has a serverUrl
        timeout = st.generation.server_timeout_seconds
        in_flight = overlap.groups_in_flight(st, ctx.spec.resources.generator, ctx.world_size())
        behaviour: overlap.Behaviour = overlap.ServedBehaviour(url, st, timeout, clients=depth, in_flight=in_flight)
    else:
        behaviour = overlap.LocalBehaviour(tokenizer, st)
    log.info(
        "stage rl: rollouts up to %d steps ahead (%s, overlap %s)",
        depth,
        type(behaviour).__name__,
        st.generation.overlap,
    )
    return overlap.RolloutAhead(rollout, rollout_in_background, behaviour, timer, depth)


def train_grpo(
    ctx: StageContext,
    device: str,
    start: ModelRef,
    tokenizer: PreTrainedTokenizerBase,
    rows: list[dict[str, Any]],
    reward: GrpoReward,
    make_rollout_fn: Callable[[PhaseTimer, dict[str, int]], RolloutFunc],
    reward_values: Callable[[], dict[str, float]],
    frozen: Sequence[SpanScorer] = (),
) -> str:
    """What every GRPO stage shares: config, step timing split by phase, the record, checkpoints, the final model.

    `reward` is any reward of the protocol (rlt.method.reward.GrpoReward: RLTReward, RCLReward or a method's own);
    `make_rollout_fn(timer, counters)` builds the method's rollout (it times "generate" and counts generated
    tokens); TRL's call of the reward is timed as "score"; `reward_values()` adds the method's per-step numbers; `frozen`
    lists the SpanScorers of frozen models, partitioned under ZeRO-3 once the trainer's accelerator exists."""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is experimental in TRL 1.16
    from trl import GRPOTrainer

    from rlt.stages.balance import rank_balanced
    from rlt.stages.folded_ratio import folded_ratio
    from rlt.stages.padding import padding_trimmed

    too_few = ctx.spec.stages.rl.training_rows_problem(len(rows), ctx.spec.dataset.source)  # the door's check, here
    if too_few:  # on the rows left after the stage's own sifting (too long, unscorable)
        raise DataError(too_few)
    args = grpo_config(ctx, device)
    timer, ahead_timer = PhaseTimer(), PhaseTimer()  # the step's phases; a one-step-off rollout's, overlapping them
    counters = {"generated_tokens": 0}
    clipped = {"hit": 0.0, "all": 0.0}

    def step_values(step_seconds: float) -> dict[str, float]:
        phases = timer.take()
        values = {f"seconds_{k}": v for k, v in phases.items()}
        values["seconds_update"] = max(0.0, step_seconds - sum(phases.values()))
        values.update({f"seconds_{k}_ahead": v for k, v in ahead_timer.take().items()})
        values.update(reward_values())
        if clipped["all"]:
            values["importance_sampling_clipped"] = clipped["hit"] / clipped["all"]
            clipped.update(hit=0.0, all=0.0)
        with COUNT_LOCK:
            values["generated_tokens"], counters["generated_tokens"] = counters["generated_tokens"], 0
        values["tokens_per_second"] = values["generated_tokens"] / step_seconds if step_seconds > 0 else 0.0
        # rlt.stages.balance: the step's rank imbalance (the trainer is rank_balanced's class)
        values.update(cast("BalanceFigures", trainer).balance_figures())
        return values

    run = TrainerRun(ctx, "rl", start, tokenizer, device, ctx.spec.stages.rl.steps)
    # each micro-batch's model calls on its own tokens (rlt.stages.padding), rows dealt across ranks by tokens
    # TRL's importance ratio from the update's own forward, no separate old-policy pass (rlt.stages.folded_ratio)
    trainer_cls: type[GRPOTrainer] = folded_ratio(rank_balanced(padding_trimmed(GRPOTrainer)))
    rollout = make_rollout_fn(timer, counters)
    ahead = rollout_ahead(ctx, args, tokenizer, rollout, make_rollout_fn(ahead_timer, counters), timer)
    if ahead is not None:  # the trainer peeks the next step's prompts for it
        trainer_cls = overlap.peeking(trainer_cls)
    trainer = run.trainer(
        trainer_cls,
        args,
        rows,
        step_values,
        reward_funcs=[TimedReward(reward, timer)],
        rollout_func=stoppable_rollout(ahead or rollout, run.stop),  # the stop agreement stays on the step's thread
    )
    if ahead is not None:
        trainer.rollout_ahead = ahead  # type: ignore[attr-defined]  # overlap.peeking's attribute
        overlap.behaviour_is_old_policy(trainer)
    stoppable_scoring(trainer, run.stop)
    for scorer in frozen:
        partition_frozen(scorer, trainer.accelerator)
    ds = args.deepspeed if isinstance(args.deepspeed, dict) else {}
    use_pairwise_ref_sync(trainer, zero3=ds.get("zero_optimization", {}).get("stage") == 3)
    keep_reference_in_checkpoints(trainer)  # a resume continues with the synced reference, not the start model
    if args.use_vllm and ahead is not None:  # the push after the step's rollout, timed with the hold's calls
        gen = ctx.spec.stages.rl.generation
        hold = None
        if ahead.depth > 1:  # partial rollouts: the later steps' rows held through the push (overlap.held_engine)
            hold = overlap.held_engine(cast(str, gen.server_url), gen.server_timeout_seconds)
            if trainer.accelerator.is_main_process:  # a run killed inside a hold left the generators paused
                overlap.resume_engine(cast(str, gen.server_url), gen.server_timeout_seconds)
        overlap.wait_before_weight_push(trainer, ahead, hold, timer)
    elif args.use_vllm:  # time TRL's weight push to vLLM (server or colocated) as its own phase
        sync: Callable[..., None] = trainer.vllm_generation.sync_weights  # TRL's is unannotated

        def timed_sync(*a: Any, **kw: Any) -> None:
            with timer.phase("weight_sync"):
                return sync(*a, **kw)

        trainer.vllm_generation.sync_weights = timed_sync  # type: ignore[method-assign]  # wrapped on this trainer only
    if args.use_vllm and args.vllm_importance_sampling_correction:
        count_clipped_ratio(trainer, args, clipped)
    return run.train(trainer)


def count_clipped_ratio(trainer: GRPOTrainer, args: GRPOConfig, clipped: dict[str, float]) -> None:
    """Adds the share of TRL's importance-sampling ratio it masked or clipped to `clipped` (hit, all): TRL logs the
    ratio's min/mean/max, the share is what says how much loss was dropped. Folded (rlt.stages.folded_ratio), each
    micro-batch's loss makes the ratio; else TRL's scoring does."""

    def count(ratio: torch.Tensor, completion_mask: torch.Tensor) -> None:
        hit, total = clipped_share(
            ratio,
            completion_mask,
            args.vllm_importance_sampling_mode,
            cast(float, args.vllm_importance_sampling_clip_max),  # grpo_options sets it (importanceSamplingCap)
            args.vllm_importance_sampling_clip_min,
        )
        clipped["hit"] += hit
        clipped["all"] += total

    if cast("FoldedTrainer", trainer).fold_ratio:
        cast("FoldedTrainer", trainer).ratio_seen = count
        return
    generate_and_score = trainer._generate_and_score_completions

    def counted(*a: Any, **kw: Any) -> dict[str, Any]:
        out = generate_and_score(*a, **kw)
        count(out["importance_sampling_ratio"], out["completion_mask"])
        return out

    trainer._generate_and_score_completions = counted  # type: ignore[method-assign]  # on this trainer only


def run_rl(ctx: StageContext) -> str:
    spec, st = ctx.spec, ctx.spec.stages.rl
    device = ctx.compute_device  # before the student is loaded onto it
    formatter = ctx.formatter
    start = teacher_start(ctx)
    tokenizer: PreTrainedTokenizerBase = load_tokenizer(start, padding_side="left")
    data = load_data(spec.dataset, formatter.fmt)
    student_tok: PreTrainedTokenizerBase = load_tokenizer(spec.student, padding_side="right")
    train = scorable_rows(data.train, formatter, student_tok, spec.dataset.bad_rows, "rl", data.where)
    rows = rl_rows(train, formatter, tokenizer, st.max_prompt_length, spec.dataset.bad_rows, data.where)

    student: PreTrainedModel = load_model(spec.student, device)
    reward = reward_from_spec(spec, student, student_tok, formatter, teacher_tokenizer=tokenizer)
    scored = {"last": 0}

    def reward_values() -> dict[str, float]:
        values: dict[str, float] = {}
        if reward.last is not None:
            values.update({k: v for k, v in reward.last.means().items() if k != "total"})  # incl. pairing_coverage
            values["explanation_tokens"] = sum(reward.last.explanation_tokens) / max(
                1, len(reward.last.explanation_tokens)
            )
        values["scored_tokens"], scored["last"] = (
            reward.scored_tokens_total - scored["last"],
            reward.scored_tokens_total,
        )
        return values

    def rollout(timer: PhaseTimer, counters: dict[str, int]) -> RolloutFunc:
        return make_rollout(tokenizer, timer, st, counters)

    return train_grpo(ctx, device, start, tokenizer, rows, reward, rollout, reward_values, frozen=[reward.student])
