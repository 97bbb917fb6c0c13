"""An independent oracle of the RLT reward, written from the paper's formula (arXiv 2506.08388) and docs/reward.md.

One completion at a time, one plain forward per model, full-vocabulary log_softmax(logits / τ), no batching, no
prefix cache, no character offsets from the tokenizer: where each token sits in the text is worked out from the
token's own bytes (byte-level BPE), so the oracle shares no code path with rlt.method.scoring / rlt.method.pairing.

    r_SS = mean ℓ + α·min ℓ   (student log-probs of the solution tokens)
    r_KL = mean Δ + α·max Δ   (Δ: teacher − student over the explanation; pairing rule of docs/reward.md)
    R    = r_SS − λ·r_KL − penalty·[explanation not closed]
"""

from __future__ import annotations

import torch

EMPTY_KL = 1.0


def byte_decoder() -> dict[str, int]:
    """The byte-level BPE alphabet: printable Latin-1 bytes stand for themselves, the rest are shifted past 255."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, shift = {}, 0
    for b in range(256):
        if b in printable:
            table[chr(b)] = b
        else:
            table[chr(256 + shift)] = b
            shift += 1
    return table


BYTES = byte_decoder()


def token_bytes(tok, ids, skip_special: bool = False) -> list[bytes]:
    special = set(tok.all_special_ids) if skip_special else set()
    return [
        b"" if i in special else bytes(BYTES[ch] for ch in piece)
        for i, piece in zip(ids, tok.convert_ids_to_tokens(list(ids)), strict=True)
    ]


def char_ranges(tok, ids, text: str, skip_special: bool = False) -> list[tuple[int, int]]:
    """Characters of `text` that each token's bytes touch (a token inside a split character touches that character).
    With `skip_special`, special tokens are not part of the text (a decoded completion) and get no characters."""
    data = text.encode("utf-8")
    pieces = token_bytes(tok, ids, skip_special)
    assert b"".join(pieces) == data, "oracle: the tokens' bytes are not the text's bytes"
    char_of_byte = []
    for i, ch in enumerate(text):
        char_of_byte += [i] * len(ch.encode("utf-8"))
    out, at = [], 0
    for p in pieces:
        out.append((char_of_byte[at], char_of_byte[at + len(p) - 1] + 1) if p else (len(text), len(text)))
        at += len(p)
    return out


@torch.no_grad()
def plain_logprobs(model, ids, tau: float) -> list[float | None]:
    """log p(ids[k] | ids[:k]) at temperature τ, full vocabulary, one forward; None for the first token."""
    logits = model(torch.tensor([list(ids)])).logits[0].float()
    lp = torch.log_softmax(logits / tau, dim=-1)
    return [None] + [lp[k - 1, ids[k]].item() for k in range(1, len(ids))]


def inside(ranges, lo: int, hi: int, first: int = 1) -> list[int]:
    return [k for k, (s, e) in enumerate(ranges) if k >= first and e > s >= lo and e <= hi]


def pair_by_cuts(t_tokens, s_tokens, same_vocab: bool) -> tuple[list[float], int, int]:
    """Δ terms from two sides' (start, end, id, logprob) tokens over E, by common cut points.

    A cut of one side is a position that no token of that side strictly contains. Between two consecutive cuts
    common to both sides, if both sides' tokens tile the range with no gap, the range is a segment: per-token Δ
    when the ids agree (same vocabulary), else one Δ of the summed log-probs."""

    def cuts(tokens):
        points = {p for s, e, _, _ in tokens for p in (s, e)}
        return {p for p in points if not any(s < p < e for s, e, _, _ in tokens)}

    common = sorted(cuts(t_tokens) & cuts(s_tokens))
    deltas, paired = [], 0
    for lo, hi in zip(common, common[1:], strict=False):
        tt = [x for x in t_tokens if x[0] >= lo and x[1] <= hi]
        ss = [x for x in s_tokens if x[0] >= lo and x[1] <= hi]

        def tiles(tokens, lo=lo, hi=hi):
            covered = set()
            for s, e, _, _ in tokens:
                covered |= set(range(s, e))
            return tokens and covered == set(range(lo, hi))

        if not (tiles(tt) and tiles(ss)):
            continue
        if same_vocab and [x[2] for x in tt] == [x[2] for x in ss]:
            deltas += [a[3] - b[3] for a, b in zip(tt, ss, strict=True)]
        else:
            deltas.append(sum(x[3] for x in tt) - sum(x[3] for x in ss))
        paired += len(tt) + len(ss)
    return deltas, paired, len(t_tokens) + len(s_tokens)


def oracle_reward(
    fmt,
    student,
    s_tok,
    teacher,
    t_tok,
    q: str,
    s: str,
    c: str,
    *,
    tau: float = 0.7,
    alpha: float = 0.01,
    lam: float = 3.0,
    penalty: float = 1.0,
    completion_ids=None,
    prompt_ids=None,
) -> dict[str, float]:
    """The reward of one completion. With `completion_ids` the teacher log-probs are those of exactly these
    generated ids after `prompt_ids` (the generation paths); without, of the re-tokenised teacher text."""
    tags = fmt.fmt.tags
    closed = tags.explanation_end in c
    expl = c.split(tags.explanation_end, 1)[0]
    # student: the chat that shows the explanation as the student's own thought, then the solution
    answer = (
        f"{tags.thought_start}{expl}{tags.thought_end}{fmt.fmt.separator}{tags.solution_start}{s}{tags.solution_end}"
    )
    chat = s_tok.apply_chat_template(
        [
            {"role": "system", "content": fmt.fmt.student_system_prompt},
            {"role": "user", "content": q},
            {"role": "assistant", "content": answer},
        ],
        tokenize=False,
    )
    e0 = chat.rindex(answer) + len(tags.thought_start)
    s0 = e0 + len(expl) + len(tags.thought_end) + len(fmt.fmt.separator) + len(tags.solution_start)
    ids = s_tok(chat, add_special_tokens=False).input_ids
    lps, ranges = plain_logprobs(student, ids, tau), char_ranges(s_tok, ids, chat)
    sol = [lps[k] for k in inside(ranges, s0, s0 + len(s))]
    s_side = [(ranges[k][0] - e0, ranges[k][1] - e0, ids[k], lps[k]) for k in inside(ranges, e0, e0 + len(expl))]
    # teacher: conditioned on question and solution, over the same explanation
    if completion_ids is None:
        prompt = t_tok.apply_chat_template(
            [
                {"role": "system", "content": fmt.fmt.teacher_system_prompt},
                {"role": "user", "content": q},
                {
                    "role": "assistant",
                    "content": f"{tags.solution_start}{s}{tags.solution_end}"
                    f"{fmt.fmt.separator}{tags.explanation_start}",
                },
            ],
            tokenize=False,
            continue_final_message=True,
        )
        t_ids = t_tok(prompt + c, add_special_tokens=False).input_ids
        t_lps, t_ranges = plain_logprobs(teacher, t_ids, tau), char_ranges(t_tok, t_ids, prompt + c)
        p = len(prompt)
        t_side = [
            (t_ranges[k][0] - p, t_ranges[k][1] - p, t_ids[k], t_lps[k]) for k in inside(t_ranges, p, p + len(expl))
        ]
    else:
        full = list(prompt_ids) + list(completion_ids)
        t_lps = plain_logprobs(teacher, full, tau)[len(prompt_ids) :]
        t_ranges = char_ranges(t_tok, completion_ids, c, skip_special=True)
        t_side = [
            (t_ranges[k][0], t_ranges[k][1], completion_ids[k], t_lps[k]) for k in inside(t_ranges, 0, len(expl), 0)
        ]
    same_vocab = t_tok is s_tok or t_tok.get_vocab() == s_tok.get_vocab()
    deltas, paired, total = pair_by_cuts(t_side, s_side, same_vocab)
    kl_mean = sum(deltas) / len(deltas) if deltas else EMPTY_KL
    kl_max = max(deltas) if deltas else EMPTY_KL
    r_ss = sum(sol) / len(sol) + alpha * min(sol)
    r_kl = kl_mean + alpha * kl_max
    pen = 0.0 if closed else penalty
    return {
        "total": r_ss - lam * r_kl - pen,
        "r_ss": r_ss,
        "r_kl": r_kl,
        "format_penalty": pen,
        "solution_logprob_mean": sum(sol) / len(sol),
        "solution_logprob_min": min(sol),
        "kl_mean": kl_mean,
        "kl_max": kl_max,
        "pairing_coverage": paired / total if total else 1.0,
    }


def tiny_lm(vocab_size: int, seed: int, **gen_config):
    """A tiny random Llama over a real vocabulary; larger init than usual so its distributions are far from uniform."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        initializer_range=0.2,
    )
    model = LlamaForCausalLM(cfg).eval().requires_grad_(False)
    for k, v in gen_config.items():
        setattr(model.generation_config, k, v)
    return model
