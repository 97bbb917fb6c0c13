"""`rlt launch`'s exit after its ranks stopped (rlt.cli.launch): STOPPED (a disruption) when the gang agreed on the
stop or this pod was signalled; the launcher's own failure when a rank only left on an error after the launcher's
own SIGTERM, as torchrun sends the other ranks of a pod after one of them was killed (a lost peer, a failure). Real
processes: `rlt launch` runs a stand-in launcher (a Python one-liner) that writes what rlt's ranks write."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlt.contract.exitcodes import ExitCode

RLT = str(Path(sys.executable).parent / "rlt")


AGREED, AFTER_ERROR = True, False  # how a rank stopped: the gang agreed and saved, or it left on an error after it


def launcher(*ranks: bool, wait: bool = False) -> list[str]:
    """A stand-in launcher whose ranks report their stops as rlt's ranks do (rlt.stages.preemption.report_stop, one
    line each in the stop marker), then exits 1 as torchrun does after a rank's non-zero exit; with `wait`, first
    until a SIGTERM reaches it."""
    code = "import signal, sys\nfrom rlt.stages.preemption import Stopped, report_stop\n"
    if wait:
        code += "signal.signal(signal.SIGTERM, lambda *a: None)\nprint('ready', flush=True)\nsignal.pause()\n"
    for agreed in ranks:
        code += f"report_stop(Stopped('rl', 2, '/c/checkpoint-2', gang_agreed={agreed}))\n"
    code += "sys.exit(1)\n"
    return [RLT, "launch", "--", sys.executable, "-c", code]


@pytest.mark.parametrize(
    ("ranks", "expect"),
    [
        ([AGREED, AGREED], ExitCode.STOPPED),  # a peer pod preempted: the gang agreed and saved
        ([AFTER_ERROR], 1),  # torchrun tore the pod's ranks down after one was killed
        ([AFTER_ERROR, AGREED], ExitCode.STOPPED),  # the gang agreed; one rank still left on an error
        ([], 1),  # no rank stopped: the launcher's failure
    ],
)
def test_a_stop_is_a_disruption_only_when_agreed_or_signalled(ranks, expect):
    done = subprocess.run(launcher(*ranks), capture_output=True, text=True, timeout=120)
    assert done.returncode == expect, done.stderr
    if ranks and expect == 1:
        assert "a rank stopped on an error after its launcher's signal" in done.stderr


def test_a_signalled_pod_whose_rank_left_on_an_error_stopped():
    """A drain: the pod's SIGTERM, forwarded; a rank leaves on an error after it (a peer pod gone first)."""
    proc = subprocess.Popen(
        launcher(AFTER_ERROR, wait=True),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == ExitCode.STOPPED, err


DEFECT = """
import os, rlt.cli

def defect(path, args):
    raise RuntimeError(f"a defect on rank {os.environ['RANK']}")

rlt.cli.validate_file = defect
"""


def accelerate_gang(tmp_path: Path, *rlt_args: str) -> subprocess.CompletedProcess[str]:
    """`rlt launch` running a 2-rank gang as the trainer pods run it: accelerate launch with DeepSpeed's standard
    launcher → torchrun → `python -m rlt.cli RLT_ARGS` per rank (tmp_path on PYTHONPATH: a sitecustomize there)."""
    from suite_helpers import ROOT, free_port

    pythonpath = os.pathsep.join([str(tmp_path), str(ROOT / "training"), str(ROOT / "operator")])
    bin_dir = str(Path(sys.executable).parent)
    env = {
        **os.environ,
        "PYTHONPATH": pythonpath,
        "OMP_NUM_THREADS": "1",
        "PATH": bin_dir + os.pathsep + os.environ["PATH"],
    }
    accelerate = ["accelerate", "launch", "--num_machines", "1", "--num_processes", "2", "--machine_rank", "0"]
    accelerate += ["--main_process_ip", "127.0.0.1", "--main_process_port", str(free_port()), "--use_deepspeed"]
    accelerate += ["--zero_stage", "2", "--deepspeed_multinode_launcher", "standard", "--mixed_precision", "no"]
    command = [RLT, "launch", "--", *accelerate, "-m", "rlt.cli", *rlt_args]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)


@pytest.mark.slow  # a real 2-rank accelerate gang: 6-8 s each
def test_a_failed_ranks_exception_is_the_pods_last_line_after_the_launchers_reports(tmp_path):
    """A 2-rank gang whose ranks raise: torchrun's and accelerate's tracebacks and failure report follow the ranks'
    (about 2 KiB), so the pod's termination message (the log's last 2 KiB) lost the rank's exception and the run's
    error line read `ChildFailedError:`. `rlt launch` says the first rank's exception last."""
    from suite_helpers import EXAMPLES

    from rlt_operator.status.observed import last_error_line

    (tmp_path / "sitecustomize.py").write_text(DEFECT)
    done = accelerate_gang(tmp_path, "validate", str(EXAMPLES / "rltrun-tiny.yaml"))
    log = done.stdout + done.stderr
    assert done.returncode == 1 and "ChildFailedError" in log, log[-3000:]
    last = log.strip().splitlines()[-1]
    assert re.fullmatch(r"rlt launch: rank [01] failed: RuntimeError: a defect on rank [01]", last), log[-3000:]
    assert last_error_line(log[-2048:]) == last


