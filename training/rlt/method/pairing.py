"""Pairing the teacher's and the student's log-probs over the explanation E (the Δ terms of r_KL).

The paper defines Δ_t per token, for one tokenizer and one tokenisation of E on both sides. Real data breaks that
assumption in three ways: a byte-level BPE splits one character over several tokens (`≤`, CJK, emoji, combining
marks), all of which carry the same character offsets; sampled ids need not be the tokenizer's canonical split of the
text the student re-tokenises; and the teacher and student tokenizers may differ. The rule (docs/reward.md):

1. On each side, tokens whose character ranges overlap form one *unit* (a character split over tokens is one unit).
2. Units are matched into *segments*: the shortest character ranges that start and end on a unit boundary of both
   sides, with no gap on either side (tokens that straddle the edge of E are scored by neither side).
3. In a segment where both sides hold the same token sequence (same vocabulary, same ids), every token is its own
   Δ: exactly the paper's per-token definition. Otherwise the segment gives one Δ, the difference of the summed
   log-probs of its tokens: by the chain rule, the log-probability each model assigns to that piece of text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class SideTokens:
    """One side's tokens wholly inside E: character ranges relative to E, token ids, log-probs (same order)."""

    offsets: Sequence[tuple[int, int]]
    ids: Sequence[int]
    logprobs: Sequence[float]

    def __len__(self) -> int:
        return len(self.offsets)


@dataclass
class Pairing:
    deltas: list[float]  # teacher − student log-prob, per token or per segment
    paired_tokens: int  # tokens of both sides that fell in a matched segment
    total_tokens: int  # tokens of both sides inside E
    teacher: list[float] = field(
        default_factory=list
    )  # the teacher's log-prob of each Δ's piece (Δ = teacher − student)
    student: list[float] = field(default_factory=list)  # the student's log-prob of the same piece

    @property
    def coverage(self) -> float:
        """Share of explanation tokens (both sides) that got a partner; 1 for an empty explanation."""
        return self.paired_tokens / self.total_tokens if self.total_tokens else 1.0


def _units(offsets: Sequence[tuple[int, int]]) -> list[tuple[int, int, int, int]]:
    """(start, end, first token, one past the last token) of each run of overlapping token ranges."""
    units: list[tuple[int, int, int, int]] = []
    for k, (s, e) in enumerate(offsets):
        if units and s < units[-1][1]:
            u = units[-1]
            units[-1] = (u[0], max(u[1], e), u[2], k + 1)
        else:
            units.append((s, e, k, k + 1))
    return units


def pair_explanation(teacher: SideTokens, student: SideTokens, same_vocab: bool) -> Pairing:
    """Δ terms of r_KL by the rule in the module docstring; linear in the number of tokens."""
    tu, su = _units(teacher.offsets), _units(student.offsets)
    t_lp, s_lp = list(teacher.logprobs), list(student.logprobs)
    deltas: list[float] = []
    t_parts: list[float] = []
    s_parts: list[float] = []
    paired = 0
    i = j = 0
    while i < len(tu) and j < len(su):
        ts, te, ta, tb = tu[i]
        ss, se, sa, sb = su[j]
        if ts != ss:  # no common start: the earlier unit has no partner
            if ts < ss:
                i += 1
            else:
                j += 1
            continue
        if te == se and tb - ta == 1 and sb - sa == 1:  # the common case: one token each side, same characters
            t_parts.append(float(t_lp[ta]))
            s_parts.append(float(s_lp[sa]))
            paired += 2
            i, j = i + 1, j + 1
            continue
        ti, sj = i + 1, j + 1
        while te != se:  # grow the side that ends first, as long as it stays contiguous
            if te < se:
                if ti == len(tu) or tu[ti][0] != te:
                    break
                te, ti = tu[ti][1], ti + 1
            else:
                if sj == len(su) or su[sj][0] != se:
                    break
                se, sj = su[sj][1], sj + 1
        if te == se:
            a, b, c, d = ta, tu[ti - 1][3], sa, su[sj - 1][3]
            if same_vocab and list(teacher.ids[a:b]) == list(student.ids[c:d]):
                t_parts += [float(t) for t in t_lp[a:b]]
                s_parts += [float(x) for x in s_lp[c:d]]
            else:
                t_parts.append(float(sum(t_lp[a:b])))
                s_parts.append(float(sum(s_lp[c:d])))
            paired += (b - a) + (d - c)
        i, j = ti, sj
    deltas = [t - x for t, x in zip(t_parts, s_parts, strict=True)]
    return Pairing(deltas, paired, len(teacher) + len(student), t_parts, s_parts)
