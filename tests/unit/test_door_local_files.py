"""Every local file the door opens beside the run file (issue 54, class 1), written from the class: for each field
that names a local file or folder (the teacher's model, a format file, an rcl format, the dataset) and each kind of
entry that is not a usable file (a symlink loop, a device file, a named pipe, a name too long for the filesystem,
a file cut short), `rlt validate` answers with lines that name the field, exit 1, never a traceback — with and
without --no-data. Relative paths are read from the run file's folder, whatever the working directory."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from suite_helpers import EXAMPLES

from rlt.cli import main

FIELDS = {
    # field: (run file example, how to set it, what a good entry is)
    "spec.teacher.model": "rltrun-tiny.yaml",
    "spec.format.file": "rltrun-tiny.yaml",
    "spec.rcl.format": "rltrun-rcl-tiny.yaml",
    "spec.dataset.source": "rltrun-tiny.yaml",
}


def _set(doc: dict, field: str, value: str) -> None:
    spec = doc["spec"]
    if field == "spec.teacher.model":
        spec["teacher"]["model"] = value
    elif field == "spec.format.file":
        spec["format"] = {"file": value}
    elif field == "spec.rcl.format":
        spec.setdefault("rcl", {})["format"] = value
    else:
        spec["dataset"]["source"] = value


def _bad_entry(kind: str, field: str, folder: Path) -> str:
    """A relative name in `folder` that is an entry of `kind`."""
    suffix = "" if field == "spec.teacher.model" else (".jsonl" if field == "spec.dataset.source" else ".yaml")
    name = "bad" + suffix
    if kind == "loop":
        (folder / name).symlink_to(folder / ("other" + suffix))
        (folder / ("other" + suffix)).symlink_to(folder / name)
    elif kind == "device":
        (folder / name).symlink_to("/dev/zero")
    elif kind == "pipe":
        os.mkfifo(folder / name)
    elif kind == "long":
        name = "x" * 300 + suffix
    elif kind == "truncated":
        if field == "spec.teacher.model":
            (folder / name).mkdir()
            (folder / name / "config.json").write_text('{"architectures": ["Qwen2ForCausalLM"], "hidden_si')
        elif field == "spec.dataset.source":
            (folder / name).write_text('{"question": "1+1", "solution": "2"}\n{"question": "2+')
        else:
            (folder / name).write_text("tags:\n  explanationStart: '<e")
    return name


KINDS = ["loop", "device", "pipe", "long", "truncated"]
WORDS = {"loop": "loop", "device": "device", "pipe": "pipe", "long": "too long", "truncated": ""}


@pytest.mark.parametrize("no_data", [True, False], ids=["no-data", "data"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("field", FIELDS)
def test_a_bad_local_entry_is_one_line_naming_its_field(tmp_path, monkeypatch, capsys, field, kind, no_data):
    data_field = field == "spec.dataset.source"
    run_dir = tmp_path / "runs"
    run_dir.mkdir()
    doc = yaml.safe_load((EXAMPLES / FIELDS[field]).read_text())
    _set(doc, field, _bad_entry(kind, field, run_dir))
    run_file = run_dir / "run.yaml"
    run_file.write_text(yaml.safe_dump(doc))
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # relative names are the run file's, not the working directory's
    rc = main(["validate", "--no-plan", *(["--no-data"] if no_data else []), str(run_file)])
    err = capsys.readouterr().err
    if data_field and no_data:  # --no-data checks the spec only: the data's entry is not touched, nor a traceback
        assert rc == 0, err
        return
    assert rc == 1, err
    lines = [line.strip() for line in err.splitlines()[1:] if line.strip()]
    assert lines, err
    # a row cut short is a row's problem: the dataset and the file's line are named
    named = "spec.dataset:" if (field, kind) == ("spec.dataset.source", "truncated") else field + ":"
    assert lines[0].startswith(named), err
    assert WORDS[kind] in lines[0], err  # what the entry is, in words


def _model_dir(folder: Path, **config: object) -> str:
    folder.mkdir()
    base = {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "vocab_size": 256,
        "max_position_embeddings": 512,
    }
    base.update(config)
    (folder / "config.json").write_text(json.dumps({k: v for k, v in base.items() if v is not None}))
    return str(folder)


CONFIGS = {
    "masked LM": {"architectures": ["BertForMaskedLM"], "model_type": "bert"},
    "seq2seq": {"architectures": ["T5ForConditionalGeneration"], "model_type": "t5"},
    "zero heads": {"num_attention_heads": 0},
    "absurd layers": {"num_hidden_layers": 10**9},
    "heads as text": {"num_attention_heads": "two"},
    "negative width": {"hidden_size": -64},
}


@pytest.mark.parametrize("what", CONFIGS)
@pytest.mark.parametrize("field", ["spec.teacher.model", "spec.student.model"])
def test_a_model_config_no_stage_can_load_is_refused_naming_the_field(tmp_path, capsys, field, what):
    """A config.json of a non-causal-LM architecture, or with zero, absurd or mistyped sizes: one line naming the
    field and the config key, whether or not the plan runs (it must not hang on the layer count either)."""
    doc = yaml.safe_load((EXAMPLES / "rltrun-tiny.yaml").read_text())
    role = field.split(".")[1]
    doc["spec"][role]["model"] = _model_dir(tmp_path / "m", **CONFIGS[what])
    run_file = tmp_path / "run.yaml"
    run_file.write_text(yaml.safe_dump(doc))
    rc = main(["validate", "--no-data", str(run_file)])
    err = capsys.readouterr().err
    assert rc == 1, err
    first = err.splitlines()[1].strip()
    assert first.startswith(field + ":"), err


def test_a_gguf_file_given_as_a_model_is_refused_naming_the_field(tmp_path, capsys):
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + bytes(64))
    doc = yaml.safe_load((EXAMPLES / "rltrun-tiny.yaml").read_text())
    doc["spec"]["teacher"]["model"] = str(gguf)
    run_file = tmp_path / "run.yaml"
    run_file.write_text(yaml.safe_dump(doc))
    assert main(["validate", "--no-data", str(run_file)]) == 1
    first = capsys.readouterr().err.splitlines()[1].strip()
    assert first.startswith("spec.teacher.model:") and "GGUF" in first


def test_a_local_tokenizer_without_a_chat_template_is_one_line(tmp_path, capsys):
    """The teacher's prompts are rendered with its chat template: a local tokenizer with none is refused by name."""
    from rlt.data.models import resolve_model_path

    src = Path(resolve_model_path("builtin:tiny-qwen2"))
    model = tmp_path / "model"
    model.mkdir()
    for f in src.iterdir():
        if f.name != "chat_template.jinja":
            (model / f.name).symlink_to(f)
    config = json.loads((src / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (model / "tokenizer_config.json").unlink()
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    doc = yaml.safe_load((EXAMPLES / "rltrun-tiny.yaml").read_text())
    doc["spec"]["teacher"]["model"] = str(model)
    run_file = tmp_path / "run.yaml"
    run_file.write_text(yaml.safe_dump(doc))
    assert main(["validate", "--no-plan", str(run_file)]) == 1
    err = capsys.readouterr().err
    assert "spec.teacher.model:" in err and "chat template" in err, err


BROKEN_TEMPLATES = {
    "drops the final message": "{{ messages[0]['content'] }}",
    "cut short": "{% for m in messages %}{{ m['content'] }",
    "unclosed block": "{% for m in messages %}",
    "raises": "{{ raise_exception('no system turns') }}",
    "divides by zero": "{{ 1 / 0 }}",
}


@pytest.mark.parametrize("template", list(BROKEN_TEMPLATES.values()), ids=list(BROKEN_TEMPLATES))
def test_a_local_chat_template_that_cannot_render_the_prompts_is_one_line(tmp_path, capsys, template):
    """A local tokenizer's chat template that fails on the teacher's prompt (a syntax error, a template that drops
    the message the prompt continues, one that raises) is the teacher field's problem in one line, not a traceback."""
    from rlt.data.models import resolve_model_path

    src = Path(resolve_model_path("builtin:tiny-qwen2"))
    model = tmp_path / "model"
    model.mkdir()
    for f in src.iterdir():
        if f.name != "chat_template.jinja":
            (model / f.name).symlink_to(f)
    (model / "chat_template.jinja").write_text(template)
    doc = yaml.safe_load((EXAMPLES / "rltrun-tiny.yaml").read_text())
    doc["spec"]["teacher"]["model"] = str(model)
    run_file = tmp_path / "run.yaml"
    run_file.write_text(yaml.safe_dump(doc))
    assert main(["validate", "--no-plan", str(run_file)]) == 1
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if x.startswith("  ")]
    assert lines and lines[0].startswith("  spec.teacher.model:") and "chat template" in lines[0], err


@pytest.mark.parametrize("kind", KINDS)
def test_the_pods_check_exits_with_the_data_code_for_a_bad_data_entry(tmp_path, monkeypatch, capsys, kind):
    """The trainer pods' preflight (python -m rlt.checks.validation): a data path that is a loop, a device, a pipe, a
    name too long or a file cut short is unusable data: ExitCode.DATA_ERROR (65), one line naming the field, never a
    traceback and exit 1."""
    from rlt.checks.validation import main as pods_check
    from rlt.contract.exitcodes import ExitCode

    doc = yaml.safe_load((EXAMPLES / "rltrun-tiny.yaml").read_text())
    monkeypatch.chdir(tmp_path)  # the pods read paths as written, from their working directory
    _set(doc, "spec.dataset.source", _bad_entry(kind, "spec.dataset.source", tmp_path))
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(doc))
    assert pods_check([str(tmp_path / "run.yaml")]) == ExitCode.DATA_ERROR
    err = capsys.readouterr().err
    assert err.splitlines()[1].strip().startswith(("spec.dataset.source:", "spec.dataset:")), err


