"""The strict reader's size bounds apply while it reads (bytes before parsing; documents and values as they are
composed), and its time grows linearly with the input on adversarial text of every shape."""

from __future__ import annotations

import contextlib
import gc
import os
import subprocess
import sys
import time
from collections.abc import Callable

import pytest
import yaml

from rlt.spec import reader
from rlt.spec.reader import MAX_BYTES, MAX_DOCUMENTS, MAX_VALUES, InputError, load_yaml

# Text that would be a YAML syntax error if the reader got that far: a bound that trips while reading refuses the
# text before it reaches it; one checked after parsing reports the syntax error (or parses everything first).
_BROKEN_TAIL = "\n]: [\n"


def _refusal(text: str) -> str:
    with pytest.raises(InputError) as err:
        load_yaml(text)
    return str(err.value)


def test_the_byte_bound_is_applied_before_parsing():
    """More than MAX_BYTES of text is refused naming the bound, whatever it holds (here a syntax error at once)."""
    said = _refusal("]" + " " * MAX_BYTES)
    assert f"over {MAX_BYTES} bytes" in said and "MAX_BYTES" in said, said
    load_yaml("a: " + "x" * (MAX_BYTES - 10))  # at the bound: read


def test_the_document_bound_trips_while_reading():
    said = _refusal("---\na: 1\n" * (MAX_DOCUMENTS + 1) + _BROKEN_TAIL)
    assert f"more than {MAX_DOCUMENTS} YAML documents" in said and "MAX_DOCUMENTS" in said, said
    assert len(load_yaml("---\na: 1\n" * MAX_DOCUMENTS)) == MAX_DOCUMENTS


