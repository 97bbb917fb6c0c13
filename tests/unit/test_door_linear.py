"""The door's pattern checks end where the API server's do (no trailing newline slips through Python's `$`), and the
reader's scalar checks run in linear time on long adversarial scalars."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from suite_helpers import tiny_doc

from rlt.spec.loading import SpecError, parse_run


def _refused(doc: dict) -> str:
    with pytest.raises(SpecError) as err:
        parse_run(doc, "run.yaml")
    return str(err.value)


@pytest.mark.parametrize(
    ("where", "field"),
    [
        (("metadata", "name"), "metadata.name"),
        (("spec", "images", "trainer"), "spec.images.trainer"),
        (("spec", "outputs", "distillDataset"), "spec.outputs.distillDataset"),
    ],
)
def test_a_trailing_newline_is_refused_as_the_api_server_refuses_it(where, field):
    """Python's `$` matches before a final newline; Go's RE2 (the API server's patterns) does not: 'tiny\\n' is no
    DNS label there, so it must not be one here."""
    doc = tiny_doc()
    ok = {
        "metadata.name": "tiny",
        "spec.images.trainer": "reg.io/trainer:v1",
        "spec.outputs.distillDataset": "s3://bucket/d",
    }
    node = doc
    for key in where[:-1]:
        node = node.setdefault(key, {})
    node[where[-1]] = ok[field]
    parse_run(doc, "run.yaml")  # the value without the newline is valid
    node[where[-1]] = ok[field] + "\n"
    assert field in _refused(doc)


# Runs in a child process so that a quadratic reader fails at the timeout instead of holding the suite for an
# hour. It prints the least of three reads of each size, in the child's own thread CPU seconds (other processes on a
# busy machine do not count; wall time did: a CI run beside a training job measured 12x for a linear 4x), GC off.
_TIMING = """
import gc, json, sys, time
from rlt.spec.reader import load_yaml

def seconds(scalar):
    text = "a: " + scalar + "\\n"
    gc.disable()
    try:
        t0 = time.thread_time()
        load_yaml(text)
        return time.thread_time() - t0
    finally:
        gc.enable()

unit, n = sys.argv[1], int(sys.argv[2])
seconds(unit * n + "x")  # warm up
small = min(seconds(unit * n + "x") for _ in range(3))
large = min(seconds(unit * (8 * n) + "x") for _ in range(3))
print(json.dumps({"small": small, "large": large}))
"""
TIMEOUT_S = 120  # a linear read of both sizes takes seconds; a quadratic one took 60 s at 80,000 characters


@pytest.mark.parametrize("unit", ["1_", "0x1_", "+0_", "9"])
def test_reading_long_plain_scalars_takes_linear_time(unit):
    """A plain scalar of digits and underscores that is almost a YAML 1.1 number: reading 8x as much takes about
    8x as long, far from the 64x of a quadratic check."""
    n = 50_000  # large enough that the reader's own work, not the clock's granularity, is what is timed
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    try:
        done = subprocess.run(
            [sys.executable, "-c", _TIMING, unit, str(n)],
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            env=env,
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"reading scalars of {len(unit) * n} and {len(unit) * 8 * n} characters took over {TIMEOUT_S} s")
    assert done.returncode == 0, done.stderr
    times = json.loads(done.stdout)
    ratio = times["large"] / max(times["small"], 0.02)
    assert ratio < 24, f"8x the input took {ratio:.1f}x the time (linear: 8x, quadratic: 64x): {times}"
