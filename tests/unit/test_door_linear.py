"""The door's pattern checks end where the API server's do (no trailing newline slips through Python's `$`), and the
reader's scalar checks run in linear time on long adversarial scalars."""

from __future__ import annotations

import gc
import time

import pytest
from suite_helpers import tiny_doc

from rlt.spec.loading import SpecError, parse_run
from rlt.spec.reader import load_yaml


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


def _seconds_to_read(scalar: str) -> float:
    """CPU seconds of this thread to read `a: <scalar>`: other processes on a busy machine do not count (wall time
    did: a CI run beside a training job measured 12x for a linear 4x), nor does a garbage collection."""
    text = f"a: {scalar}\n"
    gc.disable()
    try:
        t0 = time.thread_time()
        load_yaml(text)
        return time.thread_time() - t0
    finally:
        gc.enable()


@pytest.mark.parametrize("unit", ["1_", "0x1_", "+0_", "9"])
def test_reading_long_plain_scalars_takes_linear_time(unit):
    """A plain scalar of digits and underscores that is almost a YAML 1.1 number: reading 8x as much takes about
    8x as long, far from the 64x of a quadratic check (which took 60 s at 80,000 characters)."""
    n = 50_000  # large enough that the reader's own work, not the clock's granularity, is what is timed
    _seconds_to_read(unit * n + "x")  # warm up
    small = min(_seconds_to_read(unit * n + "x") for _ in range(3))
    large = min(_seconds_to_read(unit * (8 * n) + "x") for _ in range(3))
    assert large < 30.0, f"{large:.2f} s to read one scalar of {len(unit) * 8 * n} characters"  # quadratic: minutes
    ratio = large / max(small, 0.02)
    assert ratio < 24, f"8x the input took {ratio:.1f}x the time (linear: 8x, quadratic: 64x)"
