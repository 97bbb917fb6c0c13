"""The GPU check (issue 43): figures in place of the plan's estimates, on one H100/H200 with no network.

Parts, each in its own process with its own time limit (one failing or hanging loses only itself); gpu_check.json
is rewritten as each part ends:
- driver: `python -m rlt.checks.driver` (the image's CUDA against the node's driver) and nvidia-smi's line;
- peak: the measured dense bf16 matmul rate (8192³), the denominator of MFU;
- trim: rlt.stages.padding at a Qwen2.5-0.5B shape (random weights, built on the GPU) in bf16, long left-padded
  prompts, two rows per chunk: TRL's per-token log-probs and a GRPO-style loss with and without the trim, on the
  same trainer (the trimmed class's method against GRPOTrainer's own); fp32 alongside, so the bf16 gap is shown to be
  rounding. Without trl it compares the model's own forward on the full and the cut columns, and says so;
- grpo: a real TRL GRPOTrainer (padding_trimmed, rlt's stop and end callbacks) on the same random model, two steps,
  then a SIGTERM: the stop callback abandons step 3 and save_abandoned writes step 2 (its seconds and bytes);
- throughput: training tokens/s and MFU (6 FLOPs per parameter per token, as rlt.checks.step_time counts), HF
  generate tokens/s batched, and the write rate of a save_pretrained, each beside the step-time constant it checks.

    python benchmarks/gpu_check.py --out $OUT/gpu_check.json                 # the device (≈ 3 min)
    python benchmarks/gpu_check.py --out /tmp/gpu_check.json --rehearsal     # CPU: tiny shapes, same code paths
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

QWEN25_05B = dict(  # Qwen2.5-0.5B's config.json
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    vocab_size=151936,
    tie_word_embeddings=True,
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
    max_position_embeddings=32768,
)
TINY = dict(QWEN25_05B, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4)
TINY.update(num_key_value_heads=2, vocab_size=4096)
# per part: time limit (s), and the device sizes / the rehearsal's
LIMITS = {"driver": 30, "peak": 30, "trim": 50, "throughput": 60, "grpo": 90}
SIZES = dict(width=2048, rows=8, chunk=2, train_batch=8, train_len=1024, gen_batch=64, gen_prompt=128, gen_new=128)
SIZES.update(grpo_batch=16, grpo_g=8, grpo_cap=128, timed_steps=5)
REHEARSAL = dict(width=256, rows=4, train_batch=2, train_len=64, gen_batch=4, gen_prompt=16, gen_new=8, grpo_batch=4)
REHEARSAL.update(grpo_g=4, grpo_cap=8, timed_steps=1)
# The trim moves RoPE start positions and the kernels' shapes: rounding only. bf16: ≤ 0.05 nats mean |Δ log p| over
# the completion tokens and the loss within 2 % of its mean |per-row term|; fp32 ≥ 20× tighter.
BF16_TOL = dict(logprob_mean_abs=0.05, loss_rel=0.02)
FP32_TOL = dict(logprob_mean_abs=1e-3, loss_rel=1e-3)


def dev() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def random_model(shape: dict, dtype, init: float = 0.02):
    """A Qwen2 of `shape` with random weights, built on the device (nothing read or downloaded)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(**shape, initializer_range=init, eos_token_id=1, pad_token_id=0, bos_token_id=None)
    torch.manual_seed(0)
    with torch.device(dev()):
        model = Qwen2ForCausalLM(cfg)
    model.generation_config.update(eos_token_id=1, pad_token_id=0)
    return model.to(dtype)


def part_driver(sz: dict) -> dict:
    drv = subprocess.run(
        [sys.executable, "-m", "rlt.checks.driver"], check=False, capture_output=True, text=True, timeout=20
    )
    q = ["nvidia-smi", "--query-gpu=name,memory.total,driver_version,clocks.max.sm", "--format=csv,noheader"]
    smi = subprocess.run(q, check=False, capture_output=True, text=True) if shutil.which("nvidia-smi") else None
    import torch

    return {
        "ok": drv.returncode == 0,
        "rlt.checks.driver": {"rc": drv.returncode, "stdout": drv.stdout[-2000:], "stderr": drv.stderr[-2000:]},
        "nvidia_smi": smi.stdout.strip() if smi else None,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
    }


