"""What a checkpoint costs the training loop: the direct save (the Trainer writes to the run's volume, every file is
fsynced, the marker last: rlt.stages.checkpoints.mark_checkpoint_complete) against the staged save
(rlt.stages.staged_saves: the Trainer writes to fast local storage, /dev/shm here; a background thread copies it to
the volume, fsyncs it and writes the marker while the next steps run). Both arms in one process, the same model,
optimizer and steps (transformers' Trainer on a random Qwen2 of ~15 M parameters: a ~180 MB checkpoint with Adam's
states). Reported per arm: the seconds the loop was blocked per save, the step seconds, and for the staged arm how
long each durable copy took (overlapping the steps after it). The volume here is this machine's disk.

    nice -n 10 python benchmarks/save_cost.py                 # about a minute
    nice -n 10 python benchmarks/save_cost.py --width 256     # smaller checkpoint
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def build_trainer(opts, out: Path):
    import torch
    from datasets import Dataset
    from transformers import Qwen2Config, Qwen2ForCausalLM, Trainer, TrainingArguments

    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=4096,
        hidden_size=opts.width,
        intermediate_size=opts.width * 3,
        num_hidden_layers=opts.layers,
        num_attention_heads=8,
        num_key_value_heads=8,
    )
    model = Qwen2ForCausalLM(cfg)
    ids = torch.randint(0, 4096, (opts.steps * 2, 64)).tolist()
    data = Dataset.from_list([{"input_ids": x, "labels": x} for x in ids])
    args = TrainingArguments(
        output_dir=str(out),
        per_device_train_batch_size=2,
        max_steps=opts.steps,
        save_steps=opts.save_every,
        save_strategy="steps",
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        logging_strategy="no",
        seed=0,
    )
    return Trainer(model=model, args=args, train_dataset=data)


def run_arm(arm: str, opts, work: Path) -> dict:
    from transformers import TrainerCallback

    from rlt.contract.layout import checkpoint_path, is_complete
    from rlt.stages.checkpoints import mark_checkpoint_complete
    from rlt.stages.staged_saves import StagedSaves

    durable = work / f"volume-{arm}"
    trainer = build_trainer(opts, durable)
    blocked: list[float] = []
    steps: list[float] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            steps.append(time.perf_counter() - self.t0)

        def on_save(self, args, state, control, **kw):  # the direct arm's marker: fsync every file, marker last
            if arm == "direct":
                t0 = time.perf_counter()
                mark_checkpoint_complete(checkpoint_path(durable, state.global_step), True)
                blocked[-1] += time.perf_counter() - t0  # the loop waits for it too

    trainer.add_callback(Clock())
    staged = None
    copies: list[float] = []
    if arm == "staged":
        local = Path(tempfile.mkdtemp(prefix="rlt-local-", dir=opts.local))
        staged = StagedSaves(trainer, local, 0, 1, lambda step, path: copies.append(staged.seconds["durable_copy"]))
        staged.install()
    save = trainer._save_checkpoint

    def timed(model, trial):
        t0 = time.perf_counter()
        save(model, trial)
        blocked.append(time.perf_counter() - t0)

    trainer._save_checkpoint = timed
    t0 = time.perf_counter()
    trainer.train()
    if staged is not None:
        staged.wait()
    total = time.perf_counter() - t0
    saved = [p for p in durable.iterdir() if p.name.startswith("checkpoint-")]
    assert saved and all(is_complete(p) for p in saved), f"{arm}: a checkpoint without its marker"
    size = sum(f.stat().st_size for f in saved[0].rglob("*") if f.is_file())
    shutil.rmtree(durable)
    return {"arm": arm, "blocked": blocked, "steps": steps, "copies": copies, "total": total, "bytes": size}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--save-every", type=int, default=2)
    ap.add_argument("--local", default="/dev/shm", help="fast local storage (default: memory)")
    ap.add_argument("--volume", default=None, help="where the run's volume is (default: a temporary folder)")
    opts = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT / "training"))
    work = Path(tempfile.mkdtemp(prefix="rlt-save-cost-", dir=opts.volume))
    arms = [run_arm(arm, opts, work) for arm in ("direct", "staged")]
    mb = arms[0]["bytes"] / 1e6
    print(f"\ncheckpoint {mb:.0f} MB; {opts.steps} steps, a save every {opts.save_every}; local: {opts.local}")
    print(f"{'arm':<8}{'blocked/save s':>16}{'step s':>9}{'train s':>9}{'durable copy s':>16}")
    for a in arms:
        copy = f"{statistics.median(a['copies']):.2f}" if a["copies"] else "-"
        print(
            f"{a['arm']:<8}{statistics.median(a['blocked']):>16.2f}{statistics.median(a['steps']):>9.2f}"
            f"{a['total']:>9.2f}{copy:>16}"
        )
    d, s = (statistics.median(a["blocked"]) for a in arms)
    print(f"blocked per save, staged / direct: {s / d:.2f}")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
