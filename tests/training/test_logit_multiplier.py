"""The scorer calls a model's output head itself (to keep only the positions it scores), so whatever a model's
forward does to the logits after the head must be done here too: Granite's models divide them by `logits_scaling`,
Cohere's multiply them by `logit_scale`. Tiny models of both, built here with random weights, score their own
next tokens: the scorer's log-probs at τ must be the model's forward's `log_softmax(logits / τ)`."""

import pytest
import torch

from rlt.method.scoring import SpanScorer


def tiny_model(kind: str, vocab: int):
    from transformers import CohereConfig, CohereForCausalLM, GraniteConfig, GraniteForCausalLM

    shape = dict(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    torch.manual_seed(0)
    if kind == "granite":
        return GraniteForCausalLM(GraniteConfig(**shape, logits_scaling=8.0)).eval()
    return CohereForCausalLM(CohereConfig(**shape, logit_scale=0.0625)).eval()


@pytest.mark.parametrize("kind", ["granite", "cohere"])
@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_the_scorer_applies_the_models_own_logit_multiplier(kind, temperature, tiny):
    _, tok = tiny
    model = tiny_model(kind, len(tok))
    scorer = SpanScorer(model, tok, temperature)
    ids = torch.tensor([tok("What is 12 + 30? Add the tens, then the ones: 42.").input_ids])
    with torch.no_grad():
        hidden = scorer.backbone(ids).last_hidden_state[0, :-1]
        ours = scorer._head_logprobs(hidden, ids[0, 1:])
        logits = model(ids).logits[0, :-1].float()
    want = torch.log_softmax(logits / temperature, dim=-1).gather(1, ids[0, 1:, None]).squeeze(1)
    assert scorer.logit_multiplier != 1.0
    torch.testing.assert_close(ours, want, rtol=0, atol=1e-5)
