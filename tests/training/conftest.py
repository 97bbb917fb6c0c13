import pytest

from rlt.prompts import Formatter, resolve_format
from rlt.spec import FormatSpec, ModelRef


@pytest.fixture(scope="session")
def tiny_ref():
    return ModelRef(model="builtin:tiny-qwen2")


@pytest.fixture(scope="session")
def tiny(tiny_ref):
    """(model, tokenizer) of the tiny random Qwen2, built locally."""
    import torch

    from rlt.models import load_model, load_tokenizer

    torch.manual_seed(0)
    return load_model(tiny_ref, "cpu"), load_tokenizer(tiny_ref)


@pytest.fixture(scope="session")
def formatter():
    return Formatter(resolve_format(FormatSpec()))
