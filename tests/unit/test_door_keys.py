"""Mapping keys that kubectl collapses into one (issue 54, class 3), written from the class: kubectl reads YAML 1.1
and sends each key as JSON text, so two spellings of one number (`0x1` and `1`, `1.0` and `1`, `+1`, `1e0`) or of
one boolean (`true`, `True`, `TRUE`) arrive as one key, the last kept without a word. The door refuses such a
mapping in one line naming the field and both keys; quoted keys (text to both readers) are kept apart and accepted.
Where kubectl is installed, rlt's reading of plain keys is compared with what kubectl sends."""

from __future__ import annotations

import json
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from suite_helpers import TINY, find_tool

from rlt.spec.kubectl_keys import kubectl_key
from rlt.spec.loading import SpecError, read_runs


def _spellings(n: int) -> list[str]:
    """Plain spellings of the integer 0 <= n < 10**6 that kubectl sends as n's decimal text (a float key goes
    through Go's float32 formatting, exact and without an exponent below 10**6; binary `0b` is refused apart, as a
    number YAML 1.1 and 1.2 read differently)."""
    return [str(n), f"+{n}", hex(n), f"0o{n:o}", f"{n}.0", f"{n}e0", f"{n}.00"]


BOOLS = [["true", "True", "TRUE"], ["false", "False", "FALSE"]]


def _run_file(tmp_path, keys: list[str], field: str = "nodeSelector") -> str:
    text = TINY.read_text().rstrip("\n") + f"\n  scheduling:\n    {field}:\n"
    text += "".join(f"      {k}: v{i}\n" for i, k in enumerate(keys))
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return str(path)


def _refusal(path: str) -> list[str]:
    try:
        read_runs(path)
    except SpecError as err:
        return err.problems
    return []


@settings(max_examples=60, deadline=None, derandomize=True)
@given(data=st.data())
def test_two_spellings_of_one_key_to_kubectl_are_refused_naming_the_field_and_both(tmp_path_factory, data):
    group = data.draw(st.one_of(st.integers(0, 999_999).map(_spellings), st.sampled_from(BOOLS)))
    a, b = data.draw(st.lists(st.sampled_from(group), min_size=2, max_size=2, unique=True))
    problems = _refusal(_run_file(tmp_path_factory.mktemp("k"), ["kubernetes.io/arch", a, b]))
    assert len(problems) == 1, problems
    line = problems[0]
    assert line.startswith("spec.scheduling.nodeSelector:"), line
    assert f"{a!r}" in line and f"{b!r}" in line and "one key to kubectl" in line, line


@pytest.mark.parametrize("keys", [["'0x1'", "'1'"], ["'1.0'", "'1'"], ["'True'", "'true'"], ["'null'", "zone"]])
def test_quoted_keys_stay_apart_and_are_accepted(tmp_path, keys):
    """Quoted keys are text to kubectl and to rlt alike: no collapse, nothing to refuse."""
    assert _refusal(_run_file(tmp_path, keys)) == []


@pytest.mark.parametrize(("key", "sent"), [("0x1", "1"), ("1.0", "1"), ("TRUE", "true"), ("1e2", "100")])
def test_a_single_plain_key_kubectl_sends_otherwise_is_refused_with_its_reading(tmp_path, key, sent):
    (line,) = _refusal(_run_file(tmp_path, [key]))
    assert line.startswith("spec.scheduling.nodeSelector:") and f"{key!r}" in line and f"{sent!r}" in line, line


def test_a_null_key_is_refused_as_kubectl_refuses_it(tmp_path):
    (line,) = _refusal(_run_file(tmp_path, ["~"]))
    assert line.startswith("spec.scheduling.nodeSelector:") and "null key" in line, line


KEYS = [
    *[
        "0",
        "1",
        "15",
        "0x1",
        "0X1F",
        "0o17",
        "0b11",
        "+1",
        "-1",
        "-0",
        "007",
        "08",
        "1.0",
        "1.50",
        ".5",
        "0.5",
        "-0.0",
        "1e2",
        "1E2",
        "1e+6",
        "1e-5",
        "1e21",
        "1.00000001",
    ],
    *[
        "1.0000001",
        "123456",
        "1234567",
        "3.4e38",
        "3.5e38",
        "0.0001",
        ".inf",
        "-.Inf",
        ".NaN",
        "true",
        "True",
        "TRUE",
        "false",
        "FALSE",
        "Yes",
        "off",
    ],
    *["2001-12-14", "1:20", "abc", "1a", "0x", "0b2", ".e1", "+.5", "12345678901234567"],
]


@pytest.mark.skipif(find_tool("kubectl") is None, reason="kubectl is not installed (make tools)")
def test_rlt_reads_each_plain_key_as_kubectl_sends_it(tmp_path):
    """One ConfigMap per key, sent through kubectl's own YAML reading (`label --local`, no server needed)."""
    docs = [f"apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: c{i}}}\ndata:\n  {k}: v\n" for i, k in enumerate(KEYS)]
    path = tmp_path / "keys.yaml"
    path.write_text("---\n".join(docs))
    out = subprocess.run(
        [find_tool("kubectl"), "label", "--local", "-f", str(path), "a=b", "-o", "json"],
        capture_output=True,
        text=True,
        check=True,
        env={"KUBECONFIG": "/dev/null", "PATH": "/usr/bin:/bin"},
    ).stdout
    decoder, at, sent = json.JSONDecoder(), 0, []
    while out[at:].strip():  # one JSON object per document, one after another
        item, end = decoder.raw_decode(out, at + len(out[at:]) - len(out[at:].lstrip()))
        sent.append(next(iter(item["data"])))
        at = end
    assert [kubectl_key(k) for k in KEYS] == sent
