"""`rlt run`, `rlt eval`, `rlt compare` and the spec loader at the edges a review found (2026-12-01): each input
below once ended in a Python traceback, or passed here and then failed or was dropped on the cluster; now each is
one line naming the field, the flag or the model, with the exit code the operator acts on."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import yaml
from suite_helpers import EXAMPLES, run_cli, tiny_doc

from rlt.contract.exitcodes import ExitCode
from rlt.spec.loading import SpecError, parse_spec

RCL_LOCAL = EXAMPLES / "rltrun-rcl-local.yaml"


def written(tmp_path: Path, doc: dict, name: str = "run.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def test_a_snake_case_field_is_refused_as_the_cluster_would_with_its_yaml_name(tmp_path, capsys):
    """Python's field names were accepted from YAML (populate_by_name), which the CRD does not know: kubectl would
    refuse the run, or drop the field and run with its default."""
    doc = tiny_doc()
    doc["spec"]["dataset"]["bad_rows"] = "skip"
    code, out = run_cli(capsys, "validate", str(written(tmp_path, doc)))
    assert code == 1
    assert "spec.dataset.bad_rows: unknown field (did you mean badRows?)" in out
    with pytest.raises(SpecError, match=r"spec\.stages\.rl\.num_generations: unknown field"):  # the operator's path
        parse_spec({**tiny_doc()["spec"], "stages": {"rl": {"num_generations": 4}}})
    doc["spec"]["dataset"]["badRows"] = doc["spec"]["dataset"].pop("bad_rows")
    assert run_cli(capsys, "validate", str(written(tmp_path, doc)))[0] == 0


@pytest.mark.parametrize(
    "argv",
    [
        ("run", "--metrics-port", "70000"),
        ("run", "--metrics-port", "-5"),
        ("compare", "--metrics-port", "65536"),
        ("run", "--metrics-port", "9400x"),
    ],
)
def test_a_metrics_port_that_is_no_port_is_a_usage_error(tmp_path, capsys, argv):
    """70000 once failed at the bind, after run.yaml was written; -5 once turned the metrics off in silence."""
    code, out = run_cli(capsys, argv[0], str(written(tmp_path, tiny_doc())), *argv[1:], "--output-dir", str(tmp_path))
    assert code == ExitCode.USAGE
    assert f"argument --metrics-port: '{argv[2]}' is not a port number (1-65535; 0 = any free port, -1 = off)" in out
    assert not (tmp_path / tiny_doc()["metadata"]["name"]).exists()


def test_the_metrics_port_variable_is_held_to_the_same_range(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("RLT_METRICS_PORT", "70000")
    code, out = run_cli(capsys, "run", str(written(tmp_path, tiny_doc())), "--output-dir", str(tmp_path))
    assert code == ExitCode.CONFIG_ERROR
    assert "rlt run: RLT_METRICS_PORT='70000' is not a port number" in out
    assert "Traceback" not in out


def test_compare_on_a_taken_metrics_port_is_one_line(tmp_path, capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, out = run_cli(
            capsys,
            "compare",
            str(written(tmp_path, tiny_doc())),
            "--output-dir",
            str(tmp_path),
            "--metrics-port",
            str(port),
        )
    assert code == ExitCode.CONFIG_ERROR
    assert f"rlt compare: --metrics-port {port}: 127.0.0.1:{port} is already in use" in out


def test_compare_names_what_it_cannot_compare(tmp_path, capsys):
    code, out = run_cli(capsys, "compare", str(RCL_LOCAL), "--output-dir", str(tmp_path))
    assert (code, out.count("\n")) == (ExitCode.CONFIG_ERROR, 2)  # the source line and the field's
    assert "spec.method: 'rcl' cannot be compared" in out
    assert list(tmp_path.iterdir()) == []  # refused before the run's folder (and its lock) is made
    doc = tiny_doc()
    doc["spec"]["stages"]["rl"] = {**doc["spec"]["stages"].get("rl", {}), "enabled": False}
    code, out = run_cli(capsys, "compare", str(written(tmp_path, doc)), "--output-dir", str(tmp_path))
    assert code == ExitCode.CONFIG_ERROR
    assert "spec.stages.rl.enabled: false; rlt compare needs stages sft and rl" in out
    assert "spec.stages.sft.enabled" not in out


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (("--teacher", "builtin:nope"), "--teacher: unknown built-in model 'builtin:nope' (choose from builtin:"),
        (("--teacher", "./no-such-teacher"), "--teacher ./no-such-teacher: no such folder"),
        (
            ("--teacher", "https://huggingface.co/org/m"),
            "--teacher: 'https://huggingface.co/org/m' is a URL; models load from a hub id or a local directory: give the hub id 'org/m'",
        ),
        (("--teacher", "initial", "--label", "../../outside"), "--label '../../outside': a report row and a folder"),
        (("--teacher", "results/no/such/model"), "--teacher results/no/such/model: no such folder"),
        ((), "no finished teacher stage (rl, sft) under "),
    ],
)
def test_eval_refuses_a_teacher_or_label_it_cannot_use_before_any_model_loads(tmp_path, capsys, flags, says):
    """Each once loaded the student, then crashed (an unknown built-in, a missing folder), wrote outside eval/
    (the label is a folder), or evaluated the untrained teacher as if trained (no stage finished under --output-dir)."""
    code, out = run_cli(capsys, "eval", str(RCL_LOCAL), "--output-dir", str(tmp_path), *flags)
    assert code == ExitCode.USAGE
    assert f"rlt eval: {says}" in out
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_a_hub_model_that_cannot_be_loaded_is_one_line_and_a_retry_when_the_hub_may_answer(tmp_path, capsys):
    """Offline (the suite sets HF_HUB_OFFLINE) a hub id not in the cache is what an unreachable hub gives a pod:
    one line naming the model, exit 1 so the trainer is retried; a malformed id fails alike on every retry."""
    doc = tiny_doc()
    doc["spec"]["teacher"] = {"model": "nosuchorg/no-such-teacher"}
    code, out = run_cli(
        capsys,
        "run",
        str(written(tmp_path, doc)),
        "--output-dir",
        str(tmp_path),
        "--metrics-port",
        "-1",
        "--no-progress",
    )
    assert code == ExitCode.FAILED
    assert "rlt run: model 'nosuchorg/no-such-teacher' cannot be loaded: " in out
    assert "Traceback" not in out

    from rlt.data.models import ModelLoadError, load_tokenizer

    with pytest.raises(ModelLoadError, match="model 'org/two words' cannot be loaded: Repo id must") as err:
        load_tokenizer("org/two words")
    assert err.value.definitive


def hub_answer(status: int, kind: str) -> Exception:
    """huggingface_hub's own error for a hub answer `status`, as transformers gets it (wrapped in an OSError)."""
    import httpx2
    from huggingface_hub import errors as hub

    response = httpx2.Response(status, request=httpx2.Request("GET", "https://huggingface.co/api/models/org/m"))
    cause = getattr(hub, kind)(f"{status} from the hub", response=response)
    try:
        raise cause
    except Exception as raised:
        try:
            raise OSError(f"org/m: {kind}") from raised
        except OSError as wrapped:
            return wrapped


