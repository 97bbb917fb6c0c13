"""RCL training correctness on the tiny model with TRL's real GRPOTrainer:
- the loss conditions on exactly the prompt each guidance was sampled from (question + probe);
- the probe and the no-guidance baseline run once per question per step;
- in server mode, TRL pushes the weights to the generator before every step's generation."""

import os

import pytest

from rlt.rcl.protocol import Protocol, load_rcl_format
from rlt.rcl.reward import RCLReward, student_sampler
from rlt.spec.inputs import ModelRef
from rlt.spec.stages import RlStage
from rlt.stages.rcl import make_rcl_rollout, probe_sampler
from rlt.stages.record import PhaseTimer

pytestmark = pytest.mark.slow
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
QUESTIONS = ["What is (2 + 3) * 4?", "What is (7 - 2) + 9?", "What is (3 * 3) - 1?"]
G, STEPS = 2, 2


def make_trainer(tiny, tmp_path, counts, server=False):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from rlt.data.models import load_model

    student, tok = tiny  # frozen student (and probe writer); the policy is a fresh copy
    protocol = Protocol(load_rcl_format("rcl-default"))
    st = RlStage(
        steps=STEPS, batch_size=4, num_generations=G, per_device_batch_size=4, max_completion_length=6, temperature=1.0
    )
    probe = probe_sampler(protocol, student, tok, temperature=1.0, max_tokens=3)

    def counted_probe(questions):
        counts["probe_calls"].append(list(questions))
        out = probe(questions)
        counts["probes"].extend(out)
        return out

    answer = student_sampler(student, tok, temperature=1.0, max_new_tokens=2)

    def counted_answer(prompts, n):
        counts["student"].append((len(prompts), n))
        return answer(prompts, n)

    reward = RCLReward(protocol, tok, counted_answer, samples=2)
    rollout = make_rcl_rollout(protocol, tok, counted_probe, st, PhaseTimer(), {"generated_tokens": 0})

    def recording_rollout(prompts, trainer):
        out = rollout(prompts, trainer)
        counts["rollout_prompt_ids"].append([list(p) for p in out["prompt_ids"]])
        counts["completions"].append([list(c) for c in out["completion_ids"]])
        counts["teacher_prompts"].append(out["teacher_prompt"])
        return out

    args = GRPOConfig(
        output_dir=str(tmp_path),
        max_steps=STEPS,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=1,
        num_generations=G,
        max_completion_length=6,
        temperature=1.0,
        top_k=0,
        learning_rate=1e-4,
        beta=0.0,
        logging_steps=1,
        report_to="none",
        use_cpu=True,
        bf16=False,
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
    )
    rows = [{"prompt": q, "question": q, "solution": "The answer is 20."} for q in QUESTIONS * 4]
    policy = load_model(ModelRef(model="builtin:tiny-qwen2"), "cpu", trainable=True)
    trainer = GRPOTrainer(
        model=policy,
        reward_funcs=[reward],
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tok,
        rollout_func=recording_rollout,
    )
    original = trainer._compute_loss

    def capturing_loss(model, inputs):
        counts["loss_inputs"].append({k: inputs[k].clone() for k in ("prompt_ids", "prompt_mask", "completion_ids")})
        return original(model, inputs)

    trainer._compute_loss = capturing_loss
    return trainer, protocol, tok


def fresh_counts():
    return {
        k: []
        for k in (
            "probe_calls",
            "probes",
            "student",
            "rollout_prompt_ids",
            "teacher_prompts",
            "loss_inputs",
            "completions",
        )
    }


def test_loss_uses_the_prompt_the_guidance_was_sampled_from(tiny, tmp_path):
    counts = fresh_counts()
    trainer, protocol, tok = make_trainer(tiny, tmp_path, counts)
    trainer.train()
    assert len(counts["loss_inputs"]) == STEPS
    for step, inputs in enumerate(counts["loss_inputs"]):
        # strip TRL's left padding: what remains is the exact token sequence the loss conditions on
        seen = [
            ids[mask.bool()].tolist() for ids, mask in zip(inputs["prompt_ids"], inputs["prompt_mask"], strict=True)
        ]
        # TRL shuffles rows inside the batch: compare (prompt, completion) pairs, which must stay together
        pairs = {
            (tuple(p), tuple(c))
            for p, c in zip(counts["rollout_prompt_ids"][step], counts["completions"][step], strict=True)
        }
        got = {
            (tuple(p), tuple(c[: len(next(cc for pp, cc in pairs if pp == tuple(p)))].tolist()))
            for p, c in zip(seen, inputs["completion_ids"], strict=True)
        }
        assert got == pairs and len(seen) == len(counts["rollout_prompt_ids"][step])
        assert sorted(seen) == sorted(counts["rollout_prompt_ids"][step])
        for ids, text in zip(counts["rollout_prompt_ids"][step], counts["teacher_prompts"][step], strict=True):
            assert ids == tok(text, add_special_tokens=False).input_ids
            question = next(q for q in QUESTIONS if q in text)
            probe = text.split("Student's first idea: ", 1)[1].split("<|im_end|>")[0]
            # question + the probe the student wrote this step, not the bare question the dataset holds
            assert text == protocol.teacher_prompt(tok, question, probe)
            assert len(ids) > len(tok(question, add_special_tokens=False).input_ids)


