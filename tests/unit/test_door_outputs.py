"""Outputs pointed at each other or into the run's own folder (issue 54, class 3), written from the class: two
spellings of one place (gcs:// and gs://, a file path with '.', '..' or '//', a Hub repo id in another case, a
trailing '/') are one place to the store that receives the push, so two outputs so spelled are refused naming both
fields; a file:// output on the run's own volume (the pods mount it at /data; the run's folder is /data/<name>) is
no copy off the volume, refused naming the field and the folder."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from suite_helpers import door_problems


def _respell(draw, scheme: str, path: str) -> str:
    """Another spelling of scheme://path that names the same place to the store."""
    if scheme in ("gs", "gcs"):
        scheme = draw(st.sampled_from(["gs", "gcs"]))
    if scheme == "file":
        head, _, tail = path.rpartition("/")
        path = draw(st.sampled_from([f"{head}/./{tail}", f"{head}//{tail}", f"{head}/x/../{tail}", path + "/"]))
    if scheme == "hf":
        path = draw(st.sampled_from([path.upper(), path.title(), path + "/"]))
    if scheme in ("s3", "gs", "gcs"):
        path = path + draw(st.sampled_from(["/", ""]))
    return f"{scheme}://{path}"


PLACES = [("gs", "my-bucket/teacher"), ("file", "/mnt/out/teacher"), ("hf", "org/model"), ("s3", "my-bucket/t")]


@settings(max_examples=40, deadline=None, derandomize=True)
@given(data=st.data())
def test_two_outputs_spelled_apart_but_one_place_are_refused_naming_both(data):
    scheme, path = data.draw(st.sampled_from(PLACES))
    first = f"{scheme}://{path}"
    second = _respell(data.draw, scheme, path)
    problems = door_problems({"outputs": {"teacher": first, "student": second}, "hfTokenSecret": {"name": "hf"}})
    named = [p for p in problems if p.startswith("spec.outputs.student:")]
    assert named and "teacher" in named[0] and "place too" in named[0], (first, second, problems)


@pytest.mark.parametrize(
    ("teacher", "dataset"),
    [("gs://my-bucket/a", "gs://my-bucket/b"), ("file:///mnt/a", "file:///mnt/ab"), ("s3://bkt/x", "s3://bkt2/x")],
)
def test_outputs_in_different_places_are_accepted(teacher, dataset):
    assert door_problems({"outputs": {"teacher": teacher, "distillDataset": dataset}}) == []


@pytest.mark.parametrize(
    ("uri", "inside"),
    [
        ("file:///data/tiny/exported", True),
        ("file:///data/tiny", True),
        ("file:///data//tiny/./x", True),
        ("file:///data/other-run/x", False),
        ("file:///data", False),
    ],
)
def test_a_file_output_on_the_runs_own_volume_is_refused_naming_the_field(uri, inside):
    problems = door_problems({"outputs": {"teacher": uri}})
    (line,) = [p for p in problems if p.startswith("spec.outputs.teacher:")]
    assert uri in line and ("run's own folder /data/tiny" in line) == inside and "volume" in line, line


def test_a_file_output_off_the_volume_is_accepted():
    assert (
        door_problems({"outputs": {"teacher": "file:///mnt/exports/tiny", "distillDataset": "file:///datasets/x"}})
        == []
    )
