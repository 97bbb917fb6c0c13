"""rlt.stages.folded_ratio: the vLLM importance-sampling ratio made from the update's own forward trains exactly as
TRL's separate old-policy pass does, with that pass gone. The real rl stage (run_rl) runs twice on the tiny model with
TRL's vLLM path switched on around a stand-in generator (a hand-written mock: no GPU vLLM here) that samples from the
policy itself and reports each token's log-prob moved by ±0.3 to ±0.6 (by row), so the ratio is 0.55-0.74 or 1.35-1.8
and truncated at 1.2: once with the fold off (TRL's two passes), once on."""

from __future__ import annotations

import pytest
import torch
from suite_helpers import TINY

from rlt.checks.validation import load_valid_run
from rlt.contract.layout import RunLayout
from rlt.stages.context import StageContext

pytestmark = pytest.mark.slow
CAP, MOVE, STEPS = 1.2, 0.3, 3
SEEN_SAMPLING: list[list[dict[str, float]]] = []  # each run's logged sampling/* metrics, step by step


class SamplingStandIn:
    """TRL's VLLMGeneration's two calls: no weights to push; `generate` samples the trainer's policy (seeded per
    step, the same draws in both runs) and reports log-probs moved by ±MOVE or more, alternating along each row."""

    def __init__(self, trainer):
        self.trainer = trainer

    def sync_weights(self):
        return None

    def generate(self, prompts, images, num_generations):
        from rlt.method.generation import sample_with_logprobs

        t = self.trainer
        model = t.accelerator.unwrap_model(t.model)
        model.eval()
        g = torch.Generator().manual_seed(1000 + t.state.global_step)
        s = sample_with_logprobs(
            model, t.processing_class, prompts, temperature=t.temperature, top_p=1.0, max_new_tokens=8, generator=g
        )
        model.train()
        # each row its own move (MOVE up to 2 MOVE): micro-batches differ in their ratios' and moves' extremes
        moves = [MOVE * (1 + r / len(s.logprobs)) for r in range(len(s.logprobs))]
        moved = [
            [[lp + (m if i % 2 else -m)] for i, lp in enumerate(row)] for row, m in zip(s.logprobs, moves, strict=True)
        ]
        return prompts, s.completion_ids, moved, {}


def trained(tmp_path, monkeypatch, fold: bool):
    """(the policy's weights after STEPS steps, each step's loss, {step: {row: its ratio}}, old-policy passes run,
    the start weights)."""
    import trl

    from rlt.stages import folded_ratio, rl

    run = load_valid_run(TINY)
    spec = run.spec.model_dump(by_alias=True)
    spec["stages"]["sft"]["enabled"] = False
    spec["stages"]["rl"].update(
        steps=STEPS, batchSize=8, numGenerations=4, perDeviceBatchSize=4, beta=0.0, maxCompletionLength=8,
        saveSteps=10_000, learningRate=1e-2, warmupRatio=0.0, temperature=0.7, topP=1.0,
    )  # fmt: skip
    run = run.model_validate({**run.model_dump(by_alias=True), "spec": spec})
    seen: dict = {"ratios": {}, "passes": 0, "trainer": None}

    class VllmPathTrainer(trl.GRPOTrainer):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            self.use_vllm, self._last_loaded_step = True, -1
            self.vllm_generation = SamplingStandIn(self)
            self.vllm_importance_sampling_correction = True
            self.vllm_importance_sampling_mode = "token_truncate"
            self.vllm_importance_sampling_clip_min, self.vllm_importance_sampling_clip_max = None, CAP
            seen["trainer"] = self
            seen["start"] = {k: v.detach().clone() for k, v in self.model.state_dict().items()}

        def _get_per_token_logps_and_entropies(self, model, *a, **kw):
            if not kw.get("compute_entropy") and torch.is_grad_enabled() is False:
                seen["passes"] += 1  # a no-grad forward of the policy while scoring: the old-policy pass (beta 0)
            return super()._get_per_token_logps_and_entropies(model, *a, **kw)

        def _compute_loss(self, model, inputs):
            loss = super()._compute_loss(model, inputs)
            mask = inputs["completion_mask"].bool()
            for i in range(mask.size(0)):
                row = (
                    tuple(inputs["prompt_ids"][i][inputs["prompt_mask"][i].bool()].tolist()),
                    tuple(inputs["completion_ids"][i][mask[i]].tolist()),
                )
                seen["ratios"].setdefault(self.state.global_step, {})[row] = inputs["importance_sampling_ratio"][i][
                    mask[i]
                ].clone()
            return loss

    monkeypatch.setattr(trl, "GRPOTrainer", VllmPathTrainer)
    if not fold:
        monkeypatch.setattr(folded_ratio, "foldable", lambda trainer: False)
    rl.run_rl(StageContext(run, RunLayout(tmp_path / f"fold-{fold}"), device="cpu", show_progress=False))
    t = seen["trainer"]
    assert t.fold_ratio is fold
    losses = [h["loss"] for h in t.state.log_history if "loss" in h]
    SEEN_SAMPLING.append([{k: v for k, v in h.items() if k.startswith("sampling/")} for h in t.state.log_history])
    weights = {k: v.detach().clone() for k, v in t.model.state_dict().items()}
    return weights, losses, seen["ratios"], seen["passes"], seen["start"]