def test_probe_and_baseline_once_per_question_per_step(tiny, tmp_path):
    counts = fresh_counts()
    trainer, _, _ = make_trainer(tiny, tmp_path, counts)
    trainer.train()
    questions_per_step = 4 // G
    assert [len(c) for c in counts["probe_calls"]] == [questions_per_step] * STEPS
    # each step: one baseline call with one prompt per question (× studentSamples answers), then the guided call
    # (the tiny random teacher writes no guidance tags, so the guided call has no prompt)
    assert counts["student"] == [(questions_per_step, 2), (0, 2)] * STEPS


class MockVLLMGeneration:
    """Hand-written stand-in for TRL's VLLMGeneration (no vLLM here): records weight syncs and generation calls."""

    def __init__(self, tok):
        self.tok, self.events = tok, []

    def sync_weights(self):
        self.events.append("sync")

    def generate(self, prompts, images, num_generations):
        self.events.append("generate")
        ids = self.tok("<guidance>add</guidance>", add_special_tokens=False).input_ids + [self.tok.eos_token_id]
        return prompts, [list(ids) for _ in prompts], [[[-0.5]] * len(ids) for _ in prompts], {}


def test_server_mode_syncs_weights_before_every_step(tiny, tmp_path):
    counts = fresh_counts()
    trainer, _, tok = make_trainer(tiny, tmp_path, counts)
    mock = MockVLLMGeneration(tok)
    trainer.use_vllm, trainer.vllm_generation, trainer._last_loaded_step = True, mock, -1
    trainer.args.vllm_importance_sampling_correction = False
    trainer.vllm_importance_sampling_correction = False
    trainer.train()
    assert mock.events == ["sync", "generate"] * STEPS
    # every mocked guidance is well formed: baseline once per question, then one guided prompt per completion
    assert counts["student"] == [(4 // G, 2), (4, 2)] * STEPS


def test_dense_performance_is_the_students_probability_of_the_reference(tiny):
    """performance: dense scores the reference answer with the SpanScorer instead of sampling answers."""
    from rlt.method.scoring import SpanScorer

    student, tok = tiny
    protocol = Protocol(load_rcl_format("rcl-default"))

    def no_sampling(prompts, n):
        raise AssertionError("dense performance must not sample student answers")

    reward = RCLReward(
        protocol,
        tok,
        no_sampling,
        samples=4,
        performance="dense",
        scorer=SpanScorer(student, tok, temperature=0.7, batch_size=4),
    )
    batch = reward.score(
        ["What is 2 + 3?"] * 3,
        ["5"] * 3,
        ["<guidance>add the two numbers</guidance>", "no tags", "<guidance>count up from 2</guidance>"],
    )
    assert reward.student_prompts_total == 1 + 2  # one baseline for the question, one per well-formed guidance
    assert all(0.0 < p <= 1.0 for p in batch.perf_base)
    assert batch.perf_with[1] is None and all(0.0 < batch.perf_with[i] <= 1.0 for i in (0, 2))
    assert batch.reward[1] == -1.0


@pytest.mark.parametrize("bad_rows", ["reject", "skip"])
def test_rcl_rows_name_the_file_line_and_skip_with_one_warning(tiny, bad_rows, caplog):
    """rcl's sft and rl rows name a bad row as the rlt stages do (`data.where`: 'line N' of the file, not the 0-based
    index), and badRows: skip warns once per stage, not once per row."""
    from rlt.data.errors import DataError
    from rlt.stages.rcl import rcl_rl_rows, rcl_sft_rows

    _, tok = tiny
    protocol = Protocol(load_rcl_format("rcl-default"))
    rows = [
        {"row": i, "question": q, "solution": "1", "reasoning_trace": "t" if i == 0 else ""}
        for i, q in enumerate(QUESTIONS)
    ]
    rows.append({"row": 3, "question": "What is 1 + 0?" * 200, "solution": "1", "reasoning_trace": "t"})

    def where(i: int) -> str:
        return f"line {i + 1}"

    def check(make, bad: str) -> None:
        caplog.clear()
        if bad_rows == "reject":
            with pytest.raises(DataError, match=bad):
                make()
        else:
            make()
            warned = [r.getMessage() for r in caplog.records if "skipping" in r.getMessage()]
            assert len(warned) == 1 and bad in warned[0], warned

    check(lambda: rcl_sft_rows(rows, protocol, tok, bad_rows, where), "line 2: reasoning_trace is missing")
    check(lambda: rcl_rl_rows(rows, protocol, tok, 400, 8, bad_rows, where), "line 4: teacher prompt is")
