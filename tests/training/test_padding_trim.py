"""No padding compute: every model call of the GRPO step (policy forward/backward, reference and old-policy
forwards) sees only its micro-batch's attended columns, and the loss, its gradient and the reference log-probs are
those of TRL's untrimmed computation. TRL's own GRPOTrainer on the tiny Qwen2, a hand-made padded batch with one
long completion among short ones (the shape TRL's generation batch has)."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def trainers(tmp_path_factory, tiny_ref):
    import os

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from rlt.data.models import load_model, load_tokenizer
    from rlt.stages.padding import padding_trimmed

    tok = load_tokenizer(tiny_ref)
    args = GRPOConfig(
        output_dir=str(tmp_path_factory.mktemp("trim")),
        per_device_train_batch_size=1,
        gradient_accumulation_steps=4,
        steps_per_generation=4,
        num_generations=2,
        beta=0.04,
        loss_type="grpo",
        use_cpu=True,
        bf16=False,
        report_to=[],
        disable_tqdm=True,
    )
    data = Dataset.from_list([{"prompt": "2+2="}] * 4)

    def reward(completions, **kw):
        return [0.0] * len(completions)

    torch.manual_seed(0)
    model = load_model(tiny_ref, "cpu", trainable=True)
    made = {}
    for name, cls in (("plain", GRPOTrainer), ("trimmed", padding_trimmed(GRPOTrainer))):
        made[name] = cls(model=model, args=args, train_dataset=data, processing_class=tok, reward_funcs=[reward])
        made[name].current_gradient_accumulation_steps = 4  # what Trainer's training loop sets before a step
    return made


def padded_batch(rows: int = 4, long: int = 40, short: int = 3, seed: int = 0) -> dict[str, torch.Tensor]:
    """prompt_ids left-padded to the longest prompt, completion_ids right-padded to the one long completion."""
    g = torch.Generator().manual_seed(seed)
    p_lens, c_lens = [5, 9, 7, 6][:rows], [long] + [short + i for i in range(rows - 1)]
    p_w, c_w = max(p_lens), max(c_lens)
    out = {k: torch.zeros(rows, w, dtype=torch.long) for k, w in
           (("prompt_ids", p_w), ("prompt_mask", p_w), ("completion_ids", c_w), ("completion_mask", c_w))}  # fmt: skip
    for i, (p, c) in enumerate(zip(p_lens, c_lens, strict=True)):
        out["prompt_ids"][i, p_w - p :] = torch.randint(3, 500, (p,), generator=g)
        out["prompt_mask"][i, p_w - p :] = 1
        out["completion_ids"][i, :c] = torch.randint(3, 500, (c,), generator=g)
        out["completion_mask"][i, :c] = 1
    return out


def counted_tokens(model):
    """(processed, attended) token counts of every forward of `model` from here on."""
    seen = {"processed": 0, "attended": 0}

    def hook(module, args, kwargs):
        seen["processed"] += kwargs["input_ids"].numel()
        seen["attended"] += int(kwargs["attention_mask"].sum())

    return seen, model.register_forward_pre_hook(hook, with_kwargs=True)


def logps(trainer, batch, batch_size=1):
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    with torch.no_grad():
        lp, _, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model, ids, mask, batch["completion_ids"].size(1), batch_size=batch_size
        )
    return lp * batch["completion_mask"]


def test_reference_logps_equal_and_only_real_tokens_processed(trainers):
    batch = padded_batch()
    plain = logps(trainers["plain"], batch)
    seen, handle = counted_tokens(trainers["trimmed"].model)
    try:
        trimmed = logps(trainers["trimmed"], batch)
    finally:
        handle.remove()
    assert trimmed.shape == plain.shape
    torch.testing.assert_close(trimmed, plain, atol=1e-5, rtol=1e-4)
    # one row per chunk: nothing but the row's own tokens (the untrimmed width would be 4 × 49)
    assert seen["processed"] == seen["attended"] == int(batch["prompt_mask"].sum() + batch["completion_mask"].sum())


@pytest.mark.parametrize("rows", [1, 2])
def test_micro_batch_loss_and_gradient_equal_the_untrimmed(trainers, rows):
    full = padded_batch()
    ref = logps(trainers["plain"], full)
    results = {}
    for name, trainer in trainers.items():
        trainer.model.train()
        trainer.model.zero_grad()
        batch = {k: v[1 : 1 + rows] for k, v in full.items()}  # a micro-batch of short rows at the batch's width
        batch.update(
            advantages=torch.tensor([1.0, -0.5][:rows]),
            old_per_token_logps=None,
            ref_per_token_logps=ref[1 : 1 + rows] + 0.01,
            num_items_in_batch=full["completion_mask"].sum(),
        )
        loss = trainer.compute_loss(trainer.model, batch)
        loss.backward()
        grad = torch.cat([p.grad.flatten() for p in trainer.model.parameters() if p.grad is not None])
        results[name] = (loss.detach(), grad.clone())
    torch.testing.assert_close(results["trimmed"][0], results["plain"][0], atol=1e-6, rtol=1e-4)
    torch.testing.assert_close(results["trimmed"][1], results["plain"][1], atol=1e-6, rtol=1e-3)
