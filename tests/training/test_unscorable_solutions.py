"""A solution that merges into its answer tags ("<answer>." is one SmolLM2 token) has no token the reward can score:
r_SS is undefined for it. The row is refused before anything trains (`rlt validate`, `rlt run`, and the rl and
distill stages for the pods) naming its line, or left out under badRows: skip; before, the reward failed at
whichever step first drew the row."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from suite_helpers import tiny_doc

from rlt.contract.exitcodes import ExitCode
from rlt.data.errors import DataError
from rlt.method.prompts import scored_solution_tokens
from rlt.method.reward import RLTReward
from rlt.stages.rl_reward import scorable_rows

# '"' merges into the tiny tokenizer's answer tag; "." into SmolLM2's (both found by scoring every printable character)
TINY_UNSCORABLE = '"'
GOOD = {"question": "What is 2 + 2?", "reasoning_trace": "add two and two", "solution": "4"}
BAD = {"question": "Which mark ends a sentence?", "reasoning_trace": "a full stop", "solution": TINY_UNSCORABLE}


@pytest.mark.parametrize(("solution", "tokens"), [(".", 0), ("=", 0), (">", 0), ("42", 2), ("a.", 2), ("x", 1)])
def test_smollm2_scores_no_token_of_a_solution_that_merges_into_its_tag(formatter, smol_tok, solution, tokens):
    assert scored_solution_tokens(formatter, smol_tok, "What is it?", solution) == tokens


def test_the_check_counts_the_tokens_the_reward_scores(formatter, tiny):
    """The check and the reward select the same tokens: equal counts where a row scores, the reward's own failure
    where the check says none."""
    model, tok = tiny
    reward = RLTReward(model, tok, formatter, teacher=model, teacher_tokenizer=tok, temperature=0.7)
    solutions = ["4", "42", "the answer is 7", "x = 3."]
    completions = [f"because {s}</think>" for s in solutions]
    out = reward.score(["Q?"] * len(solutions), solutions, completions)
    assert out.solution_tokens == [scored_solution_tokens(formatter, tok, "Q?", s) for s in solutions]
    assert scored_solution_tokens(formatter, tok, "Q?", TINY_UNSCORABLE) == 0
    with pytest.raises(ValueError, match="no solution token could be scored"):
        reward.score(["Q?"], [TINY_UNSCORABLE], ["a mark</think>"])


def test_the_file_tokenizer_of_the_door_counts_as_transformers_does(formatter, smol_tok, tmp_path):
    from rlt.data.local_tokenizer import FileTokenizer

    smol_tok.save_pretrained(tmp_path)
    door = FileTokenizer(tmp_path, "spec.student.model")
    for s in [".", "=", "42", "x = 3.", "\\boxed{5}"]:
        assert scored_solution_tokens(formatter, door, "Q?", s) == scored_solution_tokens(formatter, smol_tok, "Q?", s)


def test_the_stages_refuse_the_row_by_its_line_or_skip_it(formatter, tiny):
    _, tok = tiny
    rows = [GOOD | {"row": 0}, BAD | {"row": 1}, GOOD | {"row": 2}]
    with pytest.raises(DataError, match=r"stage rl: line 2: solution '\"' has no token of its own"):
        scorable_rows(rows, formatter, tok, "reject", "rl", lambda i: f"line {i + 1}")
    kept = scorable_rows(rows, formatter, tok, "skip", "distill")
    assert [r["row"] for r in kept] == [0, 2]
    with pytest.raises(DataError, match="no usable rows"):
        scorable_rows([BAD | {"row": 0}], formatter, tok, "skip", "rl")


def write_run(tmp_path, rows, stages=None):
    data = tmp_path / "marks.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    doc = tiny_doc()
    doc["spec"]["dataset"] = {"source": str(data)}
    for name, on in (stages or {}).items():
        doc["spec"]["stages"][name]["enabled"] = on
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def rlt(*args):
    return subprocess.run([sys.executable, "-m", "rlt.cli", *args], capture_output=True, text=True, timeout=300)


def test_validate_and_run_name_the_line_before_anything_trains(tmp_path, tiny):
    """`tiny` builds the model, so `rlt validate` has the student's tokenizer on this machine."""
    path = write_run(tmp_path, [GOOD, BAD, GOOD, BAD])
    res = rlt("validate", str(path))
    assert res.returncode == 1, res.stdout + res.stderr
    line = next(x for x in res.stderr.splitlines() if "spec.stages.rl.reward:" in x)
    assert "2 of 4 rows have a solution with no token of its own" in line and ": line 2, line 4;" in line, line
    res = rlt("run", str(path), "--output-dir", str(tmp_path / "results"), "--no-progress", "--metrics-port", "-1")
    assert res.returncode == ExitCode.DATA_ERROR, res.stdout[-2000:] + res.stderr[-3000:]
    assert "Traceback" not in res.stderr and "line 2, line 4" in res.stderr
    assert "[sft] starting" not in res.stdout
    # without rl and distill nothing scores solutions: the same rows are fine for sft alone
    alone = write_run(tmp_path, [GOOD, BAD, GOOD, BAD], {"rl": False, "distill": False})
    assert rlt("validate", str(alone)).returncode == 0


@pytest.mark.parametrize("bad_rows", ["reject", "skip"])
def test_the_pods_stages_refuse_or_skip_the_row_themselves(bad_rows, tmp_path):
    """A pod runs its stage without `rlt run`'s check: rl and distill check the rows themselves before generating."""
    from rlt.contract.layout import RunLayout
    from rlt.spec.loading import parse_run
    from rlt.stages.context import StageContext
    from rlt.stages.distill import run_distill
    from rlt.stages.rl import run_rl

    data = tmp_path / "marks.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in [GOOD, BAD, GOOD]))

    def ctx(rl: bool) -> StageContext:  # no sft: rl starts from spec.teacher, and distill too when rl is off
        doc = tiny_doc()
        doc["spec"]["dataset"] = {"source": str(data), "badRows": bad_rows}
        doc["spec"]["stages"]["sft"] = {"enabled": False}
        doc["spec"]["stages"]["rl"]["enabled"] = rl
        doc["spec"]["stages"]["distill"].update(samplesPerQuestion=2, maxNewTokens=8)
        run = parse_run(doc)
        return StageContext(run, RunLayout.for_run(tmp_path / str(rl), run.name), show_progress=False)

    if bad_rows == "reject":
        for stage, name, rl in ((run_rl, "rl", True), (run_distill, "distill", False)):
            with pytest.raises(DataError, match=rf"stage {name}: line 2: solution '\"'"):
                stage(ctx(rl))
        return
    path = run_distill(ctx(False))  # the spec's teacher explains the two scorable questions
    written = [json.loads(line) for line in Path(path).read_text().splitlines()]
    assert [r["question"] for r in written] == [GOOD["question"]] * 2


def test_a_distill_only_run_refuses_the_rows_before_its_first_stage(tmp_path, tiny):
    """distill scores with rl's reward: with rl off (or done) `rlt run` still names the rows before distill starts."""
    path = write_run(tmp_path, [GOOD, BAD, GOOD], {"sft": False, "rl": False})
    res = rlt("run", str(path), "--output-dir", str(tmp_path / "results"), "--no-progress", "--metrics-port", "-1")
    assert res.returncode == ExitCode.DATA_ERROR, res.stdout[-2000:] + res.stderr[-3000:]
    assert "spec.stages.rl.reward: 1 of 3 rows" in res.stderr and "line 2" in res.stderr, res.stderr[-3000:]
    assert "[distill] starting" not in res.stdout
