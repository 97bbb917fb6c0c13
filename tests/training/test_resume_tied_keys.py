"""Resuming a tied-embedding model: the Trainer's "missing keys … lm_head.weight" warning is a false alarm (the
checkpoint keeps the shared tensor once) and is dropped; a key that is truly missing still warns. The load and the
warning are transformers' own (`Trainer._issue_warnings_after_load` on a real `load_state_dict` result)."""

from __future__ import annotations

import logging

from transformers import Trainer, TrainingArguments

from rlt.data.models import tiny_qwen2
from rlt.stages.record import quiet_trainer


def _resume_warnings(tmp_path, caplog, drop: str, tie: bool = True) -> list[str]:
    model = tiny_qwen2(vocab_size=64, max_positions=64)
    if not tie:  # the same shape with an lm_head of its own
        config = model.config
        config.tie_word_embeddings = False
        model = type(model)(config)
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == tie
    trainer = Trainer(model=model, args=TrainingArguments(str(tmp_path), use_cpu=True, report_to=[]))
    quiet_trainer(trainer)
    state = {k: v for k, v in model.state_dict().items() if k != drop}
    result = model.load_state_dict(state, strict=False)
    assert result.missing_keys == [drop]
    trainer_log = logging.getLogger("transformers.trainer")
    propagate, trainer_log.propagate = trainer_log.propagate, True  # transformers' loggers may not reach caplog
    try:
        with caplog.at_level(logging.WARNING, logger="transformers.trainer"):
            caplog.clear()
            trainer._issue_warnings_after_load(result)
    finally:
        trainer_log.propagate = propagate
    return [r.getMessage() for r in caplog.records if "missing keys" in r.getMessage()]


def test_tied_lm_head_missing_on_resume_is_not_warned(tmp_path, caplog):
    assert _resume_warnings(tmp_path, caplog, "lm_head.weight") == []


def test_a_truly_missing_key_still_warns(tmp_path, caplog):
    warned = _resume_warnings(tmp_path, caplog, "model.norm.weight")
    assert warned and "model.norm.weight" in warned[0]
    # an untied lm_head is a weight of its own: missing, it warns
    warned = _resume_warnings(tmp_path, caplog, "lm_head.weight", tie=False)
    assert warned and "lm_head.weight" in warned[0]
