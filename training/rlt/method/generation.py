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

from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch


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


def clean_generation_config(model, **settings):
    """A GenerationConfig with the model's special-token ids and `settings`, nothing else from the checkpoint."""
    from transformers import GenerationConfig

    own = model.generation_config
    ids = {k: getattr(own, k, None) for k in ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id")}
    return GenerationConfig(**{**{k: v for k, v in ids.items() if v is not None}, **settings})


@contextmanager
def only_generation_config(model, config):
    """`generate` fills every unset field from `model.generation_config`: swap in `config` while sampling."""
    saved = model.generation_config
    model.generation_config = config
    try:
        yield config
    finally:
        model.generation_config = saved


@torch.no_grad()
def sample_with_logprobs(
    model,
    tokenizer,
    prompt_ids: Sequence[Sequence[int]],
    *,
    temperature: float,
    top_p: float,
    max_new_tokens: int,
    batch_size: int | None = None,
) -> Samples:
    """One completion per prompt (repeat prompts for G samples), left-padded batches of `batch_size`."""
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
        with only_generation_config(model, config):
            gen = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
        new = gen.sequences[:, width:]
        # scores are the processed logits (after temperature/top-p): their log-softmax is the sampling log-prob
        lps = (
            torch.stack(
                [
                    torch.log_softmax(s.float(), dim=-1).gather(1, new[:, t : t + 1]).squeeze(1)
                    for t, s in enumerate(gen.scores)
                ],
                dim=1,
            )
            if gen.scores
            else torch.empty(len(chunk), 0)
        )
        for j in range(len(chunk)):
            toks = new[j].tolist()
            end = next((k + 1 for k, t in enumerate(toks) if t in eos), len(toks))
            out.completion_ids.append(toks[:end])
            out.logprobs.append(lps[j, :end].tolist())
    return out


def sample_texts(
    model, tokenizer, prompts: Sequence[str], *, temperature: float, max_new_tokens: int, batch_size: int
) -> list[str]:
    """One decoded completion per rendered prompt (repeat a prompt for several), sampled with the shared sampler
    at top-p 1: what the rcl protocol asks of its student and teacher."""
    ids = [tokenizer(p, add_special_tokens=False).input_ids for p in prompts]
    samples = sample_with_logprobs(
        model, tokenizer, ids, temperature=temperature, top_p=1.0, max_new_tokens=max_new_tokens, batch_size=batch_size
    )
    return tokenizer.batch_decode(samples.completion_ids, skip_special_tokens=True)


HTTP_RETRIES = 5  # retries after the first attempt
HTTP_BACKOFF = 1.0  # seconds before the first retry, doubled each time: 1, 2, 4, 8, 16 (about 30 s in all)


def retrying_session(retries: int | None = None, backoff: float | None = None):
    """A requests Session that retries connection errors, timeouts, 429 and 5xx answers, POST included (a
    generation request has no side effect to repeat)."""
    import requests
    from requests.adapters import HTTPAdapter
    from urllib3.util.retry import Retry

    retry = Retry(
        total=HTTP_RETRIES if retries is None else retries,
        # A read error (a read timeout) comes after the request was sent: the server was generating, and vLLM
        # cancels a request whose client went away, so a retry would start the whole batch again.
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


def server_generate(
    base_url: str,
    prompt_ids: Sequence[Sequence[int]],
    *,
    n: int,
    temperature: float,
    top_p: float,
    max_new_tokens: int,
    timeout: float = 600.0,
) -> Samples:
    """`n` completions per prompt from a vLLM OpenAI-compatible server (token ids in, token ids + logprobs out).

    A lost connection, a timeout, 429 or a 5xx is retried with exponential backoff (urllib3's Retry: 1, 2, 4, 8,
    16 s) before it is an error naming the server, the attempts and the last answer: a restarting server or one
    bad answer costs a few seconds, not the stage."""
    import requests

    session = retrying_session()

    def call(method: str, path: str, **kw):
        try:
            return session.request(method, f"{base_url}{path}", timeout=timeout, **kw)
        except requests.RequestException as err:  # retries used up on connection errors or timeouts
            raise RuntimeError(
                f"vLLM server {base_url}: no answer to {path} after {HTTP_RETRIES + 1} attempts with backoff: {err}"
            ) from None

    models = call("GET", "/v1/models").json()
    body = {
        "model": models["data"][0]["id"],
        "prompt": [list(p) for p in prompt_ids],
        "n": n,
        "temperature": temperature,
        "top_p": top_p,
        "top_k": -1,
        "max_tokens": max_new_tokens,
        "logprobs": 0,
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
        **NEUTRAL_VLLM_SAMPLING,
    }
    resp = call("POST", "/v1/completions", json=body)
    if resp.status_code != 200:
        raise RuntimeError(
            f"vLLM server {base_url} answered {resp.status_code} (after up to {HTTP_RETRIES + 1} attempts): "
            f"{resp.text[:300]}"
        )
    choices = resp.json()["choices"]  # prompt-major: n choices per prompt
    out = Samples([], [], [])
    for k, choice in enumerate(choices):
        out.prompt_ids.append(list(prompt_ids[k // n]))
        out.completion_ids.append(choice["token_ids"])
        out.logprobs.append([float("nan") if x is None else x for x in choice["logprobs"]["token_logprobs"]])
    return out
