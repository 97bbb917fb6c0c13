"""The deal of rows across ranks (rlt.stages.balance) leaves the step's gradient the same sum: TRL's GRPOTrainer
on the tiny Qwen2 computes the loss of every (rank, micro-step) micro-batch of a scored generation batch as TRL lays
it out (rank r: the r-th slice) and as dealt (rows moved between ranks, each rank's batch cut to the columns its rows
attend); the summed losses and their gradients agree. Ranks are simulated in one process: under DeepSpeed or DDP
the step's gradient is the mean over ranks of each rank's summed micro-step gradients, which is what is summed here.
A second test runs the real exchange in a two-rank gloo world under ZeRO-3 (benchmarks/rank_balance.py)."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.slow

WORLD, STEPS = 4, 4


@pytest.fixture(scope="module")
def make_trainer(tmp_path_factory, tiny_ref):
    import os

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from rlt.data.models import load_model, load_tokenizer

    tok = load_tokenizer(tiny_ref)
    torch.manual_seed(0)
    model = load_model(tiny_ref, "cpu", trainable=True)

    def make(loss_type: str, per_step: int):
        args = GRPOConfig(
            output_dir=str(tmp_path_factory.mktemp("balance")),
            per_device_train_batch_size=per_step,
            gradient_accumulation_steps=STEPS,
            steps_per_generation=STEPS,
            num_generations=2,
            beta=0.04,
            loss_type=loss_type,
            max_completion_length=64,
            use_cpu=True,
            bf16=False,
            report_to=[],
            disable_tqdm=True,
        )
        data = Dataset.from_list([{"prompt": "2+2="}] * 4)
        trainer = GRPOTrainer(
            model=model, args=args, train_dataset=data, processing_class=tok, reward_funcs=[lambda **kw: [0.0]]
        )
        trainer.current_gradient_accumulation_steps = STEPS  # what Trainer's loop sets before a step
        return trainer

    return make


def scored_batch(rows: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """A step's scored rows of all ranks as TRL concatenates them (prompts left-padded, completions right-padded),
    a skewed length mix, advantages and reference log-probs."""
    g = torch.Generator().manual_seed(seed)
    p_lens = torch.randint(3, 12, (rows,), generator=g).tolist()
    c_lens = [int(n) for n in torch.where(torch.rand(rows, generator=g) < 0.2, 48, 4) + torch.randint(0, 8, (rows,))]
    p_w, c_w = max(p_lens), max(c_lens)
    out = {
        "prompt_ids": torch.zeros(rows, p_w, dtype=torch.long),
        "prompt_mask": torch.zeros(rows, p_w, dtype=torch.long),
        "completion_ids": torch.zeros(rows, c_w, dtype=torch.long),
        "completion_mask": torch.zeros(rows, c_w, dtype=torch.long),
    }
    for i, (p, c) in enumerate(zip(p_lens, c_lens, strict=True)):
        out["prompt_ids"][i, p_w - p :] = torch.randint(3, 500, (p,), generator=g)
        out["prompt_mask"][i, p_w - p :] = 1
        out["completion_ids"][i, :c] = torch.randint(3, 500, (c,), generator=g)
        out["completion_mask"][i, :c] = 1
    out["advantages"] = torch.randn(rows, generator=g)
    out["ref_per_token_logps"] = -torch.rand(rows, c_w, generator=g) * 6 * out["completion_mask"]
    return out


def step_loss_and_gradient(trainer, batch, layout: list[list[int]], per_step: int):
    """Sum over ranks and micro-steps of TRL's micro-batch loss, / world (the ranks' gradients are averaged)."""
    from rlt.stages.balance import trimmed_to_attended

    model = trainer.model
    model.train()
    model.zero_grad()
    total = torch.zeros(())
    items = batch["completion_mask"].sum()
    for rows in layout:
        mine = trimmed_to_attended({k: v[rows] for k, v in batch.items()})
        for s in range(STEPS):
            micro = {k: v[s * per_step : (s + 1) * per_step] for k, v in mine.items()}
            micro.update(old_per_token_logps=None, num_items_in_batch=items)
            loss = trainer.compute_loss(model, micro) / WORLD
            loss.backward()
            total += loss.detach()
    grad = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    return total, grad


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo"])
@pytest.mark.parametrize("per_step", [1, 2])
def test_the_dealt_step_has_the_same_loss_and_gradient(make_trainer, loss_type, per_step):
    from rlt.stages.balance import deal, row_tokens

    trainer = make_trainer(loss_type, per_step)
    rows = WORLD * STEPS * per_step
    batch = scored_batch(rows)
    local = rows // WORLD
    trl = [list(range(r * local, (r + 1) * local)) for r in range(WORLD)]
    dealt = deal(row_tokens(batch).tolist(), WORLD, STEPS, per_step)
    assert dealt != trl
    loss_trl, grad_trl = step_loss_and_gradient(trainer, batch, trl, per_step)
    loss_dealt, grad_dealt = step_loss_and_gradient(trainer, batch, dealt, per_step)
    assert grad_trl.abs().sum() > 0
    torch.testing.assert_close(loss_dealt, loss_trl, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(grad_dealt, grad_trl, atol=1e-6, rtol=1e-4)


def test_bnpo_would_change_the_gradient(make_trainer):
    """Why bnpo keeps TRL's layout (rlt.stages.balance.deal_refusal): it divides by the micro-batch's tokens."""
    from rlt.stages.balance import deal, row_tokens

    trainer = make_trainer("bnpo", 2)
    batch = scored_batch(WORLD * STEPS * 2)
    local = WORLD * STEPS * 2 // WORLD
    trl = [list(range(r * local, (r + 1) * local)) for r in range(WORLD)]
    _, grad_trl = step_loss_and_gradient(trainer, batch, trl, 2)
    _, grad_dealt = step_loss_and_gradient(trainer, batch, deal(row_tokens(batch).tolist(), WORLD, STEPS, 2), 2)
    assert not torch.allclose(grad_dealt, grad_trl, atol=1e-6, rtol=1e-4)


def test_two_ranks_exchange_rows_and_train_the_same_step(tmp_path):
    """The real thing: TRL + rlt's hooks in a two-rank gloo world under DeepSpeed ZeRO-3, both arms in the same
    processes: the dealt arm computes fewer tokens on its slowest rank, in the update and in the reference pass
    (beta > 0), and ends with the same gradients and weights; so does sft with transformers' token-balancing
    sampler against the random one."""
    import sys

    from suite_helpers import ROOT

    from rlt.contract.metrics import IMBALANCE_MEASURES

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import rank_balance

    argv = ["--world", "2", "--micro", "8", "--steps", "2", "--generations", "4", "--width", "64", "--layers", "1"]
    argv += ["--sft-micro", "8", "--sft-steps", "1"]  # one sft step: both arms train on the same rows
    opts = rank_balance.parse(argv + ["--repeats", "1", "--out", str(tmp_path / "out.json")])
    model = rank_balance.build_model(tmp_path / "model", opts.width, opts.layers)
    res = rank_balance.run_world(opts, [*argv, "--repeats", "1", "--out", opts.out, "--model", model], timeout=600)
    before, after = res["arms"]
    assert (before["arm"], after["arm"]) == ("TRL", "dealt")
    assert after["rank_imbalance_tokens"] < before["rank_imbalance_tokens"]
    keys = {f"rank_imbalance_{m}" for m in IMBALANCE_MEASURES}
    assert all(step.keys() == keys for step in after["per_step"])
    assert after["rank_imbalance_passes_tokens"] < before["rank_imbalance_passes_tokens"]
    assert after["grad_norms"] == pytest.approx(before["grad_norms"], rel=1e-5)
    assert after["weights"] == pytest.approx(before["weights"], rel=1e-9)
    before, after = res["sft"]
    assert (before["arm"], after["arm"]) == ("random", "dealt")
    assert after["rank_imbalance_tokens"] < before["rank_imbalance_tokens"]
    assert after["grad_norms"] == pytest.approx(before["grad_norms"], rel=1e-4)
    assert after["weights"] == pytest.approx(before["weights"], rel=1e-7)
