"""Ranks balanced by tokens (rlt.stages.balance) against TRL's per-rank shuffle, in one real gloo world of CPU ranks
under DeepSpeed ZeRO-3 (accelerate's plugin, as the rl and sft stages run), both arms in the same processes on the
same rows: rl's update and its reference pass (beta > 0), and sft's update.

TRL's GRPOTrainer with rlt's padding trim and the balance hook; the rollout is fixed (no generation): each prompt's
completions are drawn from a skewed length mix (most short, a few long: the shape a batch of explanations has), the
same for both arms, and the reward a function of the completion, so advantages (and the loss) are not zero. Arm
"TRL": `deal_rows = False` (TRL's shuffle of each rank's own rows; the imbalance measured alike). Arm "dealt": the
rows of all ranks dealt by tokens, for the update and for the reference pass. Reported per arm: the imbalance (tokens
the ranks' models computed, and each rank's own micro-step seconds) of the update and of the reference pass, the
training seconds, the mean loss; the arms' losses must agree.

sft: TRL's SFTTrainer on rows of the same length mix (prompt + completion), one epoch, paper-7b's shape by default
(one row per micro-batch, 4 micro-steps: 16 rows a step at 4 ranks). Arm "random": transformers' default sampler
(the layout before issue 51); arm "dealt": rlt.stages.sft_balance's StepDeal, which the sft stage uses. The deal
spans a window of steps, so which rows share a step differs between the arms and their losses are not compared,
except with --sft-steps 1 (one step: the same rows, so the gradients must agree).

    PYTHONPATH=training python benchmarks/rank_balance.py --world 4
    PYTHONPATH=training python benchmarks/rank_balance.py --world 2 --micro 4 --steps 1   # quicker
    # issue 51's figures (~5 min on a loaded 2-core machine): rl 2.20 -> 1.04, its reference pass 2.21 -> 1.04,
    # sft 2.06 -> 1.02 at 4 ranks
    PYTHONPATH=training python benchmarks/rank_balance.py --world 4 --repeats 1 --width 128 --layers 2 --steps 1 \
        --sft-steps 16
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TINY = "builtin:tiny-qwen2"  # its tokenizer; the model is a wider random Qwen2 of the same vocabulary (`build_model`)


def build_model(out: Path, width: int, layers: int) -> str:
    """A seeded random Qwen2 (tiny-qwen2's tokenizer) wide enough that a micro-step's time follows its tokens."""
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from rlt.data.models import resolve_model_path

    tok = AutoTokenizer.from_pretrained(resolve_model_path(TINY))
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=width,
        intermediate_size=4 * width,
        num_hidden_layers=layers,
        num_attention_heads=max(1, width // 64),
        num_key_value_heads=1,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    Qwen2ForCausalLM(config).save_pretrained(out)
    tok.save_pretrained(out)
    return str(out)


def completion_length(prompt: str, k: int, short: tuple[int, int], long: tuple[int, int], long_share: float) -> int:
    """The k-th completion's length for `prompt`: the same in both arms and on every rank (seeded by the text)."""
    seed = int(hashlib.sha1(f"{prompt}|{k}".encode()).hexdigest()[:12], 16)
    rnd = random.Random(seed)
    lo, hi = long if rnd.random() < long_share else short
    return rnd.randint(lo, hi)


def make_rollout(tok, mix: dict):
    import torch

    def rollout(prompts, trainer):
        prompt_ids = [tok(p, add_special_tokens=False).input_ids for p in prompts]
        seen: dict[str, int] = {}
        completions = []
        for p in prompts:
            k = seen[p] = seen.get(p, -1) + 1
            n = completion_length(p, k, **mix)
            g = torch.Generator().manual_seed(n * 1000 + k)
            completions.append(torch.randint(10, len(tok) - 8, (n,), generator=g).tolist())
        return {"prompt_ids": prompt_ids, "completion_ids": completions, "logprobs": None}

    return rollout


def reward(completions, **kw):
    return [float(len(c) % 5) for c in completions]


def grpo_args(out_dir: str, world: int, micro: int, steps: int, generations: int, loss_type: str, beta: float):
    from trl import GRPOConfig

    from rlt.stages.trainer import deepspeed_config, trainer_precision

    return GRPOConfig(
        output_dir=out_dir,
        max_steps=steps,
        per_device_train_batch_size=1,  # the paper's: one row per micro-batch
        gradient_accumulation_steps=micro,
        steps_per_generation=micro,
        num_generations=generations,
        max_completion_length=4096,
        beta=beta,  # > 0: TRL runs the reference pass, dealt like the update
        loss_type=loss_type,
        learning_rate=1e-5,
        report_to=[],
        disable_tqdm=True,
        save_strategy="no",
        logging_steps=1,
        seed=0,
        deepspeed=deepspeed_config(3),
        **trainer_precision("cpu", "auto", world),
    )


def run_arm(name: str, deal: bool, opts, prompts: list[dict], mix: dict) -> dict:
    import torch
    from accelerate.state import AcceleratorState
    from datasets import Dataset
    from trl import GRPOTrainer

    from rlt.data.models import load_model, load_tokenizer
    from rlt.spec.inputs import ModelRef
    from rlt.stages.balance import rank_balanced
    from rlt.stages.padding import padding_trimmed

    AcceleratorState._reset_state()  # a second Trainer in this process builds its own DeepSpeed accelerator
    ref = ModelRef(model=opts.model)
    tok = load_tokenizer(ref, padding_side="left")
    torch.manual_seed(0)  # the same random tiny model in both arms and on every rank
    world = int(os.environ.get("WORLD_SIZE", "1"))
    with tempfile.TemporaryDirectory() as tmp:
        args = grpo_args(tmp, world, opts.micro, opts.steps, opts.generations, opts.loss_type, opts.beta)
        trainer = rank_balanced(padding_trimmed(GRPOTrainer))(
            model=load_model(ref, "cpu", trainable=True),
            args=args,
            train_dataset=Dataset.from_list(prompts),
            processing_class=tok,
            reward_funcs=[reward],
            rollout_func=make_rollout(tok, mix),
        )
        trainer.deal_rows = trainer.deal_passes = deal
        return trained_arm(name, trainer)


def sft_rows(tok, opts, mix: dict, world: int) -> list[dict]:
    """An epoch's rows (sft_steps steps of world × sft_micro), prompt and completion ids as rlt.stages.sft hands
    them to TRL."""
    import torch

    rows = []
    for i in range(world * opts.sft_micro * opts.sft_steps):
        prompt = tok(f"Question {i}: what is {i} plus {2 * i}? Answer:", add_special_tokens=False).input_ids
        n = completion_length(f"sft {i}", 0, **mix)
        g = torch.Generator().manual_seed(n * 1000 + i)
        completion = torch.randint(10, len(tok) - 8, (n,), generator=g).tolist()
        rows.append({"input_ids": prompt + completion, "completion_mask": [0] * len(prompt) + [1] * n})
    return rows


def run_sft_arm(name: str, strategy: str, opts, rows: list[dict]) -> dict:
    import torch
    from accelerate.state import AcceleratorState
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    from rlt.data.models import load_model, load_tokenizer
    from rlt.spec.inputs import ModelRef
    from rlt.stages.sft_balance import sft_measured
    from rlt.stages.trainer import deepspeed_config, trainer_precision

    AcceleratorState._reset_state()
    ref = ModelRef(model=opts.model)
    torch.manual_seed(0)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    with tempfile.TemporaryDirectory() as tmp:
        args = SFTConfig(
            output_dir=tmp,
            num_train_epochs=1,
            per_device_train_batch_size=1,
            gradient_accumulation_steps=opts.sft_micro,
            max_length=2048,
            completion_only_loss=True,
            packing=False,
            train_sampling_strategy=strategy,
            learning_rate=1e-5,
            report_to=[],
            disable_tqdm=True,
            save_strategy="no",
            logging_steps=1,
            seed=0,
            deepspeed=deepspeed_config(3),
            **trainer_precision("cpu", "auto", world),
        )
        trainer = sft_measured(SFTTrainer)(
            model=load_model(ref, "cpu", trainable=True),
            args=args,
            train_dataset=Dataset.from_list(rows),
            processing_class=load_tokenizer(ref, padding_side="right"),
        )
        return trained_arm(name, trainer)


def trained_arm(name: str, trainer) -> dict:
    """Trains `trainer` (a rank_balanced one) and returns the arm's row: time, loss, grad norms, the weights'
    fingerprint, each imbalance figure's mean over the steps and the steps' own figures."""
    from transformers import TrainerCallback

    figures: list[dict] = []

    class Figures(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            figures.append(trainer.balance_figures())

    trainer.add_callback(Figures())
    start = time.perf_counter()
    out = trainer.train()
    seconds = time.perf_counter() - start
    grad_norms = [float(h["grad_norm"]) for h in trainer.state.log_history if "grad_norm" in h]
    mean = {k: sum(f[k] for f in figures) / len(figures) for k in figures[0]}
    return {
        "arm": name,
        "seconds": seconds,
        "loss": out.training_loss,
        "grad_norms": grad_norms,
        "weights": fingerprint(trainer.model_wrapped),
        **mean,
        "per_step": figures,
    }


def fingerprint(model) -> float:
    """Sum of |w| over the trained weights: each rank's ZeRO-3 partitions, summed over the ranks."""
    import torch
    import torch.distributed as dist

    total = torch.zeros((), dtype=torch.float64)
    for p in model.parameters():
        part = getattr(p, "ds_tensor", p)
        total += part.detach().double().abs().sum()
    dist.all_reduce(total)
    return float(total)


def worker(opts) -> None:
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from rlt.stages.ranks import join_process_group

    rank, world = join_process_group("cpu")
    mix = {"short": (opts.short_min, opts.short_max), "long": (opts.long_min, opts.long_max), "long_share": opts.share}
    per_step = world * opts.micro // opts.generations
    prompts = [{"prompt": f"Question {i}: what is {i} plus {2 * i}? Answer:"} for i in range(per_step * opts.steps)]
    order = [("TRL", False), ("dealt", True)]
    order += order[::-1] * (opts.repeats > 1)  # A B B A: a drift in the machine's speed costs both arms alike
    runs = [run_arm(name, deal, opts, prompts, mix) for name, deal in order]
    sft: list[dict] = []
    sft_order = [("random", "random"), ("dealt", "batch_rebalance")]
    if opts.sft:
        from rlt.data.models import load_tokenizer
        from rlt.spec.inputs import ModelRef

        rows = sft_rows(load_tokenizer(ModelRef(model=opts.model)), opts, mix, world)
        sft_order += sft_order[::-1] * (opts.repeats > 1)
        sft = [run_sft_arm(name, strategy, opts, rows) for name, strategy in sft_order]
    if rank == 0:
        out = {"world": world, "arms": averaged(runs, ["TRL", "dealt"]), "sft": averaged(sft, ["random", "dealt"])}
        Path(opts.out).write_text(json.dumps(out))


def averaged(runs: list[dict], names: list[str]) -> list[dict]:
    """Each arm's first run, its seconds the mean over its runs (none when the arms did not run)."""
    arms = []
    for name in names:
        mine = [r for r in runs if r["arm"] == name]
        if mine:
            arms.append({**mine[0], "seconds": sum(r["seconds"] for r in mine) / len(mine), "runs": len(mine)})
    return arms


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_world(opts, argv: list[str], timeout: float = 3000) -> dict:
    """Both arms in one gloo world of `opts.world` CPU ranks under ZeRO-3; rank 0's results."""
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={opts.world}"]
    cmd += [f"--master_port={free_port()}", __file__, "--worker", *argv]
    training = str(Path(__file__).resolve().parent.parent / "training")  # this tree's rlt in every rank
    path = os.pathsep.join(p for p in (training, os.environ.get("PYTHONPATH")) if p)
    env = dict(
        os.environ,
        OMP_NUM_THREADS=str(opts.threads),
        ACCELERATE_USE_DEEPSPEED="true",  # as `accelerate launch --use_deepspeed` sets it
        PYTHONPATH=path,
        CUDA_VISIBLE_DEVICES="",
    )
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"world failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    return json.loads(Path(opts.out).read_text())


def parse(argv: list[str] | None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--micro", type=int, default=32, help="micro-steps per optimizer step (one row each)")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--generations", type=int, default=8)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--model", help=argparse.SUPPRESS)  # set by the parent: the model it built
    ap.add_argument("--loss-type", default="grpo", choices=("grpo", "dr_grpo", "dapo"))
    ap.add_argument("--beta", type=float, default=0.04, help="GRPO's KL weight; > 0 runs the reference pass")
    ap.add_argument("--no-sft", dest="sft", action="store_false", help="leave out the sft arms")
    ap.add_argument("--sft-micro", type=int, default=4, help="sft micro-steps per step (one row each per rank)")
    ap.add_argument("--sft-steps", type=int, default=32, help="sft steps in its one epoch")
    ap.add_argument("--short-min", type=int, default=16)
    ap.add_argument("--short-max", type=int, default=160)
    ap.add_argument("--long-min", type=int, default=384)
    ap.add_argument("--long-max", type=int, default=960)
    ap.add_argument("--share", type=float, default=0.15, help="share of long completions")
    ap.add_argument("--threads", type=int, default=1, help="OMP threads per rank")
    ap.add_argument("--repeats", type=int, default=2, choices=(1, 2), help="2: arms run A B B A, seconds averaged")
    ap.add_argument("--simulate", action="store_true", help="also the deal alone at 4/8/16 ranks, 1024 rows a step")
    ap.add_argument("--target", type=float, default=1.1, help="largest token imbalance of the dealt arm that passes")
    ap.add_argument("--out", default=str(Path(tempfile.gettempdir()) / f"rank_balance_{os.getpid()}.json"))
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    opts = parse(argv)
    if opts.worker:
        worker(opts)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        model = build_model(Path(tmp) / "model", opts.width, opts.layers)
        res = run_world(opts, [*argv, "--model", model] + ([] if "--out" in argv else ["--out", opts.out]))
    print(
        f"\n{res['world']} ranks (gloo, DeepSpeed ZeRO-3, {opts.threads} thread(s) each), random Qwen2 width "
        f"{opts.width} x {opts.layers} layers, {opts.micro} micro-steps of "
        f"one row per rank per step, {opts.steps} step(s); completions {opts.short_min}-{opts.short_max} tokens, "
        f"{opts.share:.0%} of them {opts.long_min}-{opts.long_max}; rl loss {opts.loss_type}, beta {opts.beta}"
    )
    print(
        "| stage | arm | update imbalance (tokens) | (seconds) | reference pass imbalance (tokens) | (seconds) "
        "| training seconds | loss | grad norm per step | sum abs(w) |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---|---:|")
    ok = compare("rl", res["arms"], opts)
    if res["sft"]:
        ok = compare("sft", res["sft"], opts, same_rows=opts.sft_steps == 1) and ok
        print(
            f"sft: {opts.sft_steps} step(s) of {opts.sft_micro} micro-steps of one row per rank, one epoch; the deal "
            "spans a window of steps (rlt.stages.sft_balance.WINDOW_ROWS)"
        )
    if opts.simulate:
        simulate(opts)
    return 0 if ok else 1


def compare(stage: str, arms: list[dict], opts, same_rows: bool = True) -> bool:
    """Print a stage's two arms (undealt first) and whether the dealt one reaches the target, with the same
    training where its steps hold the same rows (`same_rows`): loss, grad norms and weights equal."""

    def figure(a: dict, key: str) -> str:
        return f"{a[key]:.3f}" if key in a else "-"

    for a in arms:
        norms = ", ".join(f"{g:.8f}" for g in a["grad_norms"])
        print(
            f"| {stage} | {a['arm']} | {figure(a, 'rank_imbalance_tokens')} | {figure(a, 'rank_imbalance_seconds')} "
            f"| {figure(a, 'rank_imbalance_passes_tokens')} | {figure(a, 'rank_imbalance_passes_seconds')} "
            f"| {a['seconds']:.1f} | {a['loss']:.3e} | {norms} | {a['weights']:.6f} |"
        )
    before, after = arms
    same = [abs(x - y) / max(abs(x), 1e-12) for x, y in zip(before["grad_norms"], after["grad_norms"], strict=True)]
    weights = abs(before["weights"] - after["weights"]) / before["weights"]
    loss = abs(before["loss"] - after["loss"])
    dealt = {k: v for k, v in after.items() if k in ("rank_imbalance_tokens", "rank_imbalance_passes_tokens")}
    ok = max(dealt.values()) <= opts.target
    if same_rows:
        ok = ok and max(same) <= 1e-4 and weights <= 1e-6 and loss <= 1e-6
        agree = (
            f"loss difference {loss:.1e}, largest relative grad-norm difference {max(same):.1e}, weights {weights:.1e}"
        )
    else:
        agree = f"mean loss {before['loss']:.4f} vs {after['loss']:.4f} (other rows share each step)"
    print(
        f"{stage}: training time {before['seconds'] / after['seconds']:.2f}x faster; {agree}; token imbalance "
        + ", ".join(
            f"{k.removeprefix('rank_imbalance_')} {before[k]:.3f} -> {v:.3f}" for k, v in dealt.items() if k in before
        )
        + f" (target <= {opts.target}) -> {'PASS' if ok else 'FAIL'}"
    )
    return ok


def simulate(opts, rows: int = 1024, steps: int = 20) -> None:
    """The token imbalance of TRL's layout (each rank's own rows, shuffled) and of the deal, for the paper's 1024
    rows a step (one per micro-batch, G = 64) on 4, 8 and 16 ranks, with this run's length mix (no training)."""
    from rlt.stages.balance import deal, imbalance, micro_step_tokens

    mix = {"short": (opts.short_min, opts.short_max), "long": (opts.long_min, opts.long_max), "long_share": opts.share}
    print(f"\nthe deal alone: {rows} rows a step, one per micro-batch, G = 64, mean of {steps} steps")
    print("| ranks | micro-steps per rank | TRL (shuffled per rank) | dealt |")
    print("|---:|---:|---:|---:|")
    for world in (4, 8, 16):
        trl, dealt = [], []
        for step in range(steps):
            lengths = [completion_length(f"s{step} q{i // 64}", i % 64, **mix) for i in range(rows)]
            rnd, local = random.Random(step), rows // world
            shuffled = [rnd.sample(range(r * local, (r + 1) * local), local) for r in range(world)]
            trl.append(imbalance(micro_step_tokens(lengths, shuffled, 1)))
            dealt.append(imbalance(micro_step_tokens(lengths, deal(lengths, world, local, 1), 1)))
        print(f"| {world} | {rows // world} | {sum(trl) / steps:.3f} | {sum(dealt) / steps:.3f} |")
    simulate_sft(mix)


def simulate_sft(mix: dict, epoch_rows: int = 4096) -> None:
    """sft's samplers alone (no training) on an epoch of this run's length mix, one row per micro-batch, 4 rows a
    step per rank (paper-7b's 16 rows at 4 ranks; 2x8's 64 at 8 after its 8 micro-steps): transformers' random
    sampler (batch k to rank k mod world), its batch_rebalance (one step's rows), rlt's StepDeal (a window)."""
    from transformers.trainer_pt_utils import BatchRebalanceSampler

    from rlt.stages.balance import imbalance
    from rlt.stages.sft_balance import step_deal_class

    lengths = [completion_length(f"sft {i}", 0, **mix) for i in range(epoch_rows)]
    print(f"\nsft's samplers alone: {epoch_rows} rows, one per micro-batch, one epoch")
    print("| ranks | micro-steps per step | random | batch_rebalance (one step) | StepDeal (window) |")
    print("|---:|---:|---:|---:|---:|")
    for world, micro in ((4, 4), (8, 8), (16, 4)):

        def tokens(batches: list[list[list[int]]]) -> float:
            steps = len(batches[0])
            return imbalance([[float(max(lengths[i] for i in b[s])) for b in batches] for s in range(steps)])

        order = random.Random(0).sample(range(epoch_rows), epoch_rows)
        rnd = [[[i] for i in order[r::world]] for r in range(world)]
        step = world * micro
        rebalance = [list(BatchRebalanceSampler(lengths, step, world, micro, seed=0, rank=r)) for r in range(world)]
        window = [list(step_deal_class()(lengths, 1, world, micro, r, 0)) for r in range(world)]
        print(f"| {world} | {micro} | {tokens(rnd):.3f} | {tokens(rebalance):.3f} | {tokens(window):.3f} |")


if __name__ == "__main__":
    sys.exit(main())
