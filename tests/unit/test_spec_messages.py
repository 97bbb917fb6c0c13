"""Spec errors a user can act on: a did-you-mean for unknown fields, and every problem of a file in one pass."""

import pytest
import yaml
from suite_helpers import tiny_doc

from rlt.checks.validation import load_valid_run
from rlt.spec.loading import SpecError, parse_spec


def test_unknown_fields_get_a_did_you_mean_and_cross_field_checks_still_run(tmp_path):
    doc = tiny_doc()
    rl = doc["spec"]["stages"]["rl"]
    rl["numGeneration"] = 4  # typo
    rl["batchSize"] = 6  # not divisible by numGenerations (4): pydantic hides this behind the unknown field
    doc["spec"]["stages"]["sft"]["batchsize"] = 3
    doc["spec"]["datset"] = {}
    doc["spec"]["stages"]["rl"]["zzz"] = 1  # nothing close: no suggestion
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(doc))
    with pytest.raises(SpecError) as err:
        load_valid_run(tmp_path / "r.yaml")
    assert sorted(err.value.problems) == sorted(
        [
            "spec.stages.rl.numGeneration: unknown field (did you mean numGenerations?)",
            "spec.stages.sft.batchsize: unknown field (did you mean batchSize?)",
            "spec.datset: unknown field (did you mean dataset?)",
            "spec.stages.rl.zzz: unknown field",
            "spec.stages.rl.batchSize: 6 must be divisible by numGenerations (4)",
        ]
    )


def test_the_operator_path_reports_the_same():
    with pytest.raises(SpecError) as err:
        parse_spec(
            {
                "teacher": {"model": "t"},
                "student": {"model": "s"},
                "dataset": {"source": "builtin:arithmetic"},
                "stages": {"rl": {"batchSize": 10, "numGenerations": 4, "learnigRate": 1}},
            }
        )
    assert err.value.problems == [
        "spec.stages.rl.learnigRate: unknown field (did you mean learningRate?)",
        "spec.stages.rl.batchSize: 10 must be divisible by numGenerations (4)",
    ]


def test_a_run_file_is_loaded_one_way_with_every_rule(tmp_path):
    """One loader of RLTRun files (rlt.checks.validation.load_valid_run/s, which `rlt validate`, `rlt run`, `rlt stage`
    and the tests use): the run name's length rule holds for it, and the spec package
    offers no other file loader that would skip it."""
    from rlt.spec import loading

    doc = tiny_doc()
    doc["metadata"]["name"] = "a" * 50  # a DNS-1123 label, too long for the children's names
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(doc))
    with pytest.raises(SpecError, match="metadata.name: .* is 50 characters, over 40"):
        load_valid_run(tmp_path / "r.yaml")
    assert not [n for n in dir(loading) if n.startswith("load_")]
