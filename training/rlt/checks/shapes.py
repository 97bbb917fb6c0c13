"""Model shapes for the capacity plan: parameter counts and the sizes that set memory (hidden, layers, KV heads,
vocabulary), read from the model's own config. Parameters are counted on an empty (meta-device) model built from the
config with accelerate's `init_empty_weights`, so every architecture transformers knows is counted exactly, with
nothing loaded. Reading a config never downloads: a local folder, the Hugging Face cache, or the few published
configs of rlt.checks.model_shape.KNOWN_CONFIGS; otherwise the plan says what it could not read."""

from __future__ import annotations

import errno
import os
from collections import Counter
from functools import lru_cache
from pathlib import Path
from typing import Any

from rlt.checks.model_shape import DECODER_TYPES, ModelShape, decoder_shape, known_shape
from rlt.spec.inputs import ModelRef
from rlt.spec.local_files import LocalFileError, path_words, read_json_object


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


# Sizes no causal LM has: a config beyond them is a typo or a hostile file, and planning it would take forever.
MAX_LAYERS = 4096
MAX_WIDTH = 1 << 20  # hidden, intermediate, heads × head_dim
MAX_VOCAB = 1 << 24
CAUSAL_LM_SUFFIXES = ("ForCausalLM", "LMHeadModel")  # transformers' AutoModelForCausalLM classes end so
GGUF_MAGIC = b"GGUF"


def looks_local(model: str) -> bool:
    """A model named by a path on this machine, as transformers' from_pretrained decides it (an existing entry),
    also when the entry is a dangling link, a loop or a name too long to look up (those are refused, not sent to
    the hub)."""
    if model.startswith(("/", "./", "../", "~")):
        return True
    try:
        os.lstat(model)
    except OSError as err:
        return err.errno not in (errno.ENOENT, errno.ENOTDIR)
    return True


def local_config(model: str, revision: str | None, field: str, build: bool) -> tuple[dict[str, Any] | None, str, str]:
    """(config.json's fields, where they were read, "") of a built-in, a local folder or a hub id in the Hugging
    Face cache; (None, "", why not) when this machine does not have them. Never downloads; LocalFileError (naming
    `field`) for a local entry that is not a usable model folder."""
    from rlt.data.models import builtin_model_dir, resolve_model_path

    if model.startswith("builtin:"):
        if not build and not builtin_model_dir(model).is_dir():
            return None, "", f"{model}: not built yet (`rlt plan` builds it; the first run does too)"
        try:
            folder = Path(resolve_model_path(model))  # a built-in is made once in the cache (tiny; no download)
        except ValueError as err:
            return None, "", str(err)
    elif looks_local(model):
        folder = Path(model).expanduser()
        problem = path_words(folder)
        if problem == "file not found":
            return None, "", ""  # a path inside the pods, or on another machine: read where it is
        if problem is not None:
            raise LocalFileError(f"{field}: {model}: {problem}")
        if not folder.is_dir():
            with folder.open("rb") as f:
                magic = f.read(4)
            if magic == GGUF_MAGIC:
                raise LocalFileError(
                    f"{field}: {model} is a GGUF file; the stages load a transformers model folder (config.json and "
                    "safetensors weights): convert it first (transformers' from_pretrained(folder, gguf_file=...) "
                    "then save_pretrained)"
                )
            raise LocalFileError(f"{field}: {model} is a file; a local model is a folder holding config.json")
        if not (folder / "config.json").exists() and path_words(folder / "config.json") == "file not found":
            raise LocalFileError(f"{field}: {model} has no config.json (a transformers model folder holds one)")
    else:
        from huggingface_hub import try_to_load_from_cache

        try:
            cached = try_to_load_from_cache(model, "config.json", revision=revision)
        except ValueError:  # not a hub id at all (source_problems says what it is)
            return None, "", ""
        if not isinstance(cached, str):
            return None, "", ""
        return read_json_object(cached, field), f"{model} config.json (Hugging Face cache)", ""
    return read_json_object(folder / "config.json", field), f"{folder}/config.json", ""


def _positive_int(fields: dict[str, Any], key: str, field: str, source: str, top: int) -> str | None:
    value = fields.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= top:
        return f"{field}: {source}: {key} is {value!r}; a causal LM has a whole number from 1 to {top}"
    return None


def config_problems(fields: dict[str, Any], field: str, source: str) -> list[str]:
    """What makes a config.json unusable for a model a stage loads as a causal LM, one line each: its architecture
    (a masked LM or a seq2seq model cannot generate explanations), zero or absurd sizes."""
    inner = fields.get("text_config")
    text: dict[str, Any] = inner if isinstance(inner, dict) else fields
    out: list[str] = []
    arch = fields.get("architectures")
    if isinstance(arch, list) and arch and not any(str(a).endswith(CAUSAL_LM_SUFFIXES) for a in arch):
        out.append(
            f"{field}: {source}: architectures {', '.join(map(str, arch))} is not a causal language model "
            "(transformers' AutoModelForCausalLM loads *ForCausalLM / *LMHeadModel); the stages generate and score "
            "text with one"
        )
    for key, top in (
        ("num_hidden_layers", MAX_LAYERS),
        ("num_attention_heads", MAX_WIDTH),
        ("num_key_value_heads", MAX_WIDTH),
        ("hidden_size", MAX_WIDTH),
        ("intermediate_size", MAX_WIDTH * 8),
        ("head_dim", MAX_WIDTH),
        ("vocab_size", MAX_VOCAB),
    ):
        problem = _positive_int(text, key, field, source, top)
        if problem:
            out.append(problem)
    return out


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


def config_refusals(ref: ModelRef, field: str) -> list[str]:
    """What the door refuses of a model's local config.json (a built-in already built, a local folder, the Hugging
    Face cache): one line each, naming `field`. Nothing for a model this machine does not have."""
    try:
        fields, source, _ = local_config(ref.model, ref.revision, field, build=False)
    except LocalFileError as err:
        return [str(err)]
    return config_problems(fields, field, source) if fields is not None else []
