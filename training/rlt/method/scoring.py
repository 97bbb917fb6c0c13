"""Tempered log-probs of the tokens inside character spans of texts, computed with as little work as possible.

What makes it cheap (see docs/reward.md and benchmarks/reward_scoring.py):
- requests are sorted by length and run in right-padded micro-batches; right padding needs no attention
  mask under a causal model, so real tokens never see padding;
- only the backbone runs on every position; the LM head and an fp32 log-softmax run only on the rows
  that predict a scored token, in chunks, so no [batch, length, vocab] tensor ever exists;
- requests of one group (the G explanations of one question) share a token prefix (system prompt and
  question): it runs once and its KV cache is reused for every micro-batch of the group.
"""

from __future__ import annotations

import copy
from collections import defaultdict
from collections.abc import Callable, Hashable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from rlt.method.prompts import Span, span_positions

MIN_SHARED_PREFIX = 8  # below this, a separate prefix pass costs more than it saves

# Decodes several token-id sequences at once (a fast tokenizer's batch decode, or one decode per sequence).
DecodeMany = Callable[[list[list[int]]], list[str]]


@dataclass
class ScoreRequest:
    text: str
    spans: Sequence[Span]
    group: Hashable | None = None  # same group = likely shared prefix


@dataclass
class SpanScores:
    """Scored tokens of one span: char offsets relative to the span start, their ids and their log-probs."""

    offsets: list[tuple[int, int]]
    logprobs: torch.Tensor  # float32, one per token
    ids: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.offsets)


@dataclass
class ScoringStats:
    forward_tokens: int = 0  # positions run through the backbone
    scored_tokens: int = 0  # rows run through the head
    prefix_tokens_saved: int = 0

    def add(self, other: ScoringStats) -> None:
        self.forward_tokens += other.forward_tokens
        self.scored_tokens += other.scored_tokens
        self.prefix_tokens_saved += other.prefix_tokens_saved


@dataclass
class _Seq:
    index: int
    ids: list[int]
    targets: list[list[int]]  # per span: token positions t whose log p(ids[t] | ids[:t]) is wanted
    offsets: list[list[tuple[int, int]]] = field(default_factory=list)


def _common_prefix_len(seqs: list[list[int]]) -> int:
    first, n = seqs[0], min(len(s) for s in seqs)
    for i in range(n):
        tok = first[i]
        if any(s[i] != tok for s in seqs[1:]):
            return i
    return n


def logit_multiplier(config: Any) -> float:
    """What a model's forward multiplies its head's logits by, outside the head (the scorer calls the head itself):
    Granite's models divide by `logits_scaling`, Cohere's multiply by `logit_scale`, Falcon-H1 by
    `lm_head_multiplier`, Muse's text models by `output_multiplier`; 1 for the rest (Llama, Qwen, SmolLM, ...). By model type: MPT's config has a `logit_scale`
    its transformers forward does not apply."""
    for cfg in (config, getattr(config, "text_config", None)):
        kind = str(getattr(cfg, "model_type", "") or "")
        for family, name, invert in (
            ("granite", "logits_scaling", True),
            ("cohere", "logit_scale", False),
            ("muse", "output_multiplier", False),
            ("falcon_h1", "lm_head_multiplier", False),
        ):
            value = getattr(cfg, name, None) if kind.startswith(family) else None
            if isinstance(value, int | float) and value:
                return 1.0 / float(value) if invert else float(value)
    return 1.0


