"""Model shapes for the capacity plan: parameter counts and the sizes that set memory (hidden, layers, KV heads,
vocabulary), read from the model's own config. Parameters are counted on an empty (meta-device) model built from the
config with accelerate's `init_empty_weights`, so every architecture transformers knows is counted exactly, with
nothing loaded. Reading a config never downloads: a local folder, the Hugging Face cache, or the few published
configs of rlt.checks.model_shape.KNOWN_CONFIGS; otherwise the plan says what it could not read."""

from __future__ import annotations

from collections import Counter
from functools import lru_cache
from pathlib import Path
from typing import Any

from rlt.checks.model_config import config_problems, folder_config
from rlt.checks.model_shape import DECODER_TYPES, ModelShape, Shapes, decoder_shape, known_shape
from rlt.spec.inputs import ModelRef
from rlt.spec.local_files import LocalFileError, read_json_object
from rlt.spec.run import RLTRunSpec
from rlt.spec.stages import own_student


def shape_of_config(config: Any, source: str) -> ModelShape:
    """The shape of a transformers config: counts taken on an empty model built from it."""
    import torch
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    with init_empty_weights():
        model = AutoModelForCausalLM.from_config(config)  # type: ignore[no-untyped-call]  # unannotated upstream
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


def local_config(model: str, revision: str | None, field: str, build: bool) -> tuple[dict[str, Any] | None, str, str]:
    """(config.json's fields, where they were read, "") of a built-in, a local folder or a hub id in the Hugging
    Face cache; (None, "", why not) when this machine does not have them. Never downloads; LocalFileError (naming
    `field`) for a local entry that is not a usable model folder."""
    from rlt.data.models import builtin_model_dir, resolve_model_path

    if not model.startswith("builtin:"):
        fields, source = folder_config(model, revision, field)
        return fields, source, ""
    if not build and not builtin_model_dir(model).is_dir():
        return None, "", f"{model}: not built yet (`rlt plan` builds it; the first run does too)"
    try:
        folder = Path(resolve_model_path(model))  # a built-in is made once in the cache (tiny; no download)
    except ValueError as err:
        return None, "", str(err)
    return read_json_object(folder / "config.json", field), f"{folder}/config.json", ""


@lru_cache(maxsize=32)
def _read(model: str, revision: str | None, build: bool, field: str = "") -> tuple[ModelShape | None, str]:
    where = field or model
    try:
        fields, source, why = local_config(model, revision, where, build)
    except LocalFileError as err:
        return None, str(err)
    if fields is None and why:
        return None, why
    if fields is not None:
        problems = config_problems(fields, where, source)
        if problems:
            return None, problems[0]
        if fields.get("model_type") in DECODER_TYPES and "hidden_size" in fields:
            return decoder_shape(fields, source), ""  # written out: no torch (rlt validate answers in a second)
        return _counted(model, revision, source)
    known = known_shape(model)
    if known is not None:
        return known, ""
    return None, (
        f"{model}: its config is not in the Hugging Face cache and not a known shape; fetch it once "
        f"(huggingface-cli download {model} config.json) to plan its memory"
    )


def _counted(model: str, revision: str | None, source: str) -> tuple[ModelShape | None, str]:
    """Any other architecture: counted on an empty model that transformers builds (torch; seconds)."""
    from transformers import AutoConfig

    from rlt.data.models import name_the_accelerator, resolve_model_path

    name_the_accelerator()  # before transformers may import DeepSpeed: no "Setting accelerator" line
    path = resolve_model_path(model)
    try:
        local = Path(path).is_dir()
        config = AutoConfig.from_pretrained(path, revision=None if local else revision, local_files_only=True)
        return shape_of_config(config, source), ""
    except (OSError, ValueError) as err:
        return None, f"{model}: cannot read {source} ({str(err).splitlines()[0]})"


def read_shape(ref: ModelRef | str, build: bool = True) -> tuple[ModelShape | None, str]:
    """(shape, "") or (None, why it could not be read). Never downloads; `build`: make a missing built-in model
    (a local conversion, seconds) rather than say it is not built yet."""
    if isinstance(ref, ModelRef):
        return _read(ref.model, ref.revision, build)
    return _read(ref, None, build)


def run_shapes(spec: RLTRunSpec, build: bool = True) -> tuple[Shapes, list[str]]:
    """The shapes of the run's models (teacher, reward student, the student stage's own model) and, for each that
    could not be read, why (read_shape)."""
    teacher, why_t = read_shape(spec.teacher, build)
    student, why_s = read_shape(spec.student, build)
    own = own_student(spec)
    trained, why_d = read_shape(own, build) if own is not None else (None, "")
    return Shapes(teacher, student, trained), [why for why in (why_t, why_s, why_d) if why]
