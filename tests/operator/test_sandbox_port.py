"""`rlt sandbox` with its port taken: an explicit --port says which port is taken (one line, exit 1, no traceback);
without --port a taken default is replaced by a free port, said on stdout."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from rlt_sandbox import sandbox

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def taken_port():
    """A port some other program listens on."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def test_a_taken_explicit_port_is_one_line_naming_it(taken_port):
    with pytest.raises(sandbox.PortTaken, match=rf"--port {taken_port}: 127.0.0.1:{taken_port} is already in use"):
        sandbox.choose_port(taken_port)


def test_a_free_explicit_port_is_kept(taken_port):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    assert sandbox.choose_port(free) == free


def test_a_taken_default_port_falls_back_to_a_free_one_and_says_so(taken_port, monkeypatch, capsys):
    monkeypatch.setattr(sandbox, "DEFAULT_PORT", taken_port)
    assert sandbox.choose_port(None) == 0  # 0: the server binds a free port and prints its URL
    assert f"port {taken_port} is in use; the API takes a free port instead" in capsys.readouterr().out


def test_rlt_sandbox_on_a_taken_port_exits_1_with_one_line(taken_port, tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "rlt.cli", "sandbox", "--port", str(taken_port), "--kubeconfig", str(tmp_path / "kc")],
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert out.returncode == 1
    assert "Traceback" not in out.stderr
    errors = [line for line in out.stderr.splitlines() if line.strip() and "stopped" not in line]
    assert errors == [
        f"rlt sandbox: --port {taken_port}: 127.0.0.1:{taken_port} is already in use (another sandbox?); pick "
        "another port, or leave --port out to get a free one"
    ]
