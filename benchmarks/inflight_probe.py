"""The vLLM primitive a partial-rollout mode would stand on (issue 51, docs/goodput.md "the decode tail"), probed on the
real vLLM CPU server (the generator's flags, `make vllm-venv`) with the tiny Qwen2: can a weight push happen while
rows are being decoded, without aborting them?

vLLM 0.32 (dev mode, as the generator pods run) has `POST /pause?mode=keep` (the scheduler stops stepping, requests
stay where they are), `POST /reset_prefix_cache?reset_running_requests=true` (running requests are preempted: their
KV cache is dropped and recomputed from prompt + tokens so far when they are scheduled again) and `POST /resume`. A
push would sit between pause and reset: each row's later tokens would then be sampled from the new weights over a
KV cache the new weights computed, and each token's behaviour log-prob is the one its sampler used. The weights
cannot be pushed to the CPU build (TRL's weight transfer needs the GPU engine), so the probe checks the rest with the
weights unchanged: a request held and preempted mid-stream must go on as if nothing happened.

Each arm (greedy; sampling with a seed) decodes `--rows` rows twice, streamed as the rollout client reads them: once
uninterrupted, once with pause (keep), KV reset and resume sent a quarter into the rows' decoding (as timed
uninterrupted). Reported: how many rows the reset preempted (vLLM's own count; all of them, or the probe came too
late and says so), the stream events that arrived while paused (none may), whether each row's tokens are those of
the uninterrupted run and the largest log-prob difference.

Measured 2026-11-29 (2 cores shared with a teaching unit, load ~3.7), four runs of the defaults: every run PASS.
8 rows × 480 tokens (1.4-4.4 s uninterrupted), paused with 24-56 tokens read, every row preempted by the KV reset
(HTTP 200), held 2 s with no stream event inside, every row's tokens those of the uninterrupted run and every
log-prob equal (difference 0.0), greedy and seeded sampling alike: vLLM's per-request generator survives the
preemption. About one try in three found the rows ended before the reset (the reader lagging the server) and was
repeated. Sent mode=abort instead of keep, the probe fails (a row ends with finish_reason 'abort').

    PYTHONPATH=training:tests python benchmarks/inflight_probe.py    # about a minute with the server's start
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))


def streamed(
    base: str, body: dict, on_event: Callable[[dict[int, list[int]]], None] | None = None
) -> tuple[dict[int, list[int]], dict[int, list[float]], list]:
    """(token ids, log-probs per row, arrival times of each event) of one streamed /v1/completions request;
    `on_event` sees the token ids so far after each event."""
    import requests

    ids: dict[int, list[int]] = {}
    lps: dict[int, list[float]] = {}
    arrivals = []
    with requests.post(f"{base}/v1/completions", json=body, stream=True, timeout=600) as resp:
        if resp.status_code != 200:
            raise RuntimeError(f"/v1/completions answered {resp.status_code}: {resp.text[:500]}")
        for line in resp.iter_lines(chunk_size=None):
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            event = json.loads(line[6:])
            for c in event["choices"]:
                i = c["index"]
                ids.setdefault(i, []).extend(c.get("token_ids") or [])
                lps.setdefault(i, []).extend((c.get("logprobs") or {}).get("token_logprobs", []))
                if c.get("finish_reason") not in (None, "length", "stop"):
                    raise RuntimeError(f"row {i} ended with finish_reason {c['finish_reason']!r}")
            arrivals.append((time.monotonic(), {i: len(v) for i, v in ids.items()}))
            if on_event is not None:
                on_event(ids)
    return ids, lps, arrivals


def preemptions(base: str) -> float:
    """vLLM's count of preempted requests (/metrics): the KV reset preempts each row still running."""
    import requests

    text = requests.get(f"{base}/metrics", timeout=30).text
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("vllm:num_preemptions_total")
    )