def test_folded_ratio_trains_as_trls_old_policy_pass(tmp_path, monkeypatch):
    with monkeypatch.context() as mp:
        w_two, loss_two, ratio_two, passes_two, start = trained(tmp_path, mp, fold=False)
        logged_two = SEEN_SAMPLING.pop()
    w_one, loss_one, ratio_one, passes_one, _ = trained(tmp_path, monkeypatch, fold=True)
    logged_one = SEEN_SAMPLING.pop()
    assert passes_two >= STEPS and passes_one == 0  # TRL's pass ran each step; folded, never
    # GRPO's loss is ~0 at each step (advantages sum to zero within a group; ~1e-7 here), its last bits the float
    # summation order's: compared to that scale only; the ratios and the weights below carry the property
    assert len(loss_two) == STEPS and loss_one == pytest.approx(loss_two, abs=1e-6)
    # the same rows, each token's ratio TRL's: 1.2 (truncated) where vLLM's log-prob was moved down, 0.55-0.74 where up
    assert ratio_one.keys() == ratio_two.keys() and len(ratio_one) == STEPS
    truncated = 0
    for step, rows in ratio_two.items():
        assert rows.keys() == ratio_one[step].keys()
        for row, ratio in rows.items():
            assert torch.allclose(ratio_one[step][row], ratio, atol=1e-5), (step, row)
            truncated += int((ratio == CAP).sum())
    assert truncated > 0 and any(bool((r < 0.8).any()) for rows in ratio_two.values() for r in rows.values())
    # and the update is the same: the policy after the steps, weight for weight
    assert all(torch.allclose(w_one[k], w_two[k], atol=1e-4) for k in w_two)  # float order: ~3e-6 seen; moved 3e-2
    # TRL's sampling metrics as TRL logs them: over each generation batch, reduced across ranks as TRL reduces them
    names = {k for h in logged_two for k in h}
    assert len(names) == 5 and len(logged_one) == len(logged_two) and any(logged_two)
    for one, two in zip(logged_one, logged_two, strict=True):
        assert one.keys() == two.keys() and all(one[k] == pytest.approx(two[k], rel=1e-5) for k in two), (one, two)
    moved = max((w_two[k].float() - start[k].float()).abs().max().item() for k in start)
    assert moved > 1e-3  # the steps did move the policy (lr 1e-2): the equality above is not of untouched weights


def test_sampling_metrics_reduce_across_ranks_as_trls():
    """SamplingStats.log on two ranks (the gather a stand-in that adds the other rank's row): a rank's means over
    its whole generation batch (not a mean of its micro-batches'), averaged over the ranks; the extremes over both;
    a rank without a token counts 0, as in TRL's scoring."""
    from collections import defaultdict

    from rlt.stages.folded_ratio import SamplingStats

    other = torch.tensor([0.9, 1.0, 1.1, 0.2, 0.25])  # the other rank: ratio min, mean, max; move mean, max

    def gather(local):
        return torch.cat([local, other])

    stats, metrics = SamplingStats(), defaultdict(list)
    stats.add(torch.tensor([0.5, 1.2, 1.2]), torch.tensor([0.6, 0.1, 0.1]))  # micro-batch 1
    stats.add(torch.tensor([1.0]), torch.tensor([0.2]))  # micro-batch 2
    stats.log(gather, metrics)
    expect = {
        "sampling/importance_sampling_ratio/min": 0.5,
        "sampling/importance_sampling_ratio/mean": (3.9 / 4 + 1.0) / 2,  # not ((2.9/3 + 1.0)/2 + 1.0)/2
        "sampling/importance_sampling_ratio/max": 1.2,
        "sampling/sampling_logp_difference/mean": (1.0 / 4 + 0.2) / 2,
        "sampling/sampling_logp_difference/max": 0.6,
    }
    assert dict(metrics) == {k: [pytest.approx(v)] for k, v in expect.items()}
    empty, metrics = SamplingStats(), defaultdict(list)
    empty.add(torch.tensor([]), torch.tensor([]))
    empty.log(gather, metrics)
    assert metrics["sampling/importance_sampling_ratio/min"] == [0.0]  # TRL: an empty rank's min is 0
    assert metrics["sampling/sampling_logp_difference/mean"] == [pytest.approx(0.1)]
