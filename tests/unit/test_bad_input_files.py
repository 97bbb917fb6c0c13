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
    from rlt.contract.exitcodes import ExitCode

    # validate: 1 = some file invalid; run: the spec is unusable, a configuration error (fails fast in a pod)
    assert res.returncode == (1 if command == "validate" else ExitCode.CONFIG_ERROR)
    assert "Traceback" not in res.stderr
    lines = [line for line in res.stderr.splitlines() if line.strip() and "WARNING" not in line]
    assert lines[0].startswith(f"{path}: ") and len(lines) == 2, res.stderr
    assert ("not a UTF-8 text file" in lines[1]) or ("<yaml>: unacceptable character" in lines[1]), res.stderr


# ---------------------------------------------------------------------------------------------- data files
# A decode or read error anywhere in a data file is one line naming the file and the line (JSONL, CSV), the byte
# offset, or the Parquet row group; in JSONL it is that row's problem, so badRows: skip drops it like any bad row.

GOOD = b'{"question": "1+1?", "solution": "2"}\n'


def _parquet(path, corrupt_group: int | None = None) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"question": [f"q{i}?" * 20 for i in range(200)], "solution": [str(i) for i in range(200)]})
    pq.write_table(table, path, row_group_size=100)
    if corrupt_group is not None:  # overwrite the page header of the group's first column
        col = pq.ParquetFile(path).metadata.row_group(corrupt_group).column(0)
        start = col.dictionary_page_offset or col.data_page_offset
        data = bytearray(path.read_bytes())
        data[start : start + 16] = b"\xff" * 16
        path.write_bytes(bytes(data))


DATA = {
    # name: (file contents, badRows, exit code, what the one line says)
    "utf8-mid.jsonl": (
        GOOD + b'{"question": "caf\xe9?", "solution": "3"}\n' + GOOD,
        "reject",
        1,
        "line 2: not UTF-8 text (byte 0xe9 at column 18, byte offset 55)",
    ),
    "utf8-mid-skip.jsonl": (
        GOOD + b'{"question": "caf\xe9?", "solution": "3"}\n' + GOOD,
        "skip",
        0,
        "badRows: skip drops 1 of 3 (first: {path} line 2: not UTF-8 text",
    ),
    "nul-mid.jsonl": (GOOD * 2 + b'{"question": "a\x00b", "solution": "1"}\n', "reject", 1, "line 3: not valid JSON"),
    "crlf-bom.jsonl": (b"\xef\xbb\xbf" + GOOD.replace(b"\n", b"\r\n") * 3, "reject", 0, "3 usable rows"),
    # U+2028 inside a string is one JSONL line, not two: the bad row after it is on line 3
    "u2028.jsonl": (
        GOOD + '{"question": "a\u2028b?", "solution": "1"}\n'.encode() + b'{"question": ""}\n',
        "reject",
        1,
        "line 3: ",
    ),
    "array-utf8.json": (
        b'[{"question": "q\xff", "solution": "1"}]',
        "reject",
        1,
        "not UTF-8 text (byte 0xff at byte offset 16)",
    ),
    "ragged.csv": (
        b'question,solution\n"1+1?",2\n"x",3,extra\n',
        "reject",
        1,
        "cannot be read as .csv (Error tokenizing data. C error: Expected 2 fields in line 3, saw 3)",
    ),
    "utf8.csv": (
        b'question,solution\n"1+1?",2\n"caf\xe9?",3\n',
        "reject",
        1,
        "cannot be read as .csv (line 3: not UTF-8 text (byte 0xe9 at column 5, byte offset 31))",
    ),
    "bad-group.parquet": (1, "reject", 1, "cannot be read as .parquet (row group 1 of 2: "),
    "not.parquet": (b"PAR1 but not really", "reject", 1, "cannot be read as .parquet (not a Parquet file: "),
}


@pytest.mark.parametrize("name", sorted(DATA))
def test_a_broken_data_file_is_one_line_naming_the_file_and_where(tmp_path, name):
    from suite_helpers import tiny_doc

    content, policy, code, says = DATA[name]
    data = tmp_path / name.replace("-skip", "")
    if name.endswith(".parquet") and isinstance(content, int):
        _parquet(data, corrupt_group=content)
    else:
        data.write_bytes(content)
    doc = tiny_doc()
    doc["spec"]["dataset"] = {"source": str(data), "badRows": policy}
    doc["spec"]["stages"]["sft"]["enabled"] = False  # the rows have no reasoning traces, which sft needs
    spec = tmp_path / "run.yaml"
    import yaml

    spec.write_text(yaml.safe_dump(doc))
    res = subprocess.run(
        [sys.executable, "-m", "rlt.cli", "validate", str(spec)], capture_output=True, text=True, timeout=120
    )
    assert res.returncode == code, res.stdout + res.stderr
    assert "Traceback" not in res.stderr and says.format(path=data) in (res.stdout + res.stderr), (
        res.stdout + res.stderr
    )
    if code:
        assert res.stderr.splitlines() == [f"{spec}: INVALID", res.stderr.splitlines()[1]], res.stderr
        assert res.stderr.splitlines()[1].startswith(f"  spec.dataset: {data}")


def test_the_runs_own_jsonl_files_name_the_line_of_a_bad_byte(tmp_path):
    from rlt.data.dataset import DataError
    from rlt.data.jsonl import read_jsonl

    path = tmp_path / "dataset.jsonl"
    path.write_bytes(GOOD * 4 + b'{"question": "\xc3("}\n')
    with pytest.raises(DataError, match=r"dataset.jsonl line 5: not UTF-8 text \(byte 0xc3 at column 15"):
        read_jsonl(path)
