"""The RLT reward built from a run's spec (rlt.method.reward holds the reward itself): its parameters from
stages.rl.reward and the scoring micro-batch's token cap from the capacity plan."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rlt.data.errors import sift_rows
from rlt.method.prompts import scored_solution_tokens
from rlt.method.reward import RLTReward
from rlt.spec.stages import student_temperature, teacher_temperature

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from rlt.method.prompts import Formatter
    from rlt.method.reward import GrpoReward
    from rlt.spec.run import RLTRunSpec
    from rlt.stages.record import PhaseTimer


def scorable_rows(
    rows: list[dict[str, Any]],
    formatter: Formatter,
    student_tokenizer: PreTrainedTokenizerBase,
    bad_rows: str,
    stage: str,
    where: Callable[[int], str] = lambda i: f"row {i}",
) -> list[dict[str, Any]]:
    """The rows whose solution r_SS can score, checked before the stage trains: a solution that merges into its tags
    (".", "=") has no token of its own, and its reward could only fail at whatever step first drew it."""

    def problem(r: dict[str, Any]) -> str | None:
        if scored_solution_tokens(formatter, student_tokenizer, r["question"], r["solution"]) > 0:
            return None
        return (
            f"{where(r['row'])}: solution {r['solution']!r} has no token of its own in the student's chat (it merges "
            "into the answer tags), so the reward cannot score it: write the full answer, or set "
            "spec.dataset.badRows: skip"
        )

    return sift_rows(rows, problem, bad_rows, stage, "unscorable")


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