@pytest.mark.parametrize(
    "text",
    [
        "a: [" + "1, " * (MAX_VALUES + 1),  # one flat list, never closed
        ("---\na: [" + "1, " * 250 + "]\n") * (MAX_DOCUMENTS // 2),  # documents within their bound, each small
        "a: &x [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]\nb: [" + "*x, " * (MAX_VALUES // 10),  # aliases expanded
    ],
    ids=["flat-list", "across-documents", "through-aliases"],
)
def test_the_value_bound_trips_while_reading(text):
    said = _refusal(text + _BROKEN_TAIL)
    assert f"more than {MAX_VALUES} values" in said and "MAX_VALUES" in said, said


def _once(read: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    with contextlib.suppress(InputError, yaml.YAMLError):
        read()
    return time.perf_counter() - t0


def _least_seconds(small: Callable[[], object], large: Callable[[], object], rounds: int = 5) -> tuple[float, float]:
    """The least time of each over `rounds` interleaved runs, the collector paused: on a shared machine a slow run is
    its neighbours' doing, and interleaving gives both sizes the same neighbours (a busy spell cannot fall on one
    size's runs only); a collection triggered by the large input's many objects is the collector's cost, not the
    reader's."""
    best_small = best_large = float("inf")
    gc.collect()
    gc.disable()
    try:
        for _ in range(rounds):
            best_small = min(best_small, _once(small))
            best_large = min(best_large, _once(large))
    finally:
        gc.enable()
    return best_small, best_large


# Adversarial text of n units: each shape once read whole (linear: 4x the text, about 4x the time).
SHAPES: dict[str, Callable[[int], str]] = {
    "digits-underscores": lambda n: "a: " + "1_" * n + "x\n",
    "hex-underscores": lambda n: "a: 0x" + "1_" * n + "g\n",
    "long-plain-scalar": lambda n: "a: " + "word " * n + "\n",
    "multi-line-plain-scalar": lambda n: "a: x\n" + "  more words\n" * n,
    "escapes-in-quotes": lambda n: 'a: "' + "\\t\\u00e9" * n + '"\n',
    "many-keys": lambda n: "".join(f"k{i}: {i}\n" for i in range(n)),
    "many-documents": lambda n: ("---\na: [" + "1, " * 40 + "]\n") * n,
    "deep-flow-nesting": lambda n: "a: " + "[" * n + "]" * n,  # refused at MAX_DEPTH
    "deep-block-nesting": lambda n: "a:\n" + "".join(" " * (i % 60 + 1) + "- b:\n" for i in range(n)),
}
SIZES = {"many-keys": 5_000, "many-documents": MAX_DOCUMENTS // 4, "multi-line-plain-scalar": 20_000}
SIZES["deep-block-nesting"] = 10_000


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_reading_time_grows_linearly(shape):
    """4x the input within the bounds takes well under 16x the time (quadratic), measured as a ratio, not seconds:
    linear reads 4-5x; 11 leaves a shared machine room and still fails a quadratic reader."""
    n = SIZES.get(shape, 50_000)
    small, large = SHAPES[shape](n), SHAPES[shape](4 * n)
    assert len(large.encode()) <= MAX_BYTES and len(small) > 10_000
    _once(lambda: load_yaml(small))  # warm up
    t_small, t_large = _least_seconds(lambda: load_yaml(small), lambda: load_yaml(large))
    t_small = max(t_small, 0.01)
    print(f"{shape}: n {t_small:.3f} s, 4n {t_large:.3f} s, ratio {t_large / t_small:.1f}")
    assert t_large / t_small < 11, f"{shape}: 4x the input took {t_large / t_small:.1f}x the time"


@pytest.mark.parametrize(
    ("unit", "name", "bound"),
    [("1, ", "MAX_VALUES", MAX_VALUES // 10), ("---\na: 1\n", "MAX_DOCUMENTS", MAX_DOCUMENTS)],
    ids=["values", "documents"],
)
def test_text_past_a_bound_costs_what_the_bound_costs(unit, name, bound, monkeypatch):
    """Ten times the bound is refused in about the time of the bound itself: the reader stops at it (a reader that
    read on would take ~10x; 5 leaves a shared machine room). The values bound is lowered to a tenth: where the
    reader stops does not depend on the bound's size, and 100,000 values take 5 s a read here (11 reads)."""
    monkeypatch.setattr(reader, name, bound)
    prefix = "a: [" if unit == "1, " else ""
    at_bound = prefix + unit * bound
    ten_times = prefix + unit * (10 * bound)
    assert len(ten_times.encode()) <= MAX_BYTES
    _once(lambda: load_yaml(at_bound))  # warm up
    t_bound, t_ten = _least_seconds(lambda: load_yaml(at_bound), lambda: load_yaml(ten_times))
    t_bound = max(t_bound, 0.01)
    print(f"{unit!r}: bound {t_bound:.3f} s, 10x bound {t_ten:.3f} s")
    assert t_ten / t_bound < 5, f"10x past the bound took {t_ten / t_bound:.1f}x the bound's time"


# ---------------------------------------------------------------------------------------------- files


def test_a_device_file_is_named_and_never_read_forever(tmp_path):
    for device in ("/dev/zero", "/dev/null"):
        with pytest.raises(InputError) as err:
            reader.read_file(device)
        assert "a device file" in str(err.value), err.value
    fifo = tmp_path / "pipe.yaml"
    os.mkfifo(fifo)  # opening a pipe with no writer would block forever
    with pytest.raises(InputError) as err:
        reader.read_file(fifo)
    assert "a named pipe" in str(err.value)
    big = tmp_path / "big.yaml"
    big.write_bytes(b"a: " + b"x" * MAX_BYTES)
    with pytest.raises(InputError) as err:
        reader.read_file(big)
    assert f"over {MAX_BYTES} bytes" in str(err.value)


@pytest.mark.parametrize(
    "path",
    ["/dev/zero", "/dev/null", "/", "/" + "a" * 300 + ".yaml", "/tmp/" + "b" * 300 + "/run.yaml"],
    ids=["dev-zero", "dev-null", "root", "long-name", "long-folder"],
)
def test_rlt_validate_and_run_name_an_unreadable_run_file_in_one_line(path):
    expect = {"/dev/zero": "a device file", "/dev/null": "a device file", "/": "a folder"}.get(path, "too long")
    for command in ("validate", "run"):
        res = subprocess.run(
            [sys.executable, "-m", "rlt.cli", command, path], capture_output=True, text=True, timeout=60
        )
        assert res.returncode != 0 and "Traceback" not in res.stderr, res.stderr[-2000:]
        if command == "validate" and path == "/":  # validate reads a folder's YAML files: this one has none
            assert res.stdout == "/: skipped, a folder with no *.yaml or *.yml file in it\n", res.stdout
            assert res.stderr == "rlt validate: no RLTRun in /\n", res.stderr
            continue
        lines = [line for line in res.stderr.splitlines() if line.strip() and "WARNING" not in line]
        assert lines[0].startswith(f"{path}: ") and len(lines) == 2 and expect in lines[1], res.stderr