def part_peak(sz: dict) -> dict:
    import torch

    n = 8192 if dev() == "cuda" else 512
    a = torch.randn(n, n, device=dev(), dtype=torch.bfloat16)
    b = torch.randn(n, n, device=dev(), dtype=torch.bfloat16)
    best = 0.0
    for _ in range(3):  # the best of three timed runs of 10 products, after warm-ups
        for _ in range(3):
            a @ b
        sync()
        t0 = time.perf_counter()
        for _ in range(10):
            a @ b
        sync()
        best = max(best, 10 * 2 * n**3 / (time.perf_counter() - t0))
    return {"ok": True, "bf16_matmul_flops": best, "n": n}


def sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def left_padded_batch(sz: dict, vocab: int, seed: int = 0):
    """`rows` rows at TRL's layout: prompts left-padded to `width` − completion width (long prompts of varied
    length), completions right-padded; the rows' lengths differ so each 2-row chunk attends a narrower span."""
    import torch

    g = torch.Generator().manual_seed(seed)
    comp = sz["width"] // 8
    prompt_w = sz["width"] - comp
    ids = torch.randint(2, vocab, (sz["rows"], sz["width"]), generator=g)
    mask = torch.zeros_like(ids)
    for i in range(sz["rows"]):
        p = int(prompt_w * (0.2 + 0.8 * i / max(1, sz["rows"] - 1)) * (0.5 if i % 2 else 1.0))
        c = max(1, int(comp * (0.1 + 0.9 * ((i * 5) % sz["rows"]) / sz["rows"])))
        mask[i, prompt_w - p : prompt_w + c] = 1
    ids = ids.masked_fill(mask == 0, 0)
    return ids.to(dev()), mask.to(dev()), comp


def part_trim(sz: dict, shape: dict) -> dict:
    """The trim's equivalence, bf16 and fp32, through TRL's own log-prob method when trl imports."""
    import torch

    out: dict = {"shape": "Qwen2.5-0.5B" if shape is QWEN25_05B else "tiny (rehearsal)", "tolerance_bf16": BF16_TOL}
    ids, mask, keep = left_padded_batch(sz, shape["vocab_size"])
    out["rows"], out["width"], out["real_tokens"] = sz["rows"], sz["width"], int(mask.sum())
    from rlt.stages.padding import attended_columns

    spans = [attended_columns(mask[s : s + sz["chunk"]], keep) for s in range(0, sz["rows"], sz["chunk"])]
    out["tokens_processed"] = {
        "untrimmed": sz["rows"] * sz["width"],
        "trimmed": sz["chunk"] * sum(e - f for f, e in spans),
    }
    adv = torch.linspace(-1, 1, sz["rows"], device=dev())
    try:
        # bf16=False: no autocast, so each pass runs in the dtype the model is cast to
        trainer = grpo_trainer(
            random_model(shape, torch.float32, init=0.1), sz, Path(tempfile.mkdtemp()), bf16=False, beta=0.0
        )
        from trl import GRPOTrainer

        def logps(trim: bool, dtype):
            trainer.model.to(dtype)
            fn = trainer._get_per_token_logps_and_entropies if trim else GRPOTrainer._get_per_token_logps_and_entropies
            with torch.no_grad():
                args = (trainer.model, ids, mask, keep) if trim else (trainer, trainer.model, ids, mask, keep)
                return fn(*args, batch_size=sz["chunk"])[0].float()

        out["method"] = "TRL GRPOTrainer._get_per_token_logps_and_entropies, trimmed class vs GRPOTrainer's own"
    except ImportError as e:
        model = random_model(shape, torch.float32, init=0.1)
        out["method"] = f"model forward on full vs attended columns (trl not importable: {e})"

        def logps(trim: bool, dtype):
            return forward_logps(model.to(dtype), ids, mask, keep, sz["chunk"], trim)

    cmask = mask[:, -keep:].float()
    fp32_full = None
    for name, dtype, tol in (("fp32", torch.float32, FP32_TOL), ("bf16", torch.bfloat16, BF16_TOL)):
        full, cut = logps(False, dtype), logps(True, dtype)
        fp32_full = full if fp32_full is None else fp32_full

        def mean_abs(a, b):
            return float(((a - b).abs() * cmask).sum() / cmask.sum())

        def terms(lp):  # GRPO's per-sequence mean (loss_type grpo) times a spread of advantages
            return -adv * (lp * cmask).sum(1) / cmask.sum(1).clamp(min=1)

        lf, lc = float(terms(full).mean()), float(terms(cut).mean())
        scale = float(terms(full).abs().mean())  # the loss's own size: its mean can sit near 0
        diff, rel = mean_abs(full, cut), abs(lf - lc) / max(scale, 1e-9)
        out[name] = {
            "logprob_mean_abs_diff": diff,
            "logprob_max_abs_diff": float(((full - cut).abs() * cmask).max()),
            "noise_floor_vs_fp32_untrimmed": mean_abs(full, fp32_full),  # the dtype's own rounding, no trim
            "logprob_spread_sd": float(full[cmask.bool()].std()),
            "loss_full": lf,
            "loss_trimmed": lc,
            "loss_diff_over_mean_abs_term": rel,
            "within_tolerance": bool(diff <= tol["logprob_mean_abs"] and rel <= tol["loss_rel"]),
        }
    out["ok"] = out["bf16"]["within_tolerance"] and out["fp32"]["within_tolerance"]
    return out