def test_a_format_file_is_read_for_each_run_file_not_once_per_name(tmp_path, monkeypatch, capsys):
    """Two run files in two folders, each naming its own `format.file: fmt.yaml`, checked from their folders in one
    process (the fuzz run's children, a long-lived caller): each is checked against its own format file, and a
    format file changed between two checks is read again."""
    good = yaml.safe_load((Path(__file__).parents[2] / "training/rlt/method/formats/default.yaml").read_text())
    bad = {**good, "tags": {}}
    doc = yaml.safe_load((EXAMPLES / "rltrun-tiny.yaml").read_text())
    doc["spec"]["format"] = {"file": "fmt.yaml"}
    codes = []
    for name, fmt in (("a", good), ("b", bad), ("a", bad)):
        folder = tmp_path / name
        folder.mkdir(exist_ok=True)
        (folder / "fmt.yaml").write_text(yaml.safe_dump(fmt))
        os.utime(folder / "fmt.yaml", ns=(len(codes) * 10**9, len(codes) * 10**9))  # a change the clock cannot hide
        (folder / "run.yaml").write_text(yaml.safe_dump(doc))
        monkeypatch.chdir(folder)
        codes.append(main(["validate", "--no-data", "--no-plan", "run.yaml"]))
    assert codes == [0, 1, 1], capsys.readouterr().err
