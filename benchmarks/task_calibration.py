"""How well does the untrained student answer a built-in task, alone and when shown a worked explanation?

Per level of `basic` (or for `sums`, two-digit + two-digit), N fresh questions (seeded), the student (default SmolLM2-135M-Instruct) answers greedily:
  free       student chat (system prompt, question), the model writes its own thought and answer (what the
             evaluate stage and `rlt compare` measure; a 135M model rambles, so the token limit matters);
  direct     the thought left empty and the answer tag opened: the model writes the answer at once (the setting
             the RLT reward scores, with an empty explanation);
  explained  the same chat with the task's worked reasoning inside the thought tags and the answer tag opened.
Both are graded by the task's own checker (rlt.data.tasks.check_builtin, recomputed from the question). Prints a
table with 95 % Wilson intervals. Usage:
  nice -n 10 python benchmarks/task_calibration.py [--per-level 64] [--model builtin:smollm2-135m-instruct]
  nice -n 10 python benchmarks/task_calibration.py --task sums --reward   # + the RLT reward of worked vs leaked
"""

from __future__ import annotations

import argparse
import math
import time

from rlt.data import tasks
from rlt.method.prompts import Formatter, resolve_format
from rlt.spec.inputs import FormatSpec, ModelRef


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95 % Wilson score interval of a binomial proportion k/n."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def _greedy_texts(model, tokenizer, prompts: list[str], max_new_tokens: int, batch_size: int) -> list[str]:
    from rlt.method.generation import greedy

    out = []
    for i in range(0, len(prompts), batch_size):
        ids = [tokenizer(p, add_special_tokens=False).input_ids for p in prompts[i : i + batch_size]]
        out += [tokenizer.decode(c, skip_special_tokens=True) for c in greedy(model, tokenizer, ids, max_new_tokens)]
    return out


def answer_alone(
    model, tokenizer, formatter: Formatter, questions: list[str], max_new_tokens: int = 48, batch_size: int = 16
) -> list[str]:
    """The student's own outputs (thought and answer) for each question."""
    prompts = [
        tokenizer.apply_chat_template(
            formatter.student_messages(q, "", "")[:2], tokenize=False, add_generation_prompt=True
        )
        for q in questions
    ]
    return _greedy_texts(model, tokenizer, prompts, max_new_tokens, batch_size)


def answer_explained(
    model,
    tokenizer,
    formatter: Formatter,
    questions: list[str],
    explanations: list[str],
    max_new_tokens: int = 8,
    batch_size: int = 16,
) -> list[str]:
    """The student's answers when the thought is the given explanation (answer tag already opened)."""
    t = formatter.t
    prompts = []
    for q, e in zip(questions, explanations, strict=True):
        messages = formatter.student_messages(q, e, "")
        messages[-1]["content"] = f"{t.thought_start}{e}{t.thought_end}{formatter.fmt.separator}{t.solution_start}"
        prompts.append(tokenizer.apply_chat_template(messages, tokenize=False, continue_final_message=True))
    outs = _greedy_texts(model, tokenizer, prompts, max_new_tokens, batch_size)
    return [t.solution_start + o for o in outs]


def graded(questions: list[str], outputs: list[str], formatter: Formatter) -> list[bool]:
    from rlt.stages.evaluate import grade

    tags = (formatter.t.solution_start, formatter.t.solution_end)
    return [
        grade({"question": q, "solution": ""}, o, "builtin", tags)[1] for q, o in zip(questions, outputs, strict=True)
    ]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="builtin:smollm2-135m-instruct")
    p.add_argument("--per-level", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--task", default="basic", choices=("basic", "sums"))
    p.add_argument("--levels", default=",".join(map(str, tasks.BASIC_LEVELS)), help="levels of `basic`")
    p.add_argument("--reward", action="store_true", help="also the RLT reward of worked vs bare-answer explanations")
    p.add_argument("--show", type=int, default=0, help="print this many raw outputs per level")
    p.add_argument("--free-tokens", type=int, default=48, help="token limit of the free answers (0: skip them)")
    args = p.parse_args()

    from rlt.data.models import load_model, load_tokenizer

    ref = ModelRef(model=args.model)
    tokenizer = load_tokenizer(ref, padding_side="left")
    model = load_model(ref)
    formatter = Formatter(resolve_format(FormatSpec()))
    print(f"student {args.model}, {args.per_level} questions per level, greedy, seed {args.seed}")
    print(
        "| level | example | free (own thought) | 95 % CI | direct (empty thought) | 95 % CI | "
        "with worked explanation | 95 % CI | seconds |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    variants = [f"basic-{lv}" for lv in args.levels.split(",")] if args.task == "basic" else [args.task]
    reward_rows = []
    for variant in variants:
        level = variant.removeprefix("basic-")
        t0 = time.perf_counter()
        rows = tasks.generate(variant, args.per_level, args.seed)
        qs = [r["question"] for r in rows]
        cells = []
        free = answer_alone(model, tokenizer, formatter, qs, args.free_tokens) if args.free_tokens else None
        direct = answer_explained(model, tokenizer, formatter, qs, [""] * len(qs))
        helped = answer_explained(model, tokenizer, formatter, qs, [r["reasoning_trace"] for r in rows])
        for outputs in (free, direct, helped):
            if outputs is None:
                cells.append("— | —")
                continue
            ok = graded(qs, outputs, formatter)
            lo, hi = wilson(sum(ok), len(ok))
            cells.append(f"{sum(ok) / len(ok):.2f} | [{lo:.2f}, {hi:.2f}]")
        print(f"| {level} | {qs[0]} | {' | '.join(cells)} | {time.perf_counter() - t0:.0f} |", flush=True)
        for q, o in list(zip(qs, direct, strict=True))[: args.show]:
            print(f"    direct {q!r} -> {o!r}")
        if args.reward:
            reward_rows.append((level, reward_contrast(model, args.model, formatter, rows)))
    if reward_rows:
        print("\nRLT reward at initialisation (teacher = the same untrained model), mean [min, max] over questions")
        print("| level | explanation | R | r_SS | r_KL | worked > this on |")
        print("|---|---|---|---|---|---|")
        for level, contrast in reward_rows:
            worked = contrast["worked"].total
            for name, b in contrast.items():
                wins = sum(w > x for w, x in zip(worked, b.total, strict=True))
                print(
                    f"| {level} | {name} | {_mean(b.total):+.2f} [{min(b.total):+.2f}, {max(b.total):+.2f}] | "
                    f"{_mean(b.r_ss):+.2f} | {_mean(b.r_kl):+.3f} | "
                    f"{'—' if name == 'worked' else f'{wins}/{len(worked)}'} |"
                )


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def reward_contrast(model, model_name: str, formatter: Formatter, rows: list[dict]) -> dict:
    """The RLT reward's breakdown for the worked trace and for a bare "The answer is X." on each row."""
    from rlt.data.models import load_tokenizer
    from rlt.method.reward import RLTReward

    tok = load_tokenizer(ModelRef(model=model_name), padding_side="right")
    reward = RLTReward(model, tok, formatter, teacher=model, teacher_tokenizer=tok, temperature=0.7)
    qs, sols = [r["question"] for r in rows], [r["solution"] for r in rows]
    out = {}
    for name, make in (
        ("worked", lambda r: r["reasoning_trace"]),
        ("bare answer", lambda r: f"The answer is {r['solution']}."),
    ):
        out[name] = reward.score(qs, sols, [formatter.teacher_completion(make(r), "") for r in rows])
    return out


if __name__ == "__main__":
    main()