def forward_logps(model, ids, mask, keep: int, chunk: int, trim: bool):
    """Completion log-probs per chunk, on the full width or on rlt's attended columns (padded back)."""
    import torch
    import torch.nn.functional as F

    from rlt.stages.padding import attended_columns

    width, outs = ids.size(1), []
    for s in range(0, ids.size(0), chunk):
        i, m = ids[s : s + chunk], mask[s : s + chunk]
        first, end = attended_columns(m, keep) if trim else (0, width)
        with torch.no_grad():
            logits = model(input_ids=i[:, first:end], attention_mask=m[:, first:end]).logits.float()
        lp = torch.log_softmax(logits[:, :-1], -1).gather(-1, i[:, first + 1 : end, None]).squeeze(-1)
        lp = F.pad(lp, (0, width - end))
        outs.append(lp[:, -keep:])
    return torch.cat(outs)


def grpo_trainer(model, sz: dict, out: Path, steps: int = 1, callbacks=(), bf16: bool = True, beta: float = 0.04):
    """rlt's GRPOTrainer class (padding_trimmed) with the rl stage's loss settings, in-process HF generation. At
    beta > 0 TRL loads the reference from the model's path: the random model is saved first (bf16)."""
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from rlt.data.models import resolve_model_path
    from rlt.stages.padding import padding_trimmed

    tok = AutoTokenizer.from_pretrained(resolve_model_path("builtin:tiny-qwen2"), padding_side="left")
    model.config.eos_token_id = model.generation_config.eos_token_id = tok.eos_token_id
    model.config.pad_token_id = model.generation_config.pad_token_id = tok.pad_token_id
    cuda = torch.cuda.is_available()
    if beta > 0:
        model.save_pretrained(out / "start")
        model.config._name_or_path = str(out / "start")
    args = GRPOConfig(
        output_dir=str(out),
        max_steps=steps,
        per_device_train_batch_size=sz["grpo_batch"],
        gradient_accumulation_steps=1,
        num_generations=sz["grpo_g"],
        max_completion_length=sz["grpo_cap"],
        num_iterations=1,
        temperature=1.0,
        beta=beta,
        loss_type="grpo",
        model_init_kwargs={"dtype": "bfloat16" if cuda else "float32"},
        scale_rewards="group",
        learning_rate=1e-6,
        bf16=cuda and bf16,
        use_cpu=not cuda,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        seed=0,
    )
    rows = [{"prompt": f"Question {i}: what is {i} + {2 * i}? Explain step by step."} for i in range(64)]

    def reward(completions, **kw):  # varied, so advantages and the loss are not zero
        return [float(len(c) % 7) for c in completions]

    cls = padding_trimmed(GRPOTrainer)
    return cls(
        model=model,
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tok,
        reward_funcs=[reward],
        callbacks=list(callbacks),
    )