@pytest.mark.parametrize(
    ("status", "kind", "definitive"),
    [
        (404, "RepositoryNotFoundError", True),
        (401, "GatedRepoError", True),
        (404, "RevisionNotFoundError", True),
        (401, "HfHubHTTPError", True),  # a token the hub refuses: the same on every retry
        (403, "HfHubHTTPError", True),
        (503, "HfHubHTTPError", False),  # the hub is down: a retry may succeed
        (429, "HfHubHTTPError", False),
    ],
)
def test_a_model_load_error_is_sorted_by_what_the_hub_answered(status, kind, definitive):
    from rlt.data.models import ModelLoadError, _loading

    def load():
        raise hub_answer(status, kind)

    with pytest.raises(ModelLoadError, match=f"model 'org/m' at revision v1 cannot be loaded: org/m: {kind}") as err:
        _loading("org/m", "v1", load)
    assert err.value.definitive is definitive


def test_model_files_transformers_cannot_read_are_a_config_error_and_a_full_disk_passes_through(tmp_path):
    """Real transformers on a folder with a config but no weights (its OSError names no hub error); a full disk
    is the machine's state and keeps its own one-line report (rlt.cli.main)."""
    import errno
    import pickle

    from rlt.data.models import ModelLoadError, _loading, load_model, resolve_model_path
    from rlt.spec.inputs import ModelRef

    folder = tmp_path / "no-weights"
    folder.mkdir()
    (folder / "config.json").write_text((Path(resolve_model_path("builtin:tiny-qwen2")) / "config.json").read_text())
    with pytest.raises(ModelLoadError, match="cannot be loaded: Error no file named model.safetensors") as err:
        load_model(ModelRef(model=str(folder)), device="cpu")
    assert err.value.definitive
    again = pickle.loads(pickle.dumps(err.value))  # a launcher may carry it across processes
    assert (str(again), again.definitive) == (str(err.value), True)

    def full():
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError, match="No space left") as disk:
        _loading("org/m", None, full)
    assert not isinstance(disk.value, ModelLoadError)


def test_a_mapped_trace_column_that_no_row_has_is_named(tmp_path, capsys):
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(f'{{"question": "q{i}", "solution": "s{i}", "reasoning_trace": "t"}}\n' for i in range(8)))
    doc = tiny_doc()
    doc["spec"]["dataset"] = {"source": str(rows), "columns": {"reasoningTrace": "trace"}}
    code, out = run_cli(capsys, "validate", str(written(tmp_path, doc)))
    assert code == 1
    assert "reasoning_trace (column 'trace') is missing (8 of " in out
