"""Sampling teacher completions together with the tempered log-probs of the sampled tokens.

Those log-probs are the teacher term of the RLT reward: taking them from sampling (in-process) or from
vLLM's returned logprobs (server mode, `--logprobs-mode processed_logprobs`) saves a teacher forward.

Clean sampling: the samples must come from the policy at temperature τ (and top-p), nothing else, or the
sampled log-probs stop being "log π^τ" and GRPO's on-policy assumption breaks. A checkpoint's
`generation_config.json` may ask for more (Qwen2.5-Instruct ships repetition_penalty 1.05), and both Hugging Face
`generate` and vLLM apply it unless told otherwise. So HF sampling runs with a generation config that holds only the
special-token ids from the model's, and vLLM requests set every distribution-changing parameter explicitly.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import torch

if TYPE_CHECKING:
    import requests
    from transformers import GenerationConfig, LogitsProcessorList, PreTrainedModel, PreTrainedTokenizerBase
    from transformers.generation.utils import GenerateDecoderOnlyOutput

# the finished and the cut-short sequences of one stream: {choice index: (token ids, logprobs)}, and why it was cut
Streamed = tuple[dict[int, tuple[list[int], list[float]]], str | None]


@dataclass
class Samples:
    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]  # up to and including the first EOS
    logprobs: list[list[float]]  # log π(token | prefix) at the sampling temperature, one per completion token


# vLLM sampling parameters that leave the distribution as is (the server's defaults come from the checkpoint).
NEUTRAL_VLLM_SAMPLING = {
    "repetition_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "min_p": 0.0,
    "min_tokens": 0,
}


def clean_generation_config(model: PreTrainedModel, **settings: Any) -> GenerationConfig:
    """A GenerationConfig with the model's special-token ids and `settings`, nothing else from the checkpoint."""
    from transformers import GenerationConfig

    own = model.generation_config
    ids = {k: getattr(own, k, None) for k in ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id")}
    merged = {**{k: v for k, v in ids.items() if v is not None}, **settings}
    return GenerationConfig(**merged)  # type: ignore[no-untyped-call]  # transformers leaves it unannotated


@contextmanager
def only_generation_config(model: PreTrainedModel, config: GenerationConfig) -> Iterator[GenerationConfig]:
    """`generate` fills every unset field from `model.generation_config`: swap in `config` while sampling."""
    saved = model.generation_config
    model.generation_config = config
    try:
        yield config
    finally:
        model.generation_config = saved


def seeded_draw(generator: torch.Generator) -> Any:
    """generate's last logits processor for sampling on a generator of one's own: it draws each next token from the
    processed (tempered, top-p) distribution with `generator`, keeps that token's log-prob in `.logprobs`, and leaves
    the token alone in the scores, so that generate, asked for greedy search, takes it and draws nothing from torch's
    shared generator. A sample then depends on its seed only, not on what other threads drew meanwhile."""
    from transformers import LogitsProcessor

    class SeededDraw(LogitsProcessor):
        def __init__(self) -> None:
            self.logprobs: list[torch.Tensor] = []

        def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
            logp = torch.log_softmax(scores.float(), dim=-1)
            token = torch.multinomial(logp.exp(), 1, generator=generator)
            self.logprobs.append(logp.gather(1, token).squeeze(1))
            only = torch.full_like(scores, float("-inf")).scatter_(1, token, 0.0)
            return cast("torch.FloatTensor", only)

    return SeededDraw()


def sampling_setup(
    model: PreTrainedModel,
    pad: int | None,
    temperature: float,
    top_p: float,
    max_new_tokens: int,
    generator: torch.Generator | None,
) -> tuple[GenerationConfig, LogitsProcessorList]:
    """generate's config and extra logits processors for sampling at τ and top-p: HF's own sampling on torch's shared
    generator, or with `generator` the same distribution (HF's warpers, in HF's order) drawn by seeded_draw, last."""
    from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopPLogitsWarper

    if generator is None:
        config = clean_generation_config(
            model,
            do_sample=True,
            temperature=temperature,
            top_p=top_p,
            top_k=0,
            max_new_tokens=max_new_tokens,
            pad_token_id=pad,
            output_scores=True,
            return_dict_in_generate=True,
        )
        return config, LogitsProcessorList()
    config = clean_generation_config(
        model, do_sample=False, max_new_tokens=max_new_tokens, pad_token_id=pad, return_dict_in_generate=True
    )
    processors = LogitsProcessorList()
    if temperature != 1.0:  # as HF: τ = 1 leaves the logits as they are
        processors.append(TemperatureLogitsWarper(temperature))
    if top_p < 1.0:
        processors.append(TopPLogitsWarper(top_p))
    processors.append(seeded_draw(generator))
    return config, processors


@torch.no_grad()
def sample_with_logprobs(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompt_ids: Sequence[Sequence[int]],
    *,
    temperature: float,
    top_p: float,
    max_new_tokens: int,
    batch_size: int | None = None,
    generator: torch.Generator | None = None,
    synced_gpus: bool | None = None,
) -> Samples:
    """One completion per prompt (repeat prompts for G samples), left-padded batches of `batch_size`. With
    `generator`, the tokens are drawn from it (seeded_draw) instead of torch's shared generator: the same draws
    whatever other threads do (a one-step-off rollout runs beside the training step, rlt.stages.overlap).
    `synced_gpus`: HF's (None: on under ZeRO-3 with more than one rank, each step an all-reduce)."""
    device = next(model.parameters()).device
    pad = tokenizer.pad_token_id
    eos = set(tokenizer.all_special_ids) & {
        tokenizer.eos_token_id,
        *(
            [model.generation_config.eos_token_id]
            if isinstance(model.generation_config.eos_token_id, int)
            else (model.generation_config.eos_token_id or [])
        ),
    }
    out = Samples([list(p) for p in prompt_ids], [], [])
    step = batch_size or len(prompt_ids)
    for start in range(0, len(prompt_ids), step):
        chunk = prompt_ids[start : start + step]
        width = max(len(p) for p in chunk)
        ids = torch.full((len(chunk), width), pad, dtype=torch.long, device=device)
        mask = torch.zeros_like(ids)
        for j, p in enumerate(chunk):
            ids[j, width - len(p) :] = torch.tensor(p, device=device)
            mask[j, width - len(p) :] = 1
        config, processors = sampling_setup(model, pad, temperature, top_p, max_new_tokens, generator)
        with only_generation_config(model, config):
            # return_dict_in_generate: a decoder-only output, not bare ids
            gen = cast(
                "GenerateDecoderOnlyOutput",
                # PreTrainedModel does not declare generate; GenerationMixin (in every causal LM) types its self as
                # a protocol that transformers' own models do not meet under mypy
                model.generate(  # type: ignore[operator]
                    input_ids=ids,
                    attention_mask=mask,
                    generation_config=config,
                    logits_processor=processors,
                    synced_gpus=synced_gpus,
                ),
            )
        new = gen.sequences[:, width:]
        # scores are the processed logits (after temperature/top-p): their log-softmax is the sampling log-prob
        steps = (
            processors[-1].logprobs  # seeded_draw kept them
            if generator is not None
            else [
                torch.log_softmax(s.float(), -1).gather(1, new[:, t : t + 1]).squeeze(1)
                for t, s in enumerate(gen.scores or ())
            ]
        )
        lps = torch.stack(steps, dim=1) if steps else torch.empty(len(chunk), 0)
        for j in range(len(chunk)):
            toks = new[j].tolist()
            end = next((k + 1 for k, t in enumerate(toks) if t in eos), len(toks))
            out.completion_ids.append(toks[:end])
            out.logprobs.append(lps[j, :end].tolist())
    return out


def sample_texts(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    *,
    temperature: float,
    max_new_tokens: int,
    batch_size: int,
) -> list[str]:
    """One decoded completion per rendered prompt (repeat a prompt for several), sampled with the shared sampler
    at top-p 1: what the rcl protocol asks of its student and teacher; greedy at temperature 0 (as evaluate's)."""
    ids = [tokenizer(p, add_special_tokens=False).input_ids for p in prompts]
    if temperature == 0:
        chunks = [ids[i : i + batch_size] for i in range(0, len(ids), batch_size)]
        greedy_ids = [c for chunk in chunks for c in greedy(model, tokenizer, chunk, max_new_tokens)]
        return tokenizer.batch_decode(greedy_ids, skip_special_tokens=True)
    samples = sample_with_logprobs(
        model, tokenizer, ids, temperature=temperature, top_p=1.0, max_new_tokens=max_new_tokens, batch_size=batch_size
    )
    return tokenizer.batch_decode(samples.completion_ids, skip_special_tokens=True)


def greedy(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, prompt_ids: list[list[int]], max_new_tokens: int
) -> list[list[int]]:
    """Greedy answers to left-padded prompts, each cut after its first end-of-text token."""
    device = next(model.parameters()).device
    width = max(len(p) for p in prompt_ids)
    ids = torch.full((len(prompt_ids), width), tokenizer.pad_token_id, dtype=torch.long, device=device)
    mask = torch.zeros_like(ids)
    for j, p in enumerate(prompt_ids):
        ids[j, width - len(p) :] = torch.tensor(p, device=device)
        mask[j, width - len(p) :] = 1
    # greedy on the model's own logits: no repetition penalty or other processor from the checkpoint's config
    config = clean_generation_config(
        model, do_sample=False, max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id
    )
    with torch.no_grad(), only_generation_config(model, config):
        # PreTrainedModel does not declare generate (its causal-LM subclasses mix in GenerationMixin); without
        # return_dict_in_generate it returns the sequences' ids
        generate = cast("Callable[..., torch.Tensor]", model.generate)
        seqs = generate(input_ids=ids, attention_mask=mask, generation_config=config)
    eos = tokenizer.eos_token_id
    out = []
    for row in seqs[:, width:].tolist():
        out.append(row[: row.index(eos) + 1] if eos in row else row)
    return out


# vLLM's finish reasons for a sequence it did not finish: "abort" (a server stopping with --shutdown-timeout 0, a
# cancelled request) and "error" come with the tokens so far, which are not a completion.
UNFINISHED_REASONS = ("abort", "error")
HTTP_RETRIES = 5  # retries after the first attempt
HTTP_BACKOFF = 1.0  # seconds before the first retry, doubled each time: 1, 2, 4, 8, 16 (about 30 s in all)
# Tokens per streamed chunk of a sequence (vLLM's per-request `stream_interval`): the client learns which sequences
# have finished at a 16th of the events (and of the API process's JSON work) that one event per token would cost.
STREAM_INTERVAL = 16


def retrying_session(retries: int | None = None, backoff: float | None = None) -> requests.Session:
    """A requests Session that retries connection errors, 429 and 5xx answers before an answer starts, POST
    included (a generation request has no side effect to repeat). A read error (a read timeout, a connection cut
    mid-stream) is not retried here: server_generate asks again for the unfinished sequences only."""
    import requests
    from requests.adapters import HTTPAdapter
    from urllib3.util.retry import Retry

    retry = Retry(
        total=HTTP_RETRIES if retries is None else retries,
        read=0,
        backoff_factor=HTTP_BACKOFF if backoff is None else backoff,
        status_forcelist=(429, 500, 502, 503, 504),
        allowed_methods=None,  # every method
        raise_on_status=False,  # the last answer comes back, and its status is reported
    )
    session = requests.Session()
    session.mount("http://", HTTPAdapter(max_retries=retry))
    session.mount("https://", HTTPAdapter(max_retries=retry))
    return session


def completion_body(
    model: str,
    prompt_ids: Sequence[Sequence[int]],
    *,
    n: int,
    temperature: float,
    top_p: float,
    max_new_tokens: int,
    seed: int | None = None,
    stream: bool = True,
) -> dict[str, Any]:
    """vLLM's /v1/completions request: token ids in, token ids and the sampled tokens' log-probs out. With `seed`,
    vLLM seeds sample j of every prompt with seed + j (vllm.v1.engine.parallel_sampling), so a sequence asked for
    again alone (n=1, seed + j) is the same sequence."""
    return {
        "model": model,
        "prompt": [list(p) for p in prompt_ids],
        "n": n,
        "temperature": temperature,
        "top_p": top_p,
        "top_k": -1,
        "max_tokens": max_new_tokens,
        "logprobs": 0,
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
        **({"seed": seed} if seed is not None else {}),
        **({"stream": True, "stream_interval": STREAM_INTERVAL} if stream else {}),
        **NEUTRAL_VLLM_SAMPLING,
    }


class Cancelled(Exception):
    """The caller gave up on the request (rlt.method.pipeline: a failure elsewhere); the stream was closed."""


def server_generate(
    base_url: str,
    prompt_ids: Sequence[Sequence[int]],
    *,
    n: int,
    temperature: float,
    top_p: float,
    max_new_tokens: int,
    timeout: float = 600.0,
    seed: int | None = None,
    cancel: threading.Event | None = None,
    model: str | None = None,
) -> Samples:
    """`n` completions per prompt from a vLLM OpenAI-compatible server (token ids in, token ids + logprobs out).

    The answer is streamed: each sequence is complete once vLLM gives its finish_reason ("abort" or "error" are not
    completions). A read timeout (`timeout` seconds without a byte), a connection cut mid-stream or an aborted
    sequence keeps the finished sequences and asks again for the unfinished ones only, one request per sample index j
    (n=1, seed + j: the same sequences when `seed` is set), up to HTTP_RETRIES times with backoff. Before an answer starts, a lost connection, 429 or a 5xx is retried by the
    session (urllib3's Retry: 1, 2, 4, 8, 16 s). Either way, what is left is an error naming the server, the
    attempts and the last answer: a restarting server or one bad answer costs a few seconds, not the stage.
    `model`: the served model's name (served_model); asked of the server when None."""
    session = retrying_session()
    try:
        model = model or served_model(base_url, timeout, session)
        done: dict[tuple[int, int], tuple[list[int], list[float]]] = {}  # (prompt, sample) -> ids, logprobs
        # (prompts, samples per prompt, first sample index): first every prompt's n samples in one request
        todo = [(list(range(len(prompt_ids))), n, 0)]
        cuts = 0
        while todo:
            prompts, k, j0 = todo.pop(0)
            body = completion_body(
                model,
                [prompt_ids[p] for p in prompts],
                n=k,
                temperature=temperature,
                top_p=top_p,
                max_new_tokens=max_new_tokens,
                seed=None if seed is None else seed + j0,
            )
            finished, cut = _stream(session, base_url, body, timeout, cancel)
            for i, seq in finished.items():
                done[(prompts[i // k], j0 + i % k)] = seq
            left = [(p, j0 + s) for p in prompts for s in range(k) if (p, j0 + s) not in done]
            if not left:
                continue
            cuts += 1
            cut = cut or "the stream ended before every sequence finished"
            if cuts > HTTP_RETRIES:
                raise RuntimeError(
                    f"vLLM server {base_url}: {len(prompt_ids) * n - len(done)} of {len(prompt_ids) * n} sequences "
                    f"unfinished after "
                    f"{cuts} cut streams: {cut}"
                )
            time.sleep(HTTP_BACKOFF * 2 ** (cuts - 1))
            for j in sorted({j for _, j in left}):
                todo.append(([p for p, s in left if s == j], 1, j))
    finally:
        session.close()
    out = Samples([], [], [])
    for p in range(len(prompt_ids)):  # prompt-major: n samples per prompt
        for j in range(n):
            ids, lps = done[(p, j)]
            out.prompt_ids.append(list(prompt_ids[p]))
            out.completion_ids.append(ids)
            out.logprobs.append(lps)
    return out


def served_model(base_url: str, timeout: float, session: requests.Session | None = None) -> str:
    """The name the server serves its model under (its /v1/models): asked once by a caller that sends many
    requests (distill: one per sequence)."""
    own = session is None
    session = session or retrying_session()
    try:
        name: str = _call(session, "GET", base_url, "/v1/models", timeout).json()["data"][0]["id"]
        return name
    finally:
        if own:
            session.close()


def _call(
    session: requests.Session, method: str, base_url: str, path: str, timeout: float, **kw: Any
) -> requests.Response:
    import requests

    try:
        resp = session.request(method, f"{base_url}{path}", timeout=timeout, **kw)
    except requests.RequestException as err:  # retries used up on connection errors or timeouts
        raise RuntimeError(
            f"vLLM server {base_url}: no answer to {path} after {HTTP_RETRIES + 1} attempts with backoff: {err}"
        ) from None
    if resp.status_code != 200:
        raise RuntimeError(
            f"vLLM server {base_url} answered {resp.status_code} (after up to {HTTP_RETRIES + 1} attempts) to "
            f"{path}: {resp.text[:300]}"
        )
    return resp


def _stream(
    session: requests.Session, base_url: str, body: dict[str, Any], timeout: float, cancel: threading.Event | None
) -> Streamed:
    """One streamed /v1/completions request: ({choice index: (token ids, logprobs)} of the finished choices, None),
    or with the reason in place of None when the stream was cut (read timeout, connection lost, an error event, a
    sequence the server aborted)."""
    import requests

    ids: dict[int, list[int]] = {}
    lps: dict[int, list[float]] = {}
    finished: dict[int, tuple[list[int], list[float]]] = {}
    aborted: str | None = None
    resp = _call(session, "POST", base_url, "/v1/completions", timeout, json=body, stream=True)
    try:
        # each chunk as it arrives: a stall keeps what came (requests' hints say int, its iter_content takes None)
        for line in resp.iter_lines(chunk_size=None):  # type: ignore[call-overload]
            if cancel is not None and cancel.is_set():
                raise Cancelled(base_url)
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:  # vLLM reports a failure inside a started stream as an event
                return finished, f"error event: {str(event['error'])[:300]}"
            for c in event["choices"]:
                i = c["index"]
                ids.setdefault(i, []).extend(c.get("token_ids") or [])
                lps.setdefault(i, []).extend(
                    float("nan") if x is None else x for x in (c.get("logprobs") or {}).get("token_logprobs", [])
                )
                reason = c.get("finish_reason")
                if reason in UNFINISHED_REASONS:  # cut short by the server: asked for again, never kept
                    aborted = f"the server ended sequence {i} with finish_reason {reason!r} (aborted)"
                elif reason is not None:
                    finished[i] = (ids[i], lps[i])
    except requests.RequestException as err:  # a read timeout or a cut connection, mid-stream
        return finished, str(err)
    finally:
        resp.close()  # vLLM aborts a request whose client went away: an unfinished one frees its KV cache
    return finished, aborted
