"""The door answers in a second (issue 54): `rlt validate` imports only what the file needs. Not timed (CI is a busy
2-core machine; benchmarks/validate_speed.py measures): each test holds a property that makes the door fast — no
torch, transformers, TRL or DeepSpeed imported for the examples — or holds a torch-free stand-in equal to the
library it stands in for (DeepSpeed's ZeRO estimators, AutoTokenizer's chat rendering and token ids)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from suite_helpers import EXAMPLES

HEAVY = ("torch", "transformers", "trl", "deepspeed", "accelerate", "peft", "vllm", "datasets", "pandas")


def _imported_by_validate(*args: str) -> tuple[int, list[str], str]:
    """(exit code, the heavy libraries in sys.modules after `rlt validate ARGS`, stderr) in a fresh interpreter."""
    code = (
        "import json, sys\n"
        "from rlt.cli import main\n"
        f"rc = main(['validate', *{list(args)!r}])\n"
        f"print(json.dumps([rc, sorted({{m.split('.')[0] for m in sys.modules}} & set({list(HEAVY)!r}))]))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=os.environ.copy()
    )
    rc, heavy = json.loads(proc.stdout.strip().splitlines()[-1])
    return rc, heavy, proc.stderr


@pytest.mark.parametrize("example", ["rltrun-tiny.yaml", "rltrun-paper-7b.yaml"])
def test_validate_of_the_examples_imports_no_heavy_library(example):
    """The tiny example (built-in data, token lengths, the plan of a built-in model) and the 7B paper recipe
    (a multi-GPU ZeRO plan of a hub model) are checked without torch, transformers, TRL or DeepSpeed: the shapes
    are written out from config.json, the ZeRO estimates torch-free, the tokenizer read by `tokenizers` (from
    the cache the first check of the model fills)."""
    _imported_by_validate(str(EXAMPLES / example))  # the first check of a model keeps its tokenizer in rlt's cache
    rc, heavy, err = _imported_by_validate(str(EXAMPLES / example))
    assert rc == 0, err
    assert heavy == [], f"rlt validate {example} imported {heavy}"
    assert "Setting accelerator" not in err


def test_a_trainer_args_check_names_the_accelerator_before_deepspeed_speaks(tmp_path):
    """A file with trainerArgs builds TRL's real config (TRL imports DeepSpeed): rlt names the CPU accelerator first,
    so DeepSpeed's "Setting accelerator to CPU" warning never comes before rlt's own lines."""
    import yaml

    doc = yaml.safe_load((EXAMPLES / "rltrun-tiny.yaml").read_text())
    doc["spec"]["stages"]["sft"]["trainerArgs"] = {"adam_epsilon": 1.0e-7}
    run_file = tmp_path / "run.yaml"
    run_file.write_text(yaml.safe_dump(doc))
    rc, heavy, err = _imported_by_validate(str(run_file), "--no-data", "--no-plan")
    assert rc == 0, err
    assert "trl" in heavy  # the check really ran
    assert "Setting accelerator" not in err


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    total=st.integers(1, 10**12),
    largest=st.integers(1, 10**10),
    gpus=st.integers(1, 16),
    nodes=st.integers(1, 64),
)
def test_zero_estimates_are_deepspeeds(total, largest, gpus, nodes):
    """rlt.checks.zero_estimates is DeepSpeed's estimators in rlt's configuration (no offload, no zero.Init), to
    the byte, on any size: the plan needs no DeepSpeed import and still says what DeepSpeed says."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    from rlt.checks.zero_estimates import zero2_states, zero3_states

    largest = min(largest, total)
    assert zero2_states(total, gpus, nodes) == estimate_zero2_model_states_mem_needs(
        total, gpus, nodes, cpu_offload=False
    )
    host, gpu, _ = estimate_zero3_model_states_mem_needs(
        total, largest, gpus, nodes, cpu_offload=False, cpu_offload_params=False, zero_init=False
    )
    assert zero3_states(total, largest, gpus, nodes) == (host, gpu)


# Templates that use what transformers' template environment gives beyond plain jinja2: trimmed blocks, loop
# controls, its tojson, raise_exception, the generation tag, the special tokens, a system default.
TEMPLATES = [
    None,  # the built-in model's own (ChatML)
    "{{ bos_token }}{% for m in messages %}\n  {% if m['role'] == 'system' %}{% continue %}{% endif %}\n"
    "<{{ m['role'] }}>{{ m['content'] | tojson }}</s>\n{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}",
    "{% if messages[0]['role'] != 'system' %}{{ raise_exception('system first') }}{% endif %}"
    "{% for m in messages %}{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] }}{{ eos_token }}"
    "{% endgeneration %}{% else %}[{{ m['role'] | upper }}] {{ m['content'] | trim }}\n{% endif %}{% endfor %}",
]
TEXT = st.text(
    st.characters(codec="utf-8", categories=("L", "N", "P", "S", "Zs", "Cc")), min_size=0, max_size=60
).filter(lambda t: "{" not in t)


@pytest.fixture(scope="module")
def tiny_tokenizers():
    from transformers import AutoTokenizer

    from rlt.data.local_tokenizer import FileTokenizer
    from rlt.data.models import resolve_model_path

    folder = resolve_model_path("builtin:tiny-qwen2")
    from pathlib import Path

    return AutoTokenizer.from_pretrained(folder), FileTokenizer(Path(folder), "spec.teacher.model")


@pytest.mark.parametrize("template", range(len(TEMPLATES)))
@settings(max_examples=60, deadline=None, derandomize=True)
@given(question=TEXT, solution=TEXT, system=TEXT)
def test_file_tokenizer_renders_and_counts_as_autotokenizer(tiny_tokenizers, template, question, solution, system):
    """The door's torch-free tokenizer gives the text and the token ids AutoTokenizer gives, for the teacher's prompt
    (continue_final_message) and a whole chat, on generated text and templates using transformers' extras."""
    from rlt.method.prompts import Formatter, resolve_format
    from rlt.spec.run import RLTRunSpec

    auto, light = tiny_tokenizers
    own = TEMPLATES[template]
    saved = auto.chat_template, light.chat_template
    if own is not None:
        auto.chat_template = light.chat_template = own
    try:
        spec = RLTRunSpec.model_validate(
            {"teacher": {"model": "t"}, "student": {"model": "s"}, "dataset": {"source": "builtin:arithmetic"}}
        )
        fmt = Formatter(resolve_format(spec.format))
        messages = [
            {"role": "system", "content": system},
            {"role": "user", "content": question},
            {"role": "assistant", "content": fmt.teacher_prefix(solution)},
        ]
        for options in ({"continue_final_message": True}, {}, {"add_generation_prompt": False}):
            try:
                expected = auto.apply_chat_template(messages, tokenize=False, **options)
            except Exception as err:  # noqa: BLE001 - then the light one refuses too
                with pytest.raises(type(err)):
                    light.apply_chat_template(messages, **options)
                continue
            assert light.apply_chat_template(messages, **options) == expected
            assert (
                light(expected, add_special_tokens=False).input_ids
                == auto(expected, add_special_tokens=False).input_ids
            )
        assert light.eos_token == auto.eos_token
    finally:
        auto.chat_template, light.chat_template = saved
