"""`rlt validate` and `rlt run` given a file that is not YAML text: one clear error naming the file, no traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest

FILES = {
    "latin1.yaml": "apiVersion: rlt.dev/v1alpha1\nkind: RLTRun\nmetadata: {name: caf\xe9}\n".encode("latin-1"),
    "model.bin": bytes(range(256)) * 4,
    "picture.png": b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(64),
    "nul.yaml": b"apiVersion: rlt.dev/v1alpha1\x00\x00kind: RLTRun\n",
}


@pytest.mark.parametrize(
    "command,name",
    [("validate", "latin1.yaml"), ("run", "model.bin"), ("validate", "picture.png"), ("run", "nul.yaml")],
)
def test_a_binary_or_non_utf8_file_is_named_in_one_clear_error(tmp_path, command, name):
    path = tmp_path / name
    path.write_bytes(FILES[name])
    res = subprocess.run(
        [sys.executable, "-m", "rlt.cli", command, str(path)], capture_output=True, text=True, timeout=120
    )
    from rlt.run.exitcodes import ExitCode

    # validate: 1 = some file invalid; run: the spec is unusable, a configuration error (fails fast in a pod)
    assert res.returncode == (1 if command == "validate" else ExitCode.CONFIG_ERROR)
    assert "Traceback" not in res.stderr
    lines = [line for line in res.stderr.splitlines() if line.strip() and "WARNING" not in line]
    assert lines[0].startswith(f"{path}: ") and len(lines) == 2, res.stderr
    assert ("not a UTF-8 text file" in lines[1]) or ("<yaml>: unacceptable character" in lines[1]), res.stderr
