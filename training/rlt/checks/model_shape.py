"""A model's shape and what follows from it alone, without torch, transformers or a file (the operator's image has
none of them): parameters, trainable parameters, bytes per weight, the bytes of a checkpoint; and the shapes of the
published models the examples use, written out from their config.json (KNOWN_CONFIGS). Reading any other model's
config, on an empty model that transformers builds, is rlt.checks.shapes."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rlt.spec.inputs import ModelRef
from rlt.spec.stages import own_student

if TYPE_CHECKING:
    from rlt.spec.run import RLTRunSpec

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
    "Qwen/Qwen2.5-3B-Instruct": {
        "model_type": "qwen2",
        "hidden_size": 2048,
        "intermediate_size": 11008,
        "num_hidden_layers": 36,
        "num_attention_heads": 16,
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

    @property
    def layer_params(self) -> int:
        """Parameters of the decoder layers: all but the embedding, the output head (one tensor when tied) and the
        final norm. What gradient checkpointing recomputes; the head is outside the layers, the embedding a lookup."""
        return max(0, self.params - self.vocab * self.hidden * (1 if self.tied else 2) - self.hidden)

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


# The decoder-only families whose layout decoder_shape writes out: a gated MLP (gate, up, down), RMS norms before
# attention and MLP and at the end, rotary positions; Qwen2 has biases on q, k and v, Llama and Mistral by config.
DECODER_TYPES = ("qwen2", "llama", "mistral")


def known_shape(model: str) -> ModelShape | None:
    """The shape of a model of KNOWN_CONFIGS, without torch or transformers (the operator's image has neither):
    what the operator sizes a run's defaults from (the trainer's grace period). None for any other model. A test
    holds it equal to the count on an empty model (rlt.checks.shapes.shape_of_config) for every entry."""
    fields = KNOWN_CONFIGS.get(model)
    if fields is None or fields["model_type"] not in DECODER_TYPES:
        return None
    return decoder_shape(fields, f"{model} (rlt.checks.model_shape.KNOWN_CONFIGS, from its published config.json)")


def decoder_shape(fields: dict[str, Any], source: str) -> ModelShape:
    """The shape of a Qwen2/Llama/Mistral config.json written out layer by layer (see DECODER_TYPES)."""
    hidden, inter, layers = fields["hidden_size"], fields["intermediate_size"], fields["num_hidden_layers"]
    heads = fields["num_attention_heads"]
    kv_heads = fields.get("num_key_value_heads") or heads
    head_dim = fields.get("head_dim") or hidden // heads
    vocab, tied = fields["vocab_size"], bool(fields.get("tie_word_embeddings", False))
    qkv_bias = fields["model_type"] == "qwen2" or bool(fields.get("attention_bias", False))
    mlp_bias = bool(fields.get("mlp_bias", False))
    q, kv = heads * head_dim, kv_heads * head_dim
    linears = {
        ("q_proj", hidden, q): layers,
        ("k_proj", hidden, kv): layers,
        ("v_proj", hidden, kv): layers,
        ("o_proj", q, hidden): layers,
        ("gate_proj", hidden, inter): layers,
        ("up_proj", hidden, inter): layers,
        ("down_proj", inter, hidden): layers,
        ("lm_head", hidden, vocab): 1,
    }
    attention = hidden * q + hidden * kv * 2 + q * hidden + (q + 2 * kv if qkv_bias else 0)
    mlp = 3 * hidden * inter + (2 * inter + hidden if mlp_bias else 0)
    per_layer = attention + mlp + 2 * hidden  # + the two RMS norms
    embedding = vocab * hidden
    params = embedding * (1 if tied else 2) + layers * per_layer + hidden  # + the final norm
    dtype = fields.get("torch_dtype") or fields.get("dtype")
    return ModelShape(
        params=params,
        largest_param=max(embedding, hidden * inter, q * hidden),
        hidden=hidden,
        layers=layers,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate=inter,
        vocab=vocab,
        max_positions=fields.get("max_position_embeddings"),
        linears=linears,
        modules=frozenset(
            {"model", "embed_tokens", "layers", "self_attn", "mlp", "act_fn", "norm", "rotary_emb", "lm_head"}
            | {"input_layernorm", "post_attention_layernorm"}
            | {suffix for suffix, _, _ in linears}
            | {str(i) for i in range(layers)}
        ),
        tied=embedding if tied else 0,
        saved_bytes=4 if dtype == "float32" else 2,
        source=source,
    )


@dataclass
class Shapes:
    teacher: ModelShape | None
    student: ModelShape | None  # spec.student: the reward's student (rl, distill's scoring)
    trained_student: ModelShape | None = None  # stages.student.model's, when the student stage names its own

    def student_stage(self, spec: RLTRunSpec) -> ModelShape | None:
        """The shape of the model the student stage trains and evaluate tests by default: stages.student.model's
        when set (the paper distils into students larger than the reward's), else spec.student's."""
        return self.trained_student if own_student(spec) is not None else self.student


def dtype_bytes(ref: ModelRef, gpu: bool = True) -> int:
    """Bytes per weight: the ref's dtype; auto = bf16 on a GPU, fp32 on CPU (rlt.data.models.torch_dtype)."""
    if ref.dtype == "auto":
        return 2 if gpu else 4
    return {"bfloat16": 2, "float16": 2, "float32": 4}.get(ref.dtype, 2)


def trainable_params(shape: ModelShape, ref: ModelRef) -> int:
    """Parameters the optimizer updates: a LoRA adapter's, or the whole model's."""
    return shape.lora_params(ref.lora.r, ref.lora.target_modules) if ref.lora else shape.params


def saved_model_bytes(shape: ModelShape, zero: int, world: int, b: int) -> int:
    """The model as the Trainer saves it: under ZeRO 1/2 from DeepSpeed's module state dict, where tied embeddings
    are written under both names (measured: benchmarks/capacity.py), else each tensor once."""
    ds12 = world > 1 and zero in (1, 2)
    return (shape.params + (shape.tied if ds12 else 0)) * b


def pod_checkpoint_bytes(shape: ModelShape, trainable: int, zero: int, world: int, nodes: int, b: int) -> int:
    """The part of one checkpoint the first trainer pod writes (its ranks' optimizer shards, and the whole model,
    which rank 0 writes); the other pods write less. What its local checkpoint volume holds at most: a save waits
    for the previous one's durable copy (rlt.stages.staged_saves), which then frees it."""
    whole = checkpoint_bytes(shape, trainable, zero, world, b)
    if world <= 1 or zero == 0 or nodes <= 1:
        return whole
    optimizer = trainable * 12
    return whole - optimizer + math.ceil(optimizer / nodes)


def checkpoint_bytes(shape: ModelShape, trainable: int, zero: int, world: int, b: int) -> int:
    """One checkpoint on disk: the weights (16-bit gathered model under ZeRO-3, the model otherwise; a LoRA adapter
    alone) plus the optimizer: DeepSpeed's fp32 master weights and two Adam moments (12 bytes per trainable
    parameter, all ranks' shards together; ZeRO 1/2 also write the whole module again in their model states), or
    without DeepSpeed the fp32 model (rlt.stages.trainer.master_fp32) and the Trainer's two fp32 AdamW moments."""
    lora = trainable < shape.params
    ds = world > 1 and zero > 0
    weights = trainable * 4 if lora else saved_model_bytes(shape, zero, world, 4 if not ds else b)
    optimizer = trainable * 12 if ds or lora else trainable * 8
    module_states = saved_model_bytes(shape, zero, world, b) if ds and zero in (1, 2) and not lora else 0
    return weights + optimizer + module_states