def part_grpo(sz: dict, shape: dict) -> dict:
    """Two GRPO steps through rlt's trainer class and callbacks, then a SIGTERM before step 3: the stop callback
    abandons it and save_abandoned writes step 2."""
    import signal

    import torch
    from transformers import TrainerCallback

    from rlt.stages.preemption import Abandoned, StopRequest, save_abandoned, stop_callback
    from rlt.stages.trainer import end_reached_callback

    stop = StopRequest().install()
    times: list[float] = []

    class SigtermAfterTwo(TrainerCallback):  # the signal a preemption sends, from outside the callbacks under test
        def on_step_begin(self, args, state, control, **kw):
            times.append(time.perf_counter())
            if state.global_step == 2:  # step 3 begins: the stop callback (added after) abandons it
                os.kill(os.getpid(), signal.SIGTERM)

        def on_step_end(self, args, state, control, **kw):
            times.append(time.perf_counter())

    out = Path(tempfile.mkdtemp())
    model = random_model(shape, torch.float32)  # fp32 master weights, bf16 autocast (rlt's master_fp32)
    trainer = grpo_trainer(model, sz, out, steps=3, callbacks=[SigtermAfterTwo(), end_reached_callback()])
    trainer.add_callback(stop_callback(stop))  # last, as rlt's TrainerRun adds it: it reads the flag at each boundary
    res: dict = {"trainer": type(trainer).__name__, "params": model.num_parameters()}
    try:
        trainer.train()
        res["abandoned"] = None
    except Abandoned as e:
        res["abandoned"] = str(e)
    t0 = time.perf_counter()
    ckpt = save_abandoned(trainer)
    save_s = time.perf_counter() - t0
    size = sum(f.stat().st_size for f in Path(ckpt).rglob("*") if f.is_file()) if ckpt else 0
    logs = [h for h in trainer.state.log_history if "loss" in h]
    res.update(
        steps_done=trainer.state.global_step,
        step_seconds=[round(times[i + 1] - times[i], 2) for i in range(0, len(times) - 1, 2)],
        checkpoint=ckpt and Path(ckpt).name,
        checkpoint_bytes=size,
        save_seconds=round(save_s, 2),
        save_bytes_per_s=size / save_s if save_s > 0 else None,
        logs=[{k: v for k, v in h.items() if isinstance(v, (int, float))} for h in logs],
        rows_per_step=sz["grpo_batch"],
        generations=sz["grpo_g"],
        max_completion_length=sz["grpo_cap"],
    )
    finite = all(all(math.isfinite(v) for v in h.values()) for h in res["logs"])
    res["ok"] = res["abandoned"] is not None and res["steps_done"] == 2 and ckpt is not None and finite
    return res


def part_throughput(sz: dict, shape: dict) -> dict:
    """Training tokens/s (fp32 master weights, bf16 autocast, AdamW), HF generate tokens/s batched, save rate."""
    import torch

    cuda = torch.cuda.is_available()
    model = random_model(shape, torch.float32)
    n = model.num_parameters()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    x = torch.randint(2, shape["vocab_size"], (sz["train_batch"], sz["train_len"]), device=dev())
    ac = torch.autocast("cuda", dtype=torch.bfloat16) if cuda else torch.autocast("cpu", enabled=False)

    def step():
        with ac:
            loss = model(input_ids=x, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()
    sync()
    t0 = time.perf_counter()
    for _ in range(sz["timed_steps"]):
        step()
    sync()
    train_tps = sz["timed_steps"] * x.numel() / (time.perf_counter() - t0)
    opt.state.clear()  # its memory, before generate
    model = model.to(torch.bfloat16).eval()
    prompts = torch.randint(2, shape["vocab_size"], (sz["gen_batch"], sz["gen_prompt"]), device=dev())
    kw = dict(do_sample=True, max_new_tokens=sz["gen_new"], min_new_tokens=sz["gen_new"], top_k=0, top_p=1.0)
    with torch.no_grad():
        model.generate(prompts[:, :8], **{**kw, "max_new_tokens": 4, "min_new_tokens": 4})  # warm-up
        sync()
        t0 = time.perf_counter()
        gen = model.generate(prompts, attention_mask=torch.ones_like(prompts), **kw)
        sync()
    gen_s = time.perf_counter() - t0
    new = (gen.size(1) - prompts.size(1)) * gen.size(0)
    d = Path(tempfile.mkdtemp())
    t0 = time.perf_counter()
    model.save_pretrained(d)
    os.sync()
    save_s = time.perf_counter() - t0
    size = sum(f.stat().st_size for f in d.rglob("*") if f.is_file())
    return {
        "ok": True,
        "params": n,
        "train": {"batch": sz["train_batch"], "seq_len": sz["train_len"], "tokens_per_s": train_tps},
        "train_flops_per_s": 6 * n * train_tps,  # the plan's count: 6 per parameter per token, attention left out
        "generate": {
            "batch": sz["gen_batch"],
            "prompt": sz["gen_prompt"],
            "new_tokens": sz["gen_new"],
            "seconds": gen_s,
            "tokens_per_s": new / gen_s,
            "tokens_per_s_per_sequence": new / gen_s / sz["gen_batch"],
        },
        "save": {"bytes": size, "seconds": save_s, "bytes_per_s": size / save_s, "where": "local disk, bf16"},
    }


def constants(parts: dict) -> dict:
    """The step-time constants of rlt.checks.step_time beside what this run measured (None where a part failed)."""
    try:
        from rlt.checks import step_time as st
        from rlt.spec.k8s import quantity_value
        from rlt.spec.resources import DEFAULT_WRITE_RATE

        plan = {k: getattr(st, k) for k in ("PEAK_FLOPS", "UTILISATION", "DECODE_TOKENS_PER_S")}
        plan["WRITE_BYTES_PER_S"] = float(quantity_value(DEFAULT_WRITE_RATE))  # storage.writeBytesPerSecond's default
    except Exception as e:  # noqa: BLE001 - reported, the figures stand alone
        plan = {"error": repr(e)}
    peak = parts.get("peak", {}).get("bf16_matmul_flops")
    tp = parts.get("throughput", {})
    flops = tp.get("train_flops_per_s")
    grpo = parts.get("grpo", {})
    return {
        "plan": plan,
        "measured": {
            "PEAK_FLOPS (dense bf16 matmul 8192³)": peak,
            "UTILISATION against the measured peak": flops / peak if flops and peak else None,
            "UTILISATION against the plan's PEAK_FLOPS": flops / plan["PEAK_FLOPS"]
            if flops and "PEAK_FLOPS" in plan
            else None,
            "DECODE_TOKENS_PER_S per sequence (HF generate, 0.5B, batched; the plan's is vLLM 7B)": tp.get(
                "generate", {}
            ).get("tokens_per_s_per_sequence"),
            "WRITE_BYTES_PER_S (save_pretrained, local disk; the plan's is a network volume)": tp.get("save", {}).get(
                "bytes_per_s"
            ),
            "WRITE_BYTES_PER_S (Trainer checkpoint with optimizer, local disk)": grpo.get("save_bytes_per_s"),
        },
        "notes": "MFU counts 6 FLOPs per parameter per token (rlt.checks.step_time), one GPU, no ZeRO, no "
        "checkpointing, Qwen2.5-0.5B shape: the plan's UTILISATION is for a 7B long-sequence update under ZeRO-3",
    }


def run_part(name: str, args, budget: float) -> dict:
    """One part in its own process, limited to min(its limit, the time left); its JSON or what went wrong."""
    res = Path(tempfile.mkdtemp()) / f"{name}.json"
    cmd = [sys.executable, "-u", __file__, "--part", name, "--result", str(res)]
    cmd += ["--rehearsal"] if args.rehearsal else []
    limit = max(5.0, min(LIMITS[name] * (4 if args.rehearsal else 1), budget))
    t0 = time.perf_counter()
    try:
        rc = subprocess.run(cmd, check=False, timeout=limit).returncode
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"over its {limit:.0f} s limit", "seconds": round(limit, 1)}
    out = json.loads(res.read_text()) if res.exists() else {"ok": False, "error": f"exit {rc}, no result"}
    out["seconds"] = round(time.perf_counter() - t0, 1)
    return out


