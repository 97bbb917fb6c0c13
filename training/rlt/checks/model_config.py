"""A model's config.json read by the door without torch or transformers (the operator's image has neither): where it
is (a local folder, the Hugging Face cache; never a download), what the entry is (a folder, a GGUF file, a loop, a
device) and what makes it unusable for a stage that loads it as a causal LM (its architecture, zero or absurd
sizes), one line each naming the spec field. Built-in models are rlt's own: rlt.checks.shapes reads them."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

from rlt.spec.inputs import ModelRef
from rlt.spec.local_files import LocalFileError, path_words, read_json_object

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


def folder_config(model: str, revision: str | None, field: str) -> tuple[dict[str, Any] | None, str]:
    """(config.json's fields, where they were read) of a local folder or a hub id in the Hugging Face cache, (None,
    "") when this machine does not have it; LocalFileError (naming `field`) for a local entry that is not a usable
    model folder (a GGUF file, a loop, a device, a config.json cut short)."""
    if looks_local(model):
        folder = Path(model).expanduser()
        problem = path_words(folder)
        if problem == "file not found":
            return None, ""  # a path inside the pods, or on another machine: read where it is
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
        if path_words(folder / "config.json") == "file not found":
            raise LocalFileError(f"{field}: {model} has no config.json (a transformers model folder holds one)")
        return read_json_object(folder / "config.json", field), f"{folder}/config.json"
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # the operator's image: nothing cached to read
        return None, ""
    try:
        cached = try_to_load_from_cache(model, "config.json", revision=revision)
    except ValueError:  # not a hub id at all (rlt.checks.validation.source_problems says what it is)
        return None, ""
    if not isinstance(cached, str):
        return None, ""
    return read_json_object(cached, field), f"{model} config.json (Hugging Face cache)"


def config_refusals(ref: ModelRef, field: str) -> list[str]:
    """What the door refuses of a model's local config.json (a local folder, the Hugging Face cache): one line each,
    naming `field`. Nothing for a built-in or a model this machine does not have."""
    if ref.model.startswith("builtin:") or "://" in ref.model:
        return []
    try:
        fields, source = folder_config(ref.model, ref.revision, field)
    except LocalFileError as err:
        return [str(err)]
    return config_problems(fields, field, source) if fields is not None else []
