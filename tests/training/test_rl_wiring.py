"""Wiring of the rl stage that no number downstream would reveal: the teacher term of r_KL is the *current* policy's
log-prob of what it sampled, and the GRPO loss covers the whole sampled completion. Built from the project's real
grpo_config, rollout and reward with TRL's GRPOTrainer on the tiny model."""

from __future__ import annotations

import pytest
import torch
from suite_helpers import TINY

from rlt.checks.validation import load_valid_run
from rlt.contract.layout import RunLayout
from rlt.stages.context import StageContext
from rlt.stages.record import PhaseTimer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def trainer(tmp_path_factory, formatter):
    import os

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from datasets import Dataset
    from trl import GRPOTrainer

    from rlt.data.dataset import load_data
    from rlt.data.models import load_model, load_tokenizer
    from rlt.stages.rl import grpo_config, make_rollout, rl_rows
    from rlt.stages.rl_reward import reward_from_spec

    run = load_valid_run(TINY)
    spec = run.spec.model_dump(by_alias=True)
    spec["stages"]["rl"].update(steps=1, batchSize=8, numGenerations=4, perDeviceBatchSize=8, maxCompletionLength=8)
    run = run.model_validate({**run.model_dump(by_alias=True), "spec": spec})
    ctx = StageContext(run, RunLayout(tmp_path_factory.mktemp("wiring")), device="cpu", show_progress=False)
    st = run.spec.stages.rl
    tok = load_tokenizer(run.spec.teacher, padding_side="left")
    rows = rl_rows(load_data(run.spec.dataset, formatter.fmt).train[:4], formatter, tok, 256, "reject")
    reward = reward_from_spec(
        run.spec,
        load_model(run.spec.student, "cpu"),
        load_tokenizer(run.spec.student, "right"),
        formatter,
        teacher_tokenizer=tok,
    )
    rollout = make_rollout(tok, PhaseTimer(), st, {"generated_tokens": 0})
    seen: list[dict] = []

    def recorded(prompts, trainer):
        out = rollout(prompts, trainer)
        seen.append(out)
        return out

    trainer = GRPOTrainer(
        model=load_model(run.spec.teacher, "cpu", trainable=True),
        reward_funcs=[reward],
        args=grpo_config(ctx, "cpu"),
        train_dataset=Dataset.from_list(rows),
        processing_class=tok,
        rollout_func=recorded,
    )
    return trainer, rows, seen, st


def test_teacher_logprobs_are_the_current_policys(trainer):
    """Move the policy's weights, roll out: the teacher log-probs must follow the moved policy, not the start."""
    trainer, rows, seen, st = trainer
    model = trainer.model
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        torch.manual_seed(1)
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    prompts = [rows[0]["prompt"]] * trainer.num_generations
    out = trainer.rollout_func(prompts, trainer)
    moved = unmoved = 0.0
    start = type(model)(model.config).eval()
    start.load_state_dict(before)
    for p_ids, c_ids, lps in zip(out["prompt_ids"], out["completion_ids"], out["teacher_logprobs"], strict=True):
        seq = torch.tensor([p_ids + c_ids])
        with torch.no_grad():
            now = torch.log_softmax(model(seq).logits[0].float() / st.temperature, -1)
            then = torch.log_softmax(start(seq).logits[0].float() / st.temperature, -1)
        for i, (t, lp) in enumerate(zip(c_ids, lps, strict=False)):
            moved = max(moved, abs(now[len(p_ids) - 1 + i, t].item() - lp))
            unmoved = max(unmoved, abs(then[len(p_ids) - 1 + i, t].item() - lp))
    assert moved <= 1e-4  # the current policy's tempered log-probs
    assert unmoved > 1e-2  # and measurably not the starting policy's


def test_the_loss_covers_every_sampled_token(trainer):
    """What TRL's loss will see (completion ids and mask after `_generate_and_score_completions`, a private TRL
    method: the only place the batch exists) is exactly what the rollout sampled, truncated completions included."""
    trainer, rows, seen, _ = trainer
    inputs = [row for row in rows[:2] for _ in range(trainer.num_generations)]
    seen.clear()
    batch = trainer._generate_and_score_completions(inputs)
    sampled = seen[-1]["completion_ids"]
    assert any(trainer.processing_class.eos_token_id not in c for c in sampled)  # some are truncated
    for k, ids in enumerate(sampled):
        mask = batch["completion_mask"][k].bool()
        assert batch["completion_ids"][k][mask].tolist() == ids
        assert batch["prompt_ids"][k][batch["prompt_mask"][k].bool()].tolist() == seen[-1]["prompt_ids"][k]
