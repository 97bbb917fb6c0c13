"""The door's pattern checks end where the API server's do (no trailing newline slips through Python's `$`), and the
reader's scalar checks run in linear time on long adversarial scalars."""

from __future__ import annotations

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
    text = f"a: {scalar}\n"
    t0 = time.perf_counter()
    load_yaml(text)
    return time.perf_counter() - t0


@pytest.mark.parametrize("unit", ["1_", "0x1_", "+0_", "9"])
def test_reading_long_plain_scalars_takes_linear_time(unit):
    """A plain scalar of digits and underscores that is almost a YAML 1.1 number: reading 4x as much takes about
    4x as long (the quadratic check took 16x: 60 s at 80,000 characters)."""
    n = 50_000  # large enough that the reader's own work, not the noise of a busy machine, is what is timed
    _seconds_to_read(unit * n + "x")  # warm up
    small = min(_seconds_to_read(unit * n + "x") for _ in range(3))
    large = min(_seconds_to_read(unit * (4 * n) + "x") for _ in range(3))
    assert large < 30.0, f"{large:.2f} s to read one scalar of {len(unit) * 4 * n} characters"  # quadratic: minutes
    assert large / max(small, 0.02) < 10, f"4x the input took {large / small:.1f}x the time (quadratic: 16x)"
