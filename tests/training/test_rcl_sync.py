"""The rcl rl stage as it runs (run_rcl_rl: the project's real grpo_config with gradient accumulation 2, its rollout,
probe sampler and reward) in server mode against a recording generator: weights are pushed before every global step's
generation, the generator receives exactly the prompt ids the loss then conditions on, and each prompt carries this
step's probe for its own question."""

from __future__ import annotations

import pytest
from suite_helpers import EXAMPLES

from rlt.checks.validation import load_valid_run
from rlt.contract.layout import RunLayout
from rlt.stages.context import StageContext

RCL_TINY = EXAMPLES / "rltrun-rcl-tiny.yaml"
STEPS = 3
pytestmark = pytest.mark.slow


class RecordingGenerator:
    """Hand-written stand-in for TRL's VLLMGeneration (no vLLM in this venv): records weight pushes with the trainer's
    global step, and the prompt ids it is asked to continue; answers one short well-formed guidance."""

    def __init__(self, trainer):
        self.trainer, self.events, self.prompts = trainer, [], []

    def sync_weights(self):
        self.events.append(("sync", self.trainer.state.global_step))

    def generate(self, prompts, images, num_generations):
        self.events.append(("generate", self.trainer.state.global_step))
        self.prompts.append([list(p) for p in prompts])
        tok = self.trainer.processing_class
        ids = tok("<guidance>add</guidance>", add_special_tokens=False).input_ids + [tok.eos_token_id]
        return prompts, [list(ids) for _ in prompts], [[[-0.5]] * len(ids) for _ in prompts], {}


def test_real_rcl_stage_syncs_every_global_step_and_samples_the_loss_prompt(tmp_path, monkeypatch):
    import trl

    import rlt.stages.rcl as stages

    run = load_valid_run(RCL_TINY)
    spec = run.spec.model_dump(by_alias=True)
    spec["stages"]["sft"]["enabled"] = False
    spec["stages"]["rl"].update(steps=STEPS, batchSize=8, perDeviceBatchSize=4, numGenerations=2, saveSteps=100)
    run = run.model_validate({**run.model_dump(by_alias=True), "spec": spec})
    seen: dict[str, list] = {"loss_prompts": [], "probes": []}
    generators: list[RecordingGenerator] = []

    class ServerModeTrainer(trl.GRPOTrainer):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            self.use_vllm, self._last_loaded_step = True, -1
            self.vllm_generation = RecordingGenerator(self)
            generators.append(self.vllm_generation)

        def _compute_loss(self, model, inputs):
            seen["loss_prompts"].append(
                [ids[m.bool()].tolist() for ids, m in zip(inputs["prompt_ids"], inputs["prompt_mask"], strict=True)]
            )
            return super()._compute_loss(model, inputs)

    real_probe_sampler = stages.probe_sampler

    def recording_probe_sampler(*a, **kw):
        probe = real_probe_sampler(*a, **kw)

        def recorded(questions):
            out = probe(questions)
            seen["probes"].append(dict(zip(questions, out, strict=True)))
            return out

        return recorded

    monkeypatch.setattr(trl, "GRPOTrainer", ServerModeTrainer)
    monkeypatch.setattr(stages, "probe_sampler", recording_probe_sampler)
    stages.run_rcl_rl(StageContext(run, RunLayout(tmp_path), device="cpu", show_progress=False))

    gen = generators[0]
    # one push then one generation per optimizer step, each at a new global step (gradient accumulation 2)
    assert gen.events == [e for step in range(STEPS) for e in (("sync", step), ("generate", step))]
    tok = gen.trainer.processing_class
    protocol = stages.protocol_for(run.spec)
    for step in range(STEPS):
        # the two micro-batches of this step together are exactly what the generator continued
        in_loss = seen["loss_prompts"][2 * step] + seen["loss_prompts"][2 * step + 1]
        assert sorted(map(tuple, in_loss)) == sorted(map(tuple, gen.prompts[step]))
        # each prompt is its question with the probe written for that question this step
        expected = {
            tuple(tok(protocol.teacher_prompt(tok, q, p), add_special_tokens=False).input_ids)
            for q, p in seen["probes"][step].items()
        }
        assert set(map(tuple, gen.prompts[step])) == expected and len(expected) == 8 // 2
