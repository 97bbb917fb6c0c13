"""Model shapes for the capacity plan: parameter counts and the sizes that set memory (hidden, layers, KV heads,
vocabulary), read from the model's own config. Parameters are counted on an empty (meta-device) model built from the
config with accelerate's `init_empty_weights`, so every architecture transformers knows is counted exactly, with
nothing loaded. Reading a config never downloads: a local folder, the Hugging Face cache, or the few known configs
below; otherwise the plan says what it could not read."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from rlt.spec.inputs import ModelRef

# The config.json fields that set the size of the models the examples use, as published on the Hugging Face Hub
# (huggingface.co/<id>/blob/main/config.json). Bespoke-Stratos-7B is a fine-tune of Qwen2.5-7B-Instruct: same shape.
_QWEN25_7B = {
    "model_type": "qwen2",
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "vocab_size": 152064,
    "max_position_embeddings": 32768,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
KNOWN_CONFIGS: dict[str, dict[str, Any]] = {
    "Qwen/Qwen2.5-7B-Instruct": _QWEN25_7B,
    "bespokelabs/Bespoke-Stratos-7B": _QWEN25_7B,
    "Qwen/Qwen2.5-0.5B-Instruct": {
        "model_type": "qwen2",
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "vocab_size": 151936,
        "max_position_embeddings": 32768,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
    },
    "Qwen/Qwen2.5-72B-Instruct": {
        "model_type": "qwen2",
        "hidden_size": 8192,
        "intermediate_size": 29568,
        "num_hidden_layers": 80,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "vocab_size": 152064,
        "max_position_embeddings": 32768,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    },
}


@dataclass(frozen=True)
class ModelShape:
    params: int  # every parameter (tied embeddings once)
    largest_param: int  # the largest single tensor (DeepSpeed ZeRO-3's "largest layer": gathered whole)
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    max_positions: int | None
    # (module name suffix, in_features, out_features) -> how many such nn.Linear: what a LoRA adapter attaches to
    linears: dict[tuple[str, int, int], int] = field(default_factory=dict, compare=False)
    modules: frozenset[str] = field(default=frozenset(), compare=False)  # last name part of every module (LoRA)
    tied: int = 0  # parameters under a second name (tied embeddings): saved twice where a save does not dedupe them
    saved_bytes: int = 2  # bytes per parameter of its checkpoint (the config's dtype; 16 bit when it names none)
    source: str = ""

    @property
    def kv_bytes_per_token(self) -> int:
        """KV-cache elements of one token over every layer (keys and values); times the cache dtype's bytes."""
        return 2 * self.layers * self.kv_heads * self.head_dim

    def lora_params(self, r: int, targets: list[str]) -> int:
        """Trainable parameters of a LoRA adapter of rank r on the named linear layers ("all-linear": every linear
        but the output head, as PEFT does): r × (in + out) per adapted layer."""
        every = targets == ["all-linear"]
        return sum(
            count * r * (fan_in + fan_out)
            for (suffix, fan_in, fan_out), count in self.linears.items()
            if (every and suffix != "lm_head") or suffix in targets
        )

    def lora_input_width(self, targets: list[str]) -> int:
        """Summed input width of every adapted linear layer (all layers): what PEFT's LoRA dropout copies per token."""
        every = targets == ["all-linear"]
        return sum(
            count * fan_in
            for (suffix, fan_in, _), count in self.linears.items()
            if (every and suffix != "lm_head") or suffix in targets
        )

    @classmethod
    def from_config(cls, config: Any, source: str) -> ModelShape:
        """Shape of a transformers config: counts taken on an empty model built from it."""
        return _shape_of(config, source)


def _shape_of(config: Any, source: str) -> ModelShape:
    import torch
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    with init_empty_weights():
        model = AutoModelForCausalLM.from_config(config)
    model.tie_weights()  # an empty model is built untied; tied embeddings are one tensor in the real one
    tensors = {id(p): p.numel() for p in model.parameters()}  # a tied tensor once
    every_name = sum(p.numel() for _, p in model.named_parameters(remove_duplicate=False))
    linears: Counter[tuple[str, int, int]] = Counter()
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            linears[(name.rsplit(".", 1)[-1], module.in_features, module.out_features)] += 1
    heads = text.num_attention_heads
    return ModelShape(
        params=sum(tensors.values()),
        largest_param=max(tensors.values()),
        hidden=text.hidden_size,
        layers=text.num_hidden_layers,
        heads=heads,
        kv_heads=getattr(text, "num_key_value_heads", None) or heads,
        head_dim=getattr(text, "head_dim", None) or text.hidden_size // heads,
        intermediate=getattr(text, "intermediate_size", None) or 4 * text.hidden_size,
        vocab=text.vocab_size,
        max_positions=getattr(text, "max_position_embeddings", None),
        linears=dict(linears),
        modules=frozenset(name.rsplit(".", 1)[-1] for name, _ in model.named_modules() if name),
        tied=every_name - sum(tensors.values()),
        saved_bytes=4 if str(getattr(config, "dtype", None)) == "torch.float32" else 2,
        source=source,
    )


@lru_cache(maxsize=32)
def _read(model: str, revision: str | None, build: bool) -> tuple[ModelShape | None, str]:
    from pathlib import Path

    from transformers import AutoConfig

    from rlt.data.models import builtin_model_dir, resolve_model_path

    if model.startswith("builtin:") and not build and not builtin_model_dir(model).is_dir():
        return None, f"{model}: not built yet (`rlt plan` builds it; the first run does too)"
    try:
        path = resolve_model_path(model)  # a built-in is made once in the cache (tiny; no download)
    except ValueError as err:
        return None, str(err)
    if Path(path).is_dir():
        try:
            return _shape_of(AutoConfig.from_pretrained(path), f"{path}/config.json"), ""
        except (OSError, ValueError) as err:
            return None, f"{model}: cannot read {path}/config.json ({err})"
    try:
        config = AutoConfig.from_pretrained(path, revision=revision, local_files_only=True)
        return _shape_of(config, f"{model} config.json (Hugging Face cache)"), ""
    except (OSError, ValueError):
        pass
    if model in KNOWN_CONFIGS:
        fields = dict(KNOWN_CONFIGS[model])
        config = AutoConfig.for_model(fields.pop("model_type"), **fields)
        return _shape_of(config, f"{model} (rlt.checks.shapes.KNOWN_CONFIGS, from its published config.json)"), ""
    return None, (
        f"{model}: its config is not in the Hugging Face cache and not a known shape; fetch it once "
        f"(huggingface-cli download {model} config.json) to plan its memory"
    )


def read_shape(ref: ModelRef | str, build: bool = True) -> tuple[ModelShape | None, str]:
    """(shape, "") or (None, why it could not be read). Never downloads; `build`: make a missing built-in model
    (a local conversion, seconds) rather than say it is not built yet."""
    if isinstance(ref, ModelRef):
        return _read(ref.model, ref.revision, build)
    return _read(ref, None, build)