class SpanScorer:
    """log softmax(logits / temperature) at the tokens that lie wholly inside the requested spans."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        temperature: float = 1.0,
        batch_size: int = 8,
        share_prefix: bool = True,
        head_chunk: int = 128,
        max_batch_tokens: int | None = None,
    ) -> None:
        if not getattr(tokenizer, "is_fast", False):
            raise ValueError("span scoring needs a fast tokenizer (character offsets)")
        self.model = model
        self.tokenizer = tokenizer
        self.temperature = float(temperature)
        self.batch_size = batch_size
        self.share_prefix = share_prefix
        self.head_chunk = head_chunk
        # A micro-batch holds at most `batch_size` rows AND at most this many padded positions (rows × longest row,
        # shared prefix included: its KV cache is copied per row); a longer row runs alone. None: rows only.
        self.max_batch_tokens = max_batch_tokens
        self.backbone = getattr(model, model.base_model_prefix)
        self.head = model.get_output_embeddings()  # type: ignore[no-untyped-call]  # unannotated in transformers
        self.softcap = getattr(model.config, "final_logit_softcapping", None)
        self.logit_multiplier = logit_multiplier(model.config)
        self.stats = ScoringStats()
        # Entered around each score() call. Under ZeRO-3 the frozen model's parameters are partitioned across ranks
        # (rlt.stages.rl.partition_frozen) and this gathers them for the call: ranks run different numbers of
        # micro-batches, so gathering module by module (the hooks' way) would leave ranks waiting on each other.
        self.gathered: Callable[[], AbstractContextManager[object]] = nullcontext

    # ---- preparation
    def _prepare(self, requests: Sequence[ScoreRequest]) -> list[_Seq]:
        enc = self.tokenizer([r.text for r in requests], add_special_tokens=False, return_offsets_mapping=True)
        seqs = []
        for i, req in enumerate(requests):
            ids, offs = enc["input_ids"][i], enc["offset_mapping"][i]
            seq = _Seq(i, ids, [])
            for span in req.spans:
                pos = span_positions(offs, span)
                seq.targets.append(pos)
                seq.offsets.append([(offs[t][0] - span.start, offs[t][1] - span.start) for t in pos])
            seqs.append(seq)
        return seqs

    def _plan(self, requests: Sequence[ScoreRequest], seqs: list[_Seq]) -> list[tuple[int, list[_Seq]]]:
        """(shared prefix length, micro-batch) pairs; a micro-batch never mixes prefixes."""
        groups: dict[Hashable, list[_Seq]] = defaultdict(list)
        loose: list[_Seq] = []
        for req, seq in zip(requests, seqs, strict=True):
            (groups[req.group] if (self.share_prefix and req.group is not None) else loose).append(seq)
        plan: list[tuple[int, list[_Seq]]] = []
        for members in groups.values():
            first_needed = min((t for s in members for span in s.targets for t in span), default=1)
            prefix = min(
                _common_prefix_len([s.ids for s in members]), first_needed - 1, min(len(s.ids) for s in members) - 1
            )
            if len(members) < 2 or prefix < MIN_SHARED_PREFIX:
                loose += members
                continue
            plan += [(prefix, batch) for batch in self._pack(members)]
        plan += [(0, batch) for batch in self._pack(loose)]
        return plan

    def _pack(self, seqs: list[_Seq]) -> list[list[_Seq]]:
        """Micro-batches of length-sorted sequences, each within batch_size rows and max_batch_tokens positions."""
        batches: list[list[_Seq]] = []
        for seq in sorted(seqs, key=lambda s: len(s.ids)):
            last = batches[-1] if batches else None
            # sorted: the new row is the longest, so the padded batch is (rows + 1) × its length
            if (
                last is not None
                and len(last) < self.batch_size
                and (self.max_batch_tokens is None or (len(last) + 1) * len(seq.ids) <= self.max_batch_tokens)
            ):
                last.append(seq)
            else:
                batches.append([seq])
        return batches

    # ---- compute
    def _head_logprobs(self, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        # Without softcapping or a head bias, logits/τ = head(hidden/τ): scaling the narrow hidden rows
        # instead of the vocabulary-wide logits saves a full pass over every [rows, vocab] chunk.
        # A model's own multiplier of its head's logits (Granite's 1/logits_scaling, Cohere's logit_scale) folds in
        # the same way: logits × m / τ = head(hidden × m / τ).
        fold = not self.softcap and getattr(self.head, "bias", None) is None
        if fold and self.logit_multiplier != 1.0:
            hidden = hidden * (self.logit_multiplier / self.temperature)
        elif fold and self.temperature != 1.0:
            hidden = hidden / self.temperature
        out = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)
        for i in range(0, hidden.shape[0], self.head_chunk):
            logits = self.head(hidden[i : i + self.head_chunk]).float()
            if not fold:
                if self.logit_multiplier != 1.0:
                    logits = logits * self.logit_multiplier
                if self.softcap:
                    logits = torch.tanh(logits / self.softcap) * self.softcap
                logits.div_(self.temperature)
            # log_softmax + gather is one vectorised pass on CPU, ~2.5x faster than logsumexp here
            tgt = targets[i : i + self.head_chunk]
            out[i : i + self.head_chunk] = torch.log_softmax(logits, dim=-1).gather(1, tgt[:, None]).squeeze(1)
        return out

    @torch.no_grad()
    def _run_batch(
        self, prefix_len: int, batch: list[_Seq], prefix_cache: DynamicCache | None
    ) -> list[list[torch.Tensor]]:
        device = self.head.weight.device
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        width = max(len(s.ids) for s in batch) - prefix_len
        ids = torch.full((len(batch), width), pad, dtype=torch.long, device=device)
        for j, s in enumerate(batch):
            suffix = s.ids[prefix_len:]
            ids[j, : len(suffix)] = torch.tensor(suffix, device=device)
        cache = None
        if prefix_cache is not None:
            cache = copy.deepcopy(prefix_cache)
            cache.batch_repeat_interleave(len(batch))
        out = self.backbone(input_ids=ids, past_key_values=cache, use_cache=cache is not None)
        hidden = out.last_hidden_state
        rows, tgts = [], []
        for j, s in enumerate(batch):
            for span in s.targets:
                rows += [j * width + (t - 1 - prefix_len) for t in span]
                tgts += [s.ids[t] for t in span]
        self.stats.forward_tokens += sum(len(s.ids) - prefix_len for s in batch)
        self.stats.scored_tokens += len(rows)
        if rows:
            flat = hidden.reshape(-1, hidden.shape[-1])[torch.tensor(rows, device=device)]
            lp = self._head_logprobs(flat, torch.tensor(tgts, device=device))
        else:
            lp = torch.empty(0)
        lp = lp.float().cpu()
        results, k = [], 0
        for s in batch:
            per_span = []
            for span in s.targets:
                per_span.append(lp[k : k + len(span)])
                k += len(span)
            results.append(per_span)
        return results

    @torch.no_grad()
    def _prefix_cache(self, ids: list[int]) -> DynamicCache:
        from transformers import DynamicCache

        device = self.head.weight.device
        cache = DynamicCache(config=self.model.config)
        self.backbone(input_ids=torch.tensor([ids], device=device), past_key_values=cache, use_cache=True)
        self.stats.forward_tokens += len(ids)
        return cache

    def score(self, requests: Sequence[ScoreRequest]) -> list[list[SpanScores]]:
        with self.gathered():  # also with no requests: every rank enters the gather, or the others wait forever
            return self._score(requests) if requests else []

    def _score(self, requests: Sequence[ScoreRequest]) -> list[list[SpanScores]]:
        seqs = self._prepare(requests)
        results: list[list[SpanScores] | None] = [None] * len(requests)
        cache_key, cache = None, None
        for prefix_len, batch in self._plan(requests, seqs):
            if prefix_len:
                key = (prefix_len, tuple(batch[0].ids[:prefix_len]))
                if key != cache_key:
                    cache_key, cache = key, self._prefix_cache(batch[0].ids[:prefix_len])
                self.stats.prefix_tokens_saved += prefix_len * (len(batch) - 1)
            for s, per_span in zip(
                batch, self._run_batch(prefix_len, batch, cache if prefix_len else None), strict=True
            ):
                results[s.index] = [
                    SpanScores(o, lp, [s.ids[t] for t in tg])
                    for o, lp, tg in zip(s.offsets, per_span, s.targets, strict=True)
                ]
        return results  # type: ignore[return-value]


MAX_SPLIT_TOKENS = 8  # a character split over more byte-level tokens than this is not a character


def completion_token_offsets(
    tokenizer: PreTrainedTokenizerBase, ids: Sequence[int]
) -> tuple[list[tuple[int, int]], str]:
    """Character range of each generated token inside `text = decode(ids, skip_special_tokens=True)`, and `text`.

    Linear time. A character split over several byte-level tokens decodes to U+FFFD until its last byte arrives:
    those tokens are decoded as one group and all get the group's range (as a fast tokenizer's offsets do).
    Tokenizers whose single-token decode differs from their decode in context (SentencePiece's leading space)
    are decoded with a few tokens of context instead."""
    ids = list(ids)
    text = tokenizer.decode(ids, skip_special_tokens=True)
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and not getattr(tokenizer, "clean_up_tokenization_spaces", False):

        def decode_many(seqs: list[list[int]]) -> list[str]:
            decoded: list[str] = backend.decode_batch(seqs, skip_special_tokens=True)
            return decoded
    else:

        def decode_many(seqs: list[list[int]]) -> list[str]:
            return [str(tokenizer.decode(q, skip_special_tokens=True)) for q in seqs]  # one sequence -> one str

    pieces = decode_many([[i] for i in ids])
    offsets, texts, pos, k = [], [], 0, 0
    while k < len(ids):
        j, piece = k + 1, pieces[k]
        while piece.endswith("\ufffd") and j < len(ids) and j - k < MAX_SPLIT_TOKENS:
            j += 1
            piece = decode_many([ids[k:j]])[0]
        offsets += [(pos, pos + len(piece))] * (j - k)
        texts.append(piece)
        pos += len(piece)
        k = j
    if "".join(texts) == text:
        return offsets, text
    offsets, texts = _offsets_in_context(ids, decode_many)
    if "".join(texts) == text:
        return offsets, text
    raise ValueError(
        "cannot locate the generated tokens in their decoded text: the tokenizer decodes a sequence "
        "differently from its pieces"
    )


def _offsets_in_context(
    ids: list[int], decode_many: DecodeMany, context: int = 4
) -> tuple[list[tuple[int, int]], list[str]]:
    """Per-token ranges from decoding each new token after a few tokens of context (still linear, slower)."""
    offsets: list[tuple[int, int]] = []
    texts: list[str] = []
    pos, start = 0, 0
    for k in range(len(ids)):
        ctx = max(0, start - context)
        before, after = decode_many([ids[ctx:start], ids[ctx : k + 1]])
        last = k == len(ids) - 1 or k + 1 - start >= MAX_SPLIT_TOKENS
        if after.startswith(before) and (last or not after.endswith("\ufffd")):
            piece = after[len(before) :]
            offsets += [(pos, pos + len(piece))] * (k + 1 - start)
            texts.append(piece)
            pos += len(piece)
            start = k + 1
    offsets += [(pos, pos)] * (len(ids) - len(offsets))
    return offsets, texts
