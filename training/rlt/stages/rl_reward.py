"""The RLT reward built from a run's spec (rlt.method.reward holds the reward itself): its parameters from
stages.rl.reward and the scoring micro-batch's token cap from the capacity plan."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rlt.method.reward import RLTReward
from rlt.spec.stages import student_temperature, teacher_temperature

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from rlt.method.prompts import Formatter
    from rlt.method.reward import GrpoReward
    from rlt.spec.run import RLTRunSpec
    from rlt.stages.record import PhaseTimer


def reward_from_spec(
    spec: RLTRunSpec,
    student: PreTrainedModel,
    student_tokenizer: PreTrainedTokenizerBase,
    formatter: Formatter,
    teacher: PreTrainedModel | None = None,
    teacher_tokenizer: PreTrainedTokenizerBase | None = None,
) -> RLTReward:
    r = spec.stages.rl.reward
    return RLTReward(
        student,
        student_tokenizer,
        formatter,
        alpha=r.alpha,
        kl_weight=r.kl_weight,
        format_penalty=r.format_penalty,
        temperature=student_temperature(spec),
        teacher_temperature=teacher_temperature(spec),  # the policy samples, and is scored, at rl's temperature
        teacher=teacher,
        teacher_tokenizer=teacher_tokenizer,
        batch_size=r.batch_size,
        share_prefix=r.share_prefix,
        max_batch_tokens=scoring_batch_tokens(spec, student),
    )


def scoring_batch_tokens(spec: RLTRunSpec, student: PreTrainedModel) -> int:
    """The scoring micro-batch's token cap: stages.rl.reward.maxBatchTokens, else the capacity plan's for this
    student on its device (the GPU's memory; on CPU the plan's assumed GPU, rlt.checks.capacity.DEFAULT_GPU_MEMORY)."""
    r = spec.stages.rl.reward
    if r.max_batch_tokens is not None:
        return r.max_batch_tokens
    import torch

    from rlt.checks.capacity import DEFAULT_GPU_MEMORY, scoring_token_cap
    from rlt.checks.shapes import shape_of_config
    from rlt.data.models import is_cuda

    device = student.device
    memory = torch.cuda.get_device_properties(device).total_memory if is_cuda(str(device)) else DEFAULT_GPU_MEMORY
    shape = shape_of_config(student.config, "the loaded student")
    return scoring_token_cap(spec, shape, memory, dtype_bytes=student.dtype.itemsize)


class TimedReward:
    """A reward as TRL calls it, each call timed as the step's "score" phase; TRL names it by the reward's name."""

    def __init__(self, reward: GrpoReward, timer: PhaseTimer) -> None:
        self.reward, self.timer = reward, timer
        self.__name__ = reward.__name__

    def __call__(
        self, prompts: list[Any], completions: list[Any], question: list[str], solution: list[str], **extra: Any
    ) -> list[float]:
        with self.timer.phase("score"):
            return self.reward(prompts, completions, question, solution, **extra)
