"""A long property run of the door (issue 54): `rlt validate` over files made by mutating valid ones, for a given
number of minutes, with a fixed seed. Five families, in turn:

  run:    a run file of manifests/examples/ with 0-3 mutations: a leaf nudged (a number moved past a bound, a text
          emptied, spaced, recased), a key dropped, a field set from a pool of near-valid values (outputs, node
          selectors, env sources, revisions, rates), or the YAML text edited (a line doubled, a plain scalar that YAML
          1.1 reads otherwise, a key respelled as kubectl would read it);
  rows:   a data file or folder (jsonl, json, csv, parquet; chat rows too), most rows valid, some nudged;
  model:  a model folder made from the built-in tiny Qwen2's config.json and tokenizer files, one or two of them
          nudged, cut short or replaced by a link, a loop, a device or a folder;
  format: a format file (format.file) made from the bundled default, a tag or prompt nudged;
  yaml:   a run file's text with bytes cut, doubled or swapped.

Each case runs in a forked child (the parent imported rlt once), so a case that hangs in C code is killed at --hang
seconds and counted, and no case sees another's state. Per family it counts: tried, accepted, refused, tracebacks
(an exception out of `rlt validate`, or an exit code other than 0 and 1), hangs, silent drops (data accepted with
fewer usable rows than the file holds) and unnamed refusals (a refusal line that names no field, row or file).
Each failing case's files are kept under --keep; `--replay FAMILY:INDEX` runs one case again.

    nice -n 19 .venv/bin/python benchmarks/door_fuzz.py --minutes 20 --seed 54 --keep /tmp/door-fuzz
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import re
import select
import shutil
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from door_fuzz_cases import MAKERS, TINY_MODEL  # the script's folder is on sys.path

FAMILIES = ("run", "rows", "model", "format", "yaml")
COUNTS = ("tried", "accepted", "refused", "traceback", "hang", "silent_drop", "unnamed")
# A refusal line names a field (spec.x, metadata.name), the file or its document, or a row of the data ("where: ...");
# a problem of the whole file (its encoding, its size) is under the line naming the file.
NAMED = re.compile(
    r"(spec|metadata|apiVersion|kind)\b|<\w+>: |document \d+: |[^:\n]+: |(not a UTF-8|file not found|cannot read|\d+ bytes, over|the text holds)"
)

# ------------------------------------------------------------------------------------------------ running


def _too_long(_signum: int, _frame: Any) -> None:
    raise TimeoutError("the warm-up took longer than --hang")


def validate(argv: list[str]) -> dict[str, Any]:
    """`rlt validate ARGV` in this process: exit code, stdout and stderr, or the traceback of what it raised."""
    from rlt.cli import main

    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(["validate", *argv])
    except BaseException:  # noqa: BLE001 - anything out of the door is the run's finding
        return {"code": None, "out": out.getvalue(), "err": err.getvalue() + traceback.format_exc()}
    return {"code": code, "out": out.getvalue(), "err": err.getvalue()}


def in_child(argv: list[str], cwd: Path, hang: float) -> dict[str, Any] | None:
    """validate(ARGV) in a forked child, from `cwd`; None when it took over `hang` seconds (the child is killed)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: answer through the pipe, never return into the parent's loop
        os.close(read)
        try:
            os.chdir(cwd)
            payload = json.dumps(validate(argv)).encode()
        except BaseException:  # noqa: BLE001
            payload = json.dumps({"code": None, "out": "", "err": traceback.format_exc()}).encode()
        with os.fdopen(write, "wb") as f:
            f.write(payload)
        os._exit(0)
    os.close(write)
    chunks, deadline = [], time.monotonic() + hang
    with os.fdopen(read, "rb") as f:
        while True:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([f], [], [], max(left, 0))
            if not ready:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return None
            chunk = os.read(f.fileno(), 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
    _, status = os.waitpid(pid, 0)
    if not chunks:  # the child died before answering (a signal, a crash in C)
        return {"code": None, "out": "", "err": f"child ended with status {status} and no answer"}
    answer: dict[str, Any] = json.loads(b"".join(chunks))
    return answer


def verdicts(family: str, folder: Path, answer: dict[str, Any] | None) -> list[str]:
    """The case's counts beyond `tried`: accepted or refused, and any failure."""
    if answer is None:
        return ["hang"]
    code, out, err = answer["code"], answer["out"], answer["err"]
    if code not in (0, 1) or "Traceback (most recent call last)" in err + out:
        return ["traceback"]
    found = ["accepted" if code == 0 else "refused"]
    if code == 1:
        lines = [x for x in err.splitlines() if x.strip() and not x.endswith(": INVALID") and x.startswith("  ")]
        if not lines or any(not NAMED.match(x.strip()) for x in lines if not x.startswith("    ")):
            found.append("unnamed")
    if family == "rows" and code == 0:
        written = int((folder / "rows.count").read_text())
        used = re.search(r"spec\.dataset: (\d+) usable rows", out)
        if not used or int(used.group(1)) != written:
            found.append("silent_drop")
    return found


def keep(folder: Path, into: Path) -> None:
    """A failing case's files, links as links; a pipe or device is named, not opened (reading one would wait)."""

    def special(where: str, names: list[str]) -> list[str]:
        out = [
            n for n in names if not (Path(where, n).is_symlink() or Path(where, n).is_dir() or Path(where, n).is_file())
        ]
        for n in out:
            Path(into, Path(where).relative_to(folder), f"{n}.special").parent.mkdir(parents=True, exist_ok=True)
            Path(into, Path(where).relative_to(folder), f"{n}.special").write_text("a pipe or device here")
        return out

    shutil.copytree(folder, into, symlinks=True, dirs_exist_ok=True, ignore=special)


def one_case(family: str, seed: int, index: int, folder: Path, cache: Path, hang: float) -> tuple[list[str], str]:
    argv = MAKERS[family](random.Random(f"{seed}:{family}:{index}"), folder, cache)
    answer = in_child(argv, folder, hang)
    shown = "" if answer is None else (answer["err"] + answer["out"])[-3000:]
    return verdicts(family, folder, answer), shown


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=20)
    parser.add_argument("--seed", type=int, default=54)
    parser.add_argument("--hang", type=float, default=120, help="seconds one validate may take")
    parser.add_argument("--keep", type=Path, default=Path(tempfile.gettempdir()) / "rlt-door-fuzz")
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--replay", help="FAMILY:INDEX: run that one case, print its output, keep its files")
    args = parser.parse_args()
    families = args.families.split(",")
    home = Path(os.environ.get("RLT_CACHE", Path.home() / ".cache" / "rlt"))
    work = Path(tempfile.mkdtemp(prefix="rlt-door-fuzz-"))
    cache = work / "cache"  # the run's own tokenizer cache; the built-in models are read from the user's
    (cache / "models").mkdir(parents=True)
    (cache / "models" / TINY_MODEL).symlink_to(home / "models" / TINY_MODEL)
    os.environ["RLT_CACHE"] = str(cache)
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # the children are forked: no thread pool to inherit
    import rlt.cli  # noqa: F401 - imported once, before the children are forked

    if args.replay:
        family, index = args.replay.split(":")
        folder = args.keep / f"{family}-{index}"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        found, shown = one_case(family, args.seed, int(index), folder, cache, args.hang)
        print(shown, "\n", found, f"\nfiles: {folder}")
        return
    for family in families:  # once in this process: what the cases import is imported before they are forked
        folder = work / f"warm-{family}"
        folder.mkdir()
        argv = MAKERS[family](random.Random(f"{args.seed}:{family}:warm"), folder, cache)
        here = Path.cwd()
        os.chdir(folder)
        signal.signal(signal.SIGALRM, _too_long)
        signal.alarm(int(args.hang))  # a warm-up that waits (a pipe opened) is stopped, not waited for
        try:
            validate(argv)
        finally:
            signal.alarm(0)
            os.chdir(here)
    stats = {f: dict.fromkeys(COUNTS, 0) for f in families}
    failures: list[str] = []
    start = time.monotonic()
    end, index = start + args.minutes * 60, 0
    while time.monotonic() < end:
        for family in families:
            folder = work / f"{family}-{index}"
            folder.mkdir()
            found, shown = one_case(family, args.seed, index, folder, cache, args.hang)
            stats[family]["tried"] += 1
            for v in found:
                stats[family][v] += 1
            bad = [v for v in found if v not in ("accepted", "refused")]
            if bad:
                failures.append(f"{family}:{index} {'+'.join(bad)}: {shown.strip()[-600:]!r}")
                print(f"FAIL {failures[-1]}", flush=True)
                keep(folder, args.keep / f"{family}-{index}")
            shutil.rmtree(folder, ignore_errors=True)
        index += 1
        if index % 10 == 0:
            print(f"{(time.monotonic() - start) / 60:.1f} min, {index} rounds: {json.dumps(stats)}", flush=True)
    shutil.rmtree(work, ignore_errors=True)
    totals = {c: sum(s[c] for s in stats.values()) for c in COUNTS}
    print(f"done: seed {args.seed}, {args.minutes} min, cases 0..{index - 1} of each family")
    for family, s in stats.items():
        print(f"  {family:<7}" + "  ".join(f"{c} {s[c]}" for c in COUNTS))
    print("  total  " + "  ".join(f"{c} {totals[c]}" for c in COUNTS))
    print(f"{len(failures)} failing case(s), kept under {args.keep}:")
    for f in failures:
        print("  " + f)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