@pytest.mark.slow  # a real 2-rank accelerate gang: 6-8 s each
def test_a_ranks_config_error_fails_the_pod_with_its_code_not_the_launchers(tmp_path):
    """`rlt stage rl` before sft's model exists: each rank says it in one line and exits CONFIG_ERROR, which the
    launchers turn into 1 (a gang restart into the same error, each retry counted). `rlt launch` exits with the
    rank's code (the Job's podFailurePolicy fails the run) and says the rank's line last."""
    from suite_helpers import EXAMPLES

    from rlt_operator.status.observed import last_error_line

    done = accelerate_gang(
        tmp_path, "stage", "--config", str(EXAMPLES / "rltrun-tiny.yaml"), "--root", str(tmp_path / "pvc"), "rl"
    )
    log = done.stdout + done.stderr
    assert "ChildFailedError" in log, log[-3000:]
    last = log.strip().splitlines()[-1]
    assert re.fullmatch(r"rlt launch: rank [01] failed: rlt stage: stage rl needs the sft stage's model .*", last), log[
        -3000:
    ]
    assert done.returncode == ExitCode.CONFIG_ERROR, log[-3000:]
    assert last_error_line(log[-2048:]) == last  # the run's error line (rlt_operator.status.observed)


def test_the_line_said_is_the_first_cause_not_a_rank_that_lost_its_peer(tmp_path, monkeypatch):
    """A rank killed without a Python error (an OOM kill) leaves its peers failing on the lost connection: their
    lines are victims'. The first line that is not one is said; with victims only, the first, called one."""
    from rlt.cli.launch import NOTE_CHARS, first_cause, note_failure

    victim = "1\trank 1 failed: RuntimeError: [gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.2]:41"
    cause = "78\trank 0 failed: rlt stage: stage rl needs the sft stage's model at /data/r/sft/model"
    assert first_cause([victim, cause]) == (78, cause.split("\t")[1])
    assert first_cause(["a torn line", cause]) == (78, cause.split("\t")[1])
    code, line = first_cause([victim]) or (0, "")
    assert code == 1 and line.startswith("(perhaps a lost peer") and line.endswith(victim.split("\t")[1])
    assert first_cause([]) is None and first_cause(["torn"]) is None
    # NCCL's own failure (a full /dev/shm, a bad fabric) and a generator's reset connection are causes, said as they are
    nccl = (
        "1\trank 0 failed: torch.distributed.DistBackendError: NCCL error in: NCCLUtils.cpp:77, unhandled system error"
    )
    reset = "1\trank 0 failed: ConnectionResetError: [Errno 104] Connection reset by peer"
    assert first_cause([victim, nccl]) == (1, nccl.split("\t")[1])
    assert first_cause([reset]) == (1, reset.split("\t")[1])
    # a long line is cut
    monkeypatch.setenv("RLT_FAILURE_NOTE", str(tmp_path / "failed"))
    monkeypatch.setenv("RANK", "3")
    note_failure("ValueError: " + "x" * 5000 + "\nsecond line", 1)
    (written,) = (tmp_path / "failed").read_text().splitlines()
    code, line = first_cause([written]) or (0, "")
    assert code == 1 and line.startswith("rank 3 failed: ValueError: xxx") and len(line) < NOTE_CHARS + 40
    # a line that is no valid UTF-8 (a file name's surrogate escapes) is still noted, and noting never raises
    note_failure("DataError: caf\udce9.jsonl row 3: no question", 65)
    code, line = first_cause(["torn", (tmp_path / "failed").read_text().splitlines()[-1]]) or (0, "")
    assert code == 65 and line == "rank 3 failed: DataError: caf\\udce9.jsonl row 3: no question"
    monkeypatch.setenv("RLT_FAILURE_NOTE", str(tmp_path / "no-such-folder" / "failed"))
    note_failure("ValueError: nowhere to note it", 1)


def test_a_rank_notes_its_spec_error_and_its_syntax_error_by_what_went_wrong(tmp_path):
    """`rlt stage` on a spec that does not load exits 78 before any stage runs (SystemExit, not an error the stage
    raised): its line is noted too, or its launcher's 1 would restart the gang into it. A SyntaxError (a user's
    reward module) is noted by its message, not by the file and line its report starts with."""
    bad = tmp_path / "run.yaml"
    bad.write_text("apiVersion: rlt.dev/v1alpha1\nkind: RLTRun\nmetadata: {name: bad}\nspec: {method: nope}\n")
    note = tmp_path / "failed"
    env = {**os.environ, "RLT_FAILURE_NOTE": str(note), "RANK": "1"}
    done = subprocess.run(
        [RLT, "stage", "--config", str(bad), "--root", str(tmp_path / "pvc"), "rl"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == ExitCode.CONFIG_ERROR, done.stderr
    (noted,) = note.read_text().splitlines()
    assert noted.startswith("78\trank 1 failed: ") and "invalid RLTRun; spec.method: unknown" in noted, noted

    from rlt.cli import _note_failure

    note.unlink()
    try:
        compile("def reward(:\n", "/data/reward.py", "exec")
    except SyntaxError as err:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("RLT_FAILURE_NOTE", str(note))
            mp.setenv("RANK", "0")
            _note_failure(err)
    (noted,) = note.read_text().splitlines()
    assert noted.startswith("1\trank 0 failed: SyntaxError: "), noted
