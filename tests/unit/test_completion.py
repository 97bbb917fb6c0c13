"""`rlt completion bash`: the script the command prints, sourced into a real bash and asked what it completes, as
bash asks it on a Tab (COMP_WORDS, COMP_CWORD, then the function `complete -F` names)."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="no bash on this machine")

# Completes each line given as arguments (the last word is the one being typed) and prints the candidates.
ASK = r"""
source "$1"; shift
words=("$@")
COMP_WORDS=("${words[@]}"); COMP_CWORD=$((${#words[@]} - 1))
COMP_LINE="${words[*]}"; COMP_POINT=${#COMP_LINE}
COMPREPLY=()
fn=$(complete -p rlt | sed -n 's/.*-F \([^ ]*\) rlt$/\1/p')
"$fn" rlt "${words[-1]}" "${words[-2]}"
printf '%s\n' "${COMPREPLY[@]}"
"""


def completion(shell: str) -> subprocess.CompletedProcess:
    """`rlt completion SHELL`, run as a command."""
    return subprocess.run(
        [sys.executable, "-m", "rlt.cli", "completion", shell], capture_output=True, text=True, timeout=120, check=False
    )


@pytest.fixture(scope="module")
def script(tmp_path_factory):
    done = completion("bash")
    assert done.returncode == 0, done.stderr
    path = tmp_path_factory.mktemp("completion") / "rlt.bash"
    path.write_text(done.stdout)
    return path


@pytest.fixture
def folder(tmp_path):
    (tmp_path / "run.yaml").write_text("kind: RLTRun\n")
    (tmp_path / "runs-notes.txt").write_text("\n")
    (tmp_path / "results").mkdir()
    return tmp_path


def complete(script, folder, *words: str) -> list[str]:
    done = subprocess.run(
        ["bash", "-c", ASK, "ask", str(script), "rlt", *words],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return sorted(line for line in done.stdout.splitlines() if line)


def test_the_commands_complete_including_the_installed_command_groups(script, folder):
    commands = complete(script, folder, "")
    for name in ("validate", "run", "plan", "completion", "operator", "sandbox"):
        assert name in commands, commands
    assert complete(script, folder, "pl") == ["plan"]


def test_options_and_their_choices_complete(script, folder):
    assert complete(script, folder, "run", "--from") == ["--from-stage"]
    assert complete(script, folder, "run", "--stage", "") == sorted(["sft", "rl", "distill", "student", "evaluate"])
    assert complete(script, folder, "plan", "-o", "") == ["json", "text"]
    assert complete(script, folder, "operator", "--log-format", "j") == ["json"]


def test_a_run_file_completes_to_files_and_the_output_folder_to_folders_only(script, folder):
    assert complete(script, folder, "run", "ru") == ["run.yaml", "runs-notes.txt"]
    assert complete(script, folder, "validate", "run.yaml", "r") == ["results", "run.yaml", "runs-notes.txt"]
    assert complete(script, folder, "run", "run.yaml", "--output-dir", "r") == ["results"]
    assert complete(script, folder, "stage", "rl", "--root", "") == ["results"]
    assert complete(script, folder, "plan", "--calibration", "runs") == ["runs-notes.txt"]


def test_an_unknown_shell_is_refused_naming_the_ones_there_are():
    done = completion("fish")
    assert done.returncode == 2
    assert "'bash', 'zsh', 'tcsh'" in done.stderr, done.stderr