def pause_reset_resume(base: str, hold: float, window: dict[str, float]) -> None:
    """Pause (keep), the KV reset of the running rows, `hold` s, resume; the times into `window`."""
    import requests

    requests.post(f"{base}/pause", params={"mode": "keep"}, timeout=60).raise_for_status()
    window["paused"] = time.monotonic()
    r = requests.post(f"{base}/reset_prefix_cache", params={"reset_running_requests": "true"}, timeout=60)
    window["reset"] = float(r.status_code)
    time.sleep(hold)
    window["resumed"] = time.monotonic()
    requests.post(f"{base}/resume", timeout=60).raise_for_status()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--tokens", type=int, default=480)  # --max-model-len 512
    p.add_argument("--cut", type=int, default=16, help="row 0's tokens read before the pause")
    p.add_argument("--hold", type=float, default=2.0, help="seconds the engine stays paused")
    args = p.parse_args()

    from suite_helpers import serving_vllm

    from rlt.data.models import resolve_model_path
    from rlt.method.generation import completion_body

    model_dir = resolve_model_path("builtin:tiny-qwen2")
    prompt = [list(range(5, 25))]  # 20 token ids
    failures = []
    log = Path(tempfile.mkdtemp()) / "server.log"  # kept: a failure names it
    with serving_vllm(model_dir, "tiny", log) as base:
        print(f"vLLM CPU server up at {base} (builtin:tiny-qwen2)")
        for name, temperature, seed in (("greedy", 0.0, None), ("seeded sampling", 1.0, 1234)):
            # greedy: vLLM takes n 1 only, so the prompt `rows` times; sampled: one prompt, n rows (as rlt asks)
            prompts, n = (prompt * args.rows, 1) if seed is None else (prompt, args.rows)
            body = completion_body(
                "tiny", prompts, n=n, temperature=temperature, top_p=1.0, max_new_tokens=args.tokens, seed=seed
            )
            body["ignore_eos"] = True  # every row its full length
            began = time.monotonic()
            whole_ids, whole_lps, _ = streamed(base, body)
            took = time.monotonic() - began
            before = preemptions(base)
            # as soon as the reader holds `--cut` tokens of row 0 (so the rows are running); vLLM counts the rows the
            # KV reset preempted: where a row had already ended (the reader lagging the server on shared cores), again
            for attempt in range(1, 4):
                window: dict[str, float] = {}
                holder = threading.Thread(target=pause_reset_resume, args=(base, args.hold, window), daemon=True)

                def trigger(
                    ids: dict[int, list[int]], holder: threading.Thread = holder, window: dict[str, float] = window
                ) -> None:
                    if not holder.is_alive() and not window and len(ids.get(0, ())) >= args.cut:
                        window["read"] = sum(len(v) for v in ids.values())
                        holder.start()

                cut_ids, cut_lps, arrivals = streamed(base, body, trigger)
                if holder.is_alive() or window:
                    holder.join()
                preempted = preemptions(base) - before
                before += preempted
                if preempted == len(whole_ids):
                    break
                print(f"{name}: try {attempt}: {preempted:.0f} of {len(whole_ids)} rows running at the KV reset")
            else:
                failures.append(name)
                continue
            inside = [t for t, _ in arrivals if window["paused"] + 0.2 < t < window["resumed"]]
            same = [cut_ids[i] == whole_ids[i] for i in sorted(whole_ids)]
            worst = max(
                abs(a - b) for i in whole_ids for a, b in zip(cut_lps[i], whole_lps[i], strict=False) if a is not None
            )
            print(
                f"{name}: {args.rows} rows × {args.tokens} tokens, {took:.2f} s uninterrupted; paused with "
                f"{window['read']:.0f} tokens read, the KV reset preempted {preempted:.0f} rows (HTTP {window['reset']:.0f}), held {args.hold:.1f} s: "
                f"{len(inside)} stream events inside the pause; rows the same as uninterrupted: {sum(same)} of "
                f"{len(same)}; largest log-prob difference {worst:.1e}"
            )
            if inside or not all(same) or window["reset"] != 200:
                failures.append(name)
    print("PASS" if not failures else f"FAIL: {', '.join(failures)} (the server's log: {log})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