def child(name: str, args) -> None:
    sz = SIZES | (REHEARSAL if args.rehearsal else {})
    shape = TINY if args.rehearsal else QWEN25_05B
    fn = {"driver": part_driver, "peak": part_peak}.get(name)
    try:
        out = fn(sz) if fn else {"trim": part_trim, "grpo": part_grpo, "throughput": part_throughput}[name](sz, shape)
    except Exception as e:  # noqa: BLE001 - the part's failure is its result; the other parts go on
        import traceback

        traceback.print_exc()
        out = {"ok": False, "error": f"{type(e).__name__}: {e}"[:2000]}
    Path(args.result).write_text(json.dumps(out, default=str))


def main(argv: list[str] | None = None) -> dict | None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="gpu_check.json")
    p.add_argument("--rehearsal", action="store_true", help="CPU: tiny shapes, same code paths")
    p.add_argument("--parts", default=",".join(LIMITS), help="comma-separated, of " + ",".join(LIMITS))
    p.add_argument("--budget", type=float, default=200.0, help="seconds for all parts together")
    p.add_argument("--part", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    if args.part:
        child(args.part, args)
        return None
    deadline = time.monotonic() + args.budget
    report: dict = {"rehearsal": args.rehearsal, "parts": {}}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for name in args.parts.split(","):
        if name not in LIMITS:
            p.error(f"--parts: unknown part {name!r} (known: {', '.join(LIMITS)})")
        left = deadline - time.monotonic()
        if left < 5:
            report["parts"][name] = {"ok": False, "error": "not started: the budget was spent"}
            continue
        print(f"[gpu_check] {name} (≤ {min(LIMITS[name], left):.0f} s)", flush=True)
        report["parts"][name] = run_part(name, args, left)
        report["constants"] = constants(report["parts"])
        out.write_text(json.dumps(report, indent=1, default=str))  # as each part ends
        print(f"[gpu_check] {name}: {json.dumps(report['parts'][name], default=str)[:600]}", flush=True)
    print(json.dumps(report["constants"], indent=1, default=str), flush=True)
    return report


if __name__ == "__main__":
    main()
