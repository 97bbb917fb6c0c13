"""Flags that name a folder, a file to write, a port or seconds refuse a bad value with argparse's one-line usage
error (exit 2) before anything starts: the real parser of `rlt`, sandbox and monitor commands included."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import pytest

from rlt.cli import main


@pytest.fixture
def paths(tmp_path):
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "a-folder").mkdir()
    return tmp_path


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["run", "r.yaml", "--output-dir", "{a-file}"], "argument --output-dir: {a-file}: not a folder"),
        (
            ["run", "r.yaml", "--output-dir", "{a-file}/sub"],
            "argument --output-dir: {a-file}/sub: {a-file} is not a folder",
        ),
        (["compare", "r.yaml", "--output-dir", "{a-file}"], "argument --output-dir: {a-file}: not a folder"),
        (["eval", "r.yaml", "--output", "{a-file}"], "argument --output: {a-file}: not a folder"),  # the old name
        (["stage", "sft", "--config", "r.yaml", "--root", "{a-file}"], "argument --root: {a-file}: not a folder"),
        (["run", "r.yaml", "--linger", "inf"], "argument --linger: 'inf': expected a number of seconds, at least 0"),
        (["run", "r.yaml", "--linger", "-5"], "argument --linger: '-5': expected a number of seconds, at least 0"),
        (["run", "r.yaml", "--linger", "nan"], "argument --linger: 'nan': expected a number of seconds"),
        (["sandbox", "--kubeconfig", "{a-folder}"], "argument --kubeconfig: {a-folder}: a folder, not a file"),
        (["sandbox", "--kubeconfig", "{a-file}/k"], "argument --kubeconfig: {a-file}/k: {a-file} is not a folder"),
        (["sandbox", "--port", "99999"], "argument --port: '99999' is not a port number (1-65535)"),
        (["sandbox", "--port", "-1"], "argument --port: '-1' is not a port number (1-65535)"),
        (["sandbox", "--run-pods", "{a-file}"], "argument --run-pods: {a-file}: not a folder"),
        (["monitor", "--port", "70000"], "argument --port: '70000' is not a port number (1-65535)"),
        (["monitor", "--every", "0"], "argument --every: '0': expected a number of seconds, above 0"),
        (["monitor", "--output-dir", "{a-file}"], "argument --output-dir: {a-file}: not a folder"),
    ],
)
def test_a_bad_flag_value_is_a_usage_error_naming_it(paths, capsys, argv, says):
    where = {"{a-file}": str(paths / "a-file"), "{a-folder}": str(paths / "a-folder")}

    def fill(text: str) -> str:
        for key, value in where.items():
            text = text.replace(key, value)
        return text

    with pytest.raises(SystemExit) as stop:
        main([fill(a) for a in argv])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert f"rlt {argv[0]}: error: {fill(says)}" in err, err


def test_good_values_pass(paths):
    from rlt.cli import build_parser

    args = build_parser().parse_args(
        ["run", "r.yaml", "--output-dir", str(paths / "new" / "deeper"), "--linger", "2.5"]
    )
    assert (args.output_dir, args.linger) == (str(paths / "new" / "deeper"), 2.5)
    assert build_parser().parse_args(["compare", "r.yaml"]).output_dir == "results"
    args = build_parser().parse_args(["monitor", "--port", "9091", "--every", "0.5", "--work", str(paths / "w")])
    assert (args.port, args.every) == (9091, 0.5)


def _visible_options(parser, prog="rlt"):
    """(command, option, action) for every option `--help` shows, subcommands included."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _visible_options(sub, f"{prog} {name}")
        elif action.help != argparse.SUPPRESS:
            yield from ((prog, option, action) for option in action.option_strings)


def test_output_picks_a_format_and_output_dir_names_a_folder_in_every_command():
    """kubectl's meaning everywhere: `-o/--output` is text or json; the folder a command writes is `--output-dir`."""
    from rlt.cli import build_parser
    from rlt.cli.output import FORMATS

    options = list(_visible_options(build_parser()))
    outputs = [(command, tuple(a.choices or ())) for command, option, a in options if option == "--output"]
    assert outputs and all(choices == FORMATS for _, choices in outputs), outputs
    folders = {command for command, option, a in options if option == "--output-dir" and a.metavar == "DIR"}
    assert folders == {"rlt run", "rlt eval", "rlt compare", "rlt monitor"}, folders
    assert not [(c, o) for c, o, _ in options if o == "--out"]


@pytest.mark.parametrize(("argv", "old"), [(["run", "r.yaml"], "--output"), (["monitor"], "--out")])
def test_a_folder_flags_old_name_still_works_and_says_its_new_one(paths, capsys, argv, old):
    from rlt.cli import build_parser

    args = build_parser().parse_args([*argv, old, str(paths / "kept")])
    assert args.output_dir == str(paths / "kept")
    assert f"rlt {argv[0]}: {old} is deprecated, use --output-dir (same value)" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([argv[0], "--help"])
    assert f"{old} " not in capsys.readouterr().out  # hidden from help: new scripts learn the new name only


def test_rlt_monitor_refuses_a_bad_run_file_as_rlt_run_does_and_leaves_no_temp_folder(tmp_path):
    """The run file is checked before Prometheus' temp folder is made: one line per problem, exit 78."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [\n")
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = {**os.environ, "TMPDIR": str(scratch)}
    done = subprocess.run(
        [sys.executable, "-m", "rlt.cli", "monitor", str(bad)], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 78 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.stderr.startswith(f"{bad}: invalid RLTRun\n"), done.stderr
    assert list(scratch.iterdir()) == []


def test_every_command_says_what_it_does_at_the_top_of_its_help(capsys):
    from rlt.cli import build_parser

    parser = build_parser()
    (sub,) = [a for a in parser._actions if a.dest == "command"]
    for listed in sub._choices_actions:
        assert sub.choices[listed.dest].description == listed.help, listed.dest
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    out = capsys.readouterr().out
    plan_line = next(a.help for a in sub._choices_actions if a.dest == "plan")
    assert plan_line.split()[0] in out.split("\n\n")[1], out


@pytest.mark.parametrize(
    ("command", "example"),
    [
        ("run", "local/rltrun-own-data.yaml"),
        ("compare", "local/rltrun-own-data.yaml"),
        ("eval", "rltrun-rcl-local.yaml"),
    ],
)
def test_device_cuda_without_a_cuda_device_is_one_line_before_anything_loads(capsys, command, example):
    import torch
    from suite_helpers import EXAMPLES

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    with pytest.raises(SystemExit) as stop:
        main([command, str(EXAMPLES / example), "--device", "cuda"])
    assert stop.value.code == 69
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"rlt {command}: --device cuda: no CUDA device here (torch {torch.__version__}, built for CPU); leave --device out for the CPU"
    ], err
