"""The distill stage's settings: the trained teacher explains every question, the best candidate is kept."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from rlt.contract.stage_registry import stage_info
from rlt.spec.stage_settings import Rollout, StageSettings
from rlt.spec.stages.rl import generation, teacher_prompt_tokens, teacher_temperature


class DistillStage(StageSettings):
    """The trained teacher explains every question; the best of N candidates (by RLT reward) is kept."""

    enabled: bool = Field(True, description="Run this stage.")
    samples_per_question: int = Field(1, gt=0, description="Candidates per question, ranked by the RLT reward.")
    temperature: float = Field(0.7, gt=0, description="Sampling temperature of the explanations.")
    max_new_tokens: int = Field(16384, gt=0, description="Longest explanation in tokens.")
    limit: int | None = Field(None, gt=0, description="Explain at most this many questions.")
    batch_size: int = Field(8, gt=0, description="Questions generated together.")

    def rollout(self, spec: Any) -> Rollout | None:
        # the ranks finish their shares at different times: the gather waits at most one batch of the slowest rank
        gen = generation(spec)  # distill samples where rl does
        wait = gen.server_timeout_seconds if gen.mode == "server" else 0
        return Rollout(self.batch_size * self.samples_per_question, self.max_new_tokens, wait)

    def run_problems(self, name: str, spec: Any) -> list[str]:
        gen = generation(spec)
        served = stage_info(name).uses_generators and gen.mode == "server"  # rlt.spec.run.needs_generators
        if not (self.enabled and served):
            return []
        out = []
        rl_temperature = teacher_temperature(spec)
        if self.temperature != rl_temperature:
            # served, the teacher's log-probs are the generators' at the sampling temperature, and the distill pod
            # holds no teacher model to score at another (in process it does: rlt.stages.distill rescores)
            out.append(
                f"stages.{name}.temperature: {self.temperature} differs from stages.rl.temperature "
                f"{rl_temperature}, the teacher's temperature in the reward RL optimises: served, the teacher's "
                "log-probs come from the generators at the sampling temperature, so the best of N would be ranked "
                "by another reward; set them equal, or generate in process"
            )
        need = teacher_prompt_tokens(spec) + self.max_new_tokens
        if gen.max_model_len and need > gen.max_model_len:
            out.append(
                f"stages.rl.generation.maxModelLen: {gen.max_model_len} is below stages.rl.maxPromptLength + "
                f"stages.{name}.maxNewTokens = {need} (the generators serve {name} too)"
            )
        return out
