"""`rlt run` as a user runs it, twice: an edited spec continues (more RL steps) or is refused in one line; bad data
and a taken metrics port are one-line errors with the input-error exit code, never a traceback."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from suite_helpers import TINY, tiny_doc

from rlt.contract.exitcodes import ExitCode
from rlt.contract.layout import RunLayout
from rlt.run.plots import read_metrics


def rl_only(tmp_path: Path, **rl) -> Path:
    doc = tiny_doc()
    doc["spec"]["stages"]["sft"] = {"enabled": False}
    doc["spec"]["stages"]["distill"] = {"enabled": False}
    doc["spec"]["stages"]["rl"].update(
        {"steps": 2, "saveSteps": 1, "batchSize": 4, "numGenerations": 2, "maxCompletionLength": 8, **rl}
    )
    doc["spec"]["dataset"]["size"] = 8
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def rlt(*args: str, cwd: Path | None = None, **env_vars: str) -> subprocess.CompletedProcess:
    # `rlt stage` (a pod) and `rlt run` serve metrics on $RLT_METRICS_PORT: any free port here
    env = {**os.environ, "RLT_METRICS_PORT": "0", **env_vars}
    return subprocess.run(
        [sys.executable, "-m", "rlt.cli", *args], capture_output=True, text=True, timeout=600, cwd=cwd, env=env
    )


def assert_one_line_error(
    res: subprocess.CompletedProcess, *fragments: str, code: ExitCode = ExitCode.CONFIG_ERROR
) -> str:
    assert res.returncode == code, (res.returncode, res.stderr[-3000:])
    assert "Traceback" not in res.stderr and "Traceback" not in res.stdout
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, res.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


@pytest.mark.slow
def test_rerun_after_a_spec_edit_continues_or_refuses(tmp_path):
    out = tmp_path / "results"
    layout = RunLayout.for_run(out, "tiny")
    first = rlt("run", str(rl_only(tmp_path)), "--output-dir", str(out), "--metrics-port", "-1", "--no-progress")
    assert first.returncode == 0, first.stderr[-3000:]
    assert [r["step"] for r in read_metrics(layout.metrics_file)] == [1, 2]

    # more steps: RL trains on from its last checkpoint, to step 3 only
    more = rlt(
        "run", str(rl_only(tmp_path, steps=3)), "--output-dir", str(out), "--metrics-port", "-1", "--no-progress"
    )
    assert more.returncode == 0, more.stderr[-3000:]
    assert "[rl] stages.rl.steps 2 -> 3: continuing from the last checkpoint" in more.stdout
    assert [r["step"] for r in read_metrics(layout.metrics_file)] == [1, 2, 3]
    assert json.loads(layout.summary_file.read_text())["rl"]["steps"] == 3
    assert yaml.safe_load((layout.root / "run.yaml").read_text())["spec"]["stages"]["rl"]["steps"] == 3

    # an edit RL cannot absorb: refused in one line naming the fields and the flag; run.yaml still tells the truth
    edited = rl_only(tmp_path, steps=3, learningRate=0.01)
    refused = rlt("run", str(edited), "--output-dir", str(out), "--metrics-port", "-1", "--no-progress")
    line = assert_one_line_error(
        refused, "[rl] finished under a different spec (stages.rl.learningRate 0.0001 -> 0.01)", "--from-stage rl"
    )
    assert yaml.safe_load((layout.root / "run.yaml").read_text())["spec"]["stages"]["rl"]["learningRate"] == 0.0001
    print(line)

    # the flag it names starts rl over; the old outputs are kept aside
    again = rlt(
        "run", str(edited), "--output-dir", str(out), "--metrics-port", "-1", "--no-progress", "--from-stage", "rl"
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert "[rl] started over as asked; previous outputs moved to" in again.stdout
    [old] = (layout.root / "replaced").iterdir()
    assert (old / "DONE").exists() and (old / "model").is_dir()
    assert (
        json.loads((layout.stage_dir("rl") / "spec-fingerprint.json").read_text())["fields"]["stages.rl.learningRate"]
        == 0.01
    )


@pytest.mark.parametrize(
    "rows, policy, fragments",
    [
        (
            [{"question": "Q1", "solution": "A"}, {"question": "Q2", "solution": ""}],
            "reject",
            ["data.jsonl line 2: solution: empty; set spec.dataset.badRows: skip to drop the 1 bad row"],
        ),
        (
            [{"q": "Q1", "solution": "A"}, {"q": "Q2", "solution": "B"}],
            "skip",
            ["data.jsonl line 1: column 'question' is missing (columns: q, solution)", "would drop every row"],
        ),
    ],
)
def test_bad_data_stops_run_and_stage_in_one_line_before_any_model_loads(tmp_path, rows, policy, fragments):
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    doc = tiny_doc()
    doc["spec"]["dataset"] = {"source": "data.jsonl", "badRows": policy}
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(doc))
    res = rlt("run", "run.yaml", "--output-dir", "out", "--metrics-port", "-1", "--no-progress", cwd=tmp_path)
    assert_one_line_error(res, "rlt run: ", *fragments, code=ExitCode.DATA_ERROR)
    assert not (tmp_path / "out" / "tiny" / "run.yaml").exists()  # refused before anything was written
    # the pod's command: the same line, the same exit code (the operator then fails the run instead of restarting)
    res = rlt("stage", "sft", "--config", "run.yaml", "--root", "pvc", cwd=tmp_path)
    assert_one_line_error(res, "rlt stage: ", *fragments, code=ExitCode.DATA_ERROR)
    # and `rlt validate` says it before a run is tried
    val = rlt("validate", "run.yaml", cwd=tmp_path)
    assert val.returncode == 1 and fragments[0] in val.stderr
    assert rlt("validate", "--no-data", "run.yaml", cwd=tmp_path).returncode == 0


def test_a_taken_metrics_port_falls_back_by_default_and_is_one_line_when_chosen(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        res = rlt(
            "run",
            str(TINY),
            "--metrics-port",
            str(port),
            "--output-dir",
            str(tmp_path),
        )
        assert_one_line_error(res, f"--metrics-port {port}: 127.0.0.1:{port} is already in use")
        # chosen by $RLT_METRICS_PORT instead of the flag: chosen all the same, so no fallback either
        res = rlt("run", str(TINY), "--output-dir", str(tmp_path), RLT_METRICS_PORT=str(port))
        assert_one_line_error(res, f"{port}: 127.0.0.1:{port} is already in use")
    res = rlt("run", str(TINY), "--output-dir", str(tmp_path), RLT_METRICS_PORT="nine")
    assert_one_line_error(res, "rlt run: RLT_METRICS_PORT='nine' is not a port number")
    # the pod's command reads the same variable the same way
    res = rlt("stage", "sft", "--config", str(TINY), "--root", str(tmp_path), RLT_METRICS_PORT="nine")
    assert_one_line_error(res, "rlt stage: RLT_METRICS_PORT='nine' is not a port number")
    # the default port (9400) taken, as by a second local run: a free port is used and printed
    from rlt.contract.metrics import TrainerMetrics
    from rlt.run.runner import serve_metrics

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        m = TrainerMetrics("a", "local", "rlt")
        try:
            bound = serve_metrics(m, taken, fallback=True)
            assert bound != taken
            with socket.create_connection(("127.0.0.1", bound), timeout=2):
                pass
        finally:
            m.shutdown()


def test_stage_row_filters_warn_once_per_stage(tiny, formatter, caplog):
    from rlt.stages.rl import rl_rows
    from rlt.stages.sft import sft_rows

    _, tok = tiny
    rows = [
        {"question": "Q " * (300 if i % 2 else 1), "solution": "A", "reasoning_trace": None if i % 2 else "W", "row": i}
        for i in range(6)
    ]
    with caplog.at_level("WARNING"):
        assert len(sft_rows(rows, formatter, tok, "skip")) == 3
        assert len(rl_rows(rows, formatter, tok, 250, "skip")) == 3
    assert [r.getMessage().split(",")[0] for r in caplog.records] == [
        "stage sft: skipping 3 of 6 rows (badRows: skip)",
        "stage rl: skipping 3 of 6 rows (badRows: skip)",
    ]


def test_ctrl_c_is_one_line_naming_where_it_stopped(tmp_path):
    """Ctrl-C during `rlt run`: exit 130 and one line (the stage, its last step, what a re-run does), no traceback;
    before it, the first step's estimate of the rest and the plots of each stage as soon as it ends."""
    import signal

    path = rl_only(tmp_path, steps=6, saveSteps=2)
    doc = yaml.safe_load(path.read_text())
    doc["spec"]["stages"]["sft"] = {"enabled": True, "maxSteps": 1, "batchSize": 4, "perDeviceBatchSize": 4}
    path.write_text(yaml.safe_dump(doc))
    env = {**os.environ, "RLT_METRICS_PORT": "0"}

    def interrupted(out):
        proc = subprocess.Popen(
            [sys.executable, "-m", "rlt.cli", "run", str(path), "--output-dir", str(out), "--no-progress"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            # a Ctrl-C of a terminal: SIGINT at its default, whatever the test's own process inherited (an xdist
            # worker, or a job started in the background, ignores it; Python then keeps ignoring it in the child)
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # noqa: PLW1509 - sets one signal only
        )
        seen = []
        try:
            for line in proc.stdout:
                seen.append(line)
                if line.startswith("[rl] step "):  # the estimate after rl's first step
                    proc.send_signal(signal.SIGINT)
                    break
            out, err = proc.communicate(timeout=300)
        finally:
            proc.kill()
        return proc, seen + [out], err

    proc, seen, err = interrupted(tmp_path / "out")
    assert proc.returncode == 130, (seen, err)
    assert "Traceback" not in err, err
    assert any(line.startswith("[sft] plot: ") for line in seen), seen
    assert any(line.startswith("[rl] step 1/6 took ") and "for the 5 steps left" in line for line in seen), seen
    [last] = [line for line in err.splitlines() if line.startswith("rlt run:")]
    assert "stopped (Ctrl-C) at rl step" in last and "a re-run of the same command" in last, last
    # what rl's checkpoints are trained under, for a re-run to resume only under the same (tests/unit/test_fingerprint)
    started = RunLayout.for_run(tmp_path / "out", doc["metadata"]["name"]).stage_started_spec("rl")
    assert json.loads(started.read_text())["fields"]["stages.rl.steps"] == 6


def test_ctrl_c_during_distill_says_it_resumes_after_the_rows_written(tmp_path):
    """distill has no checkpoints but keeps every row it made (rlt.stages.distill_parts): the message must not send
    its user to a full redo; a trainer stage without a checkpoint does start again."""
    from rlt.run.runner import Interrupted

    layout = RunLayout(tmp_path)
    assert "resumes distill after the rows already written" in str(Interrupted("distill", layout))
    assert "starts rl again" in str(Interrupted("rl", layout))


def test_a_stage_asked_for_without_its_input_is_one_line(tmp_path):
    """`rlt run --stage rl` on a folder without sft's model: one line naming the stage to run first, exit 78."""
    res = rlt("run", str(TINY), "--stage", "rl", "--output-dir", str(tmp_path), "--metrics-port", "-1")
    assert_one_line_error(res, "stage rl needs the sft stage's model", "run stage sft first")


def test_the_stop_messages_say_to_drop_from_stage_to_resume(tmp_path):
    """With --from-stage, "the same command" would start the stage over: the messages say to re-run without it."""
    from rlt.run.runner import Interrupted, stop_if_signalled_late
    from rlt.stages.preemption import LATE_SIGNALS, Stopped

    layout = RunLayout.for_run(tmp_path, "tiny")
    plain, asked = str(Interrupted("rl", layout)), str(Interrupted("rl", layout, "sft"))
    assert "a re-run of the same command starts rl again" in plain
    assert "a re-run without --from-stage sft starts rl again (with it, sft and every later stage start over)" in asked
    LATE_SIGNALS.append(0.0)
    try:
        with pytest.raises(Stopped, match="re-run without --from-stage rl to resume"):
            stop_if_signalled_late("rl", ["distill"], "rl")
    finally:
        LATE_SIGNALS.clear()


def test_a_metrics_address_that_cannot_be_served_is_one_line():
    from rlt.contract.metrics import TrainerMetrics
    from rlt.run.runner import MetricsPortError, serve_metrics

    m = TrainerMetrics("a", "local", "rlt")
    try:
        with pytest.raises(MetricsPortError, match=r"--metrics-port 9: cannot serve on 192.0.2.1:9: "):
            serve_metrics(m, 9, fallback=False, addr="192.0.2.1")  # TEST-NET: no interface of this machine
    finally:
        m.shutdown()
