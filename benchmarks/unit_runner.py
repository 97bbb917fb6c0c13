"""What the long CPU experiments share to run unit by unit on shared cores (benchmarks/sanity_paired.py,
benchmarks/teaching_comparison.py, benchmarks/headroom_students.py): the loop over the missing units, rows appended
as each unit ends (a re-run resumes) and committed with --commit, a deadline no unit runs past, the machine's
heavy-run lock, a low priority that really gives way to other work, and each unit in a process group of its own that
is killed whole at the deadline."""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


def commit_rows(path: Path, message: str, tries: int = 5, also: Iterable[Path] = ()) -> None:
    """Commit `path` (and the files `also`) alone: other staged or edited files are left as they are; a busy index
    is retried."""
    repo, names = path.parent, [str(p.resolve()) for p in (path, *also)]
    for attempt in range(tries):
        try:
            git(repo, "add", "--", *names)
            git(repo, "commit", "-q", "-m", message, "--", *names)
            return
        except subprocess.CalledProcessError as e:
            if "index.lock" not in (e.stderr or "") or attempt == tries - 1:
                raise SystemExit(f"could not commit {path}: {e.stderr.strip()}") from None
            time.sleep(2)


def read_rows(path: Path) -> list[dict]:
    """The JSON lines of `path` (none when it does not exist); a bad line is named by its number."""
    if not path.exists():
        return []
    rows = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path} line {i}: not JSON ({e.msg})") from None
    return rows


def append_row(path: Path, row: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps(row) + "\n")


def run_missing_units(
    units: Iterable[tuple[str, int]],
    units_path: Path,
    run_unit: Callable[[str, int, float], dict | None],
    deadline: float,
    budget: Callable[[str, list[dict], float], tuple[float, float | None]],
    clock: Callable[[], float] = time.time,
    log: Callable[[str], None] = print,
    record: Callable[[Path, dict], None] = lambda path, row: None,
    stopped_note: Callable[[str], str] = lambda arm: "",
    done_note: Callable[[dict], str] = lambda row: f"done in {row['seconds']:.0f} s",
    key: Callable[[dict], tuple[str, int]] = lambda row: (row["arm"], row["seed"]),
) -> list[dict]:
    """Run the (arm, seed) units not yet in `units_path`, in order, until one does not start or is stopped.
    budget(arm, rows so far, seconds left) says (the unit's estimate, the seconds to give it, or None: it does not
    start). run_unit(arm, seed, seconds) returns the unit's row, or None when it was stopped at the deadline; each row
    is appended and `record`ed before the next unit starts. key(row) is the (arm, seed) a row is the unit of (its
    "arm" and "seed" unless given). The new rows, in order."""
    rows = read_rows(units_path)
    done = {key(r) for r in rows}
    new: list[dict] = []
    for arm, seed in units:
        if (arm, seed) in done:
            continue
        left = deadline - clock()
        need, given = budget(arm, rows, left)
        if given is None:
            log(f"[deadline] seed {seed} {arm} not started: needs ~{need:.0f} s, {left:.0f} s left")
            break
        row = run_unit(arm, seed, given)
        if row is None:
            log(f"[deadline] seed {seed} {arm} not finished by the deadline{stopped_note(arm)}")
            break
        append_row(units_path, row)
        record(units_path, row)
        rows.append(row)
        new.append(row)
        log(f"[unit] seed {seed} {arm}: {done_note(row)}")
    return new


def unit_estimate(durations: list[float], first: float) -> float:
    """What the next unit may take: the longest of the last 3 units (the cores are shared; the load changes),
    `first` before any unit has run."""
    return max(durations[-3:]) if durations else first


@contextlib.contextmanager
def heavy_lock(path: str | None, deadline: float) -> Iterator[bool]:
    """The machine's heavy-run lock, polled until the deadline (so that waiting never runs past it)."""
    if not path:
        yield True
        return
    with Path(path).open("a") as f:
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.time() > deadline:
                    yield False
                    return
                time.sleep(5)
        try:
            yield True
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@contextlib.contextmanager
def one_runner(out: Path) -> Iterator[None]:
    """Hold `out`'s runner lock for the runner's life: a second runner on the same folder (one left from a session
    before, say) would run the units the first is running and append their rows twice. Refused, naming the pid."""
    out.mkdir(parents=True, exist_ok=True)
    with (out / ".runner.lock").open("a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            raise SystemExit(
                f"another runner works on {out} (pid {f.read().strip() or '?'}): stop it first, or give another --out"
            ) from None
        f.truncate(0)
        f.write(str(os.getpid()))
        f.flush()
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


ROOT = Path(__file__).resolve().parent.parent


def own_code_env() -> dict[str, str]:
    """This environment with this checkout's training/ and operator/ first on PYTHONPATH: a unit runs the code of
    the commit its row names, even where the virtual environment's editable install points at another checkout
    (a worktree sharing the main checkout's .venv imported the main checkout's code, half-edited)."""
    own = [str(ROOT / "training"), str(ROOT / "operator")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join([*own, *filter(None, [os.environ.get("PYTHONPATH")])])}


def set_autogroup_nice(nice: int) -> bool:
    """Give this process's scheduler autogroup the niceness `nice`; False where the kernel has no autogroups.

    Linux shares the CPU between sessions (one autogroup per setsid) before it looks at a process's own nice, which
    orders processes only inside their group: a unit in a session of its own at nice 19 still took 88 % of a core
    beside a CI run's pytest workers. The group's niceness is what makes it give way."""
    try:
        Path("/proc/self/autogroup").write_text(str(nice))
    except OSError:  # no CONFIG_SCHED_AUTOGROUP, autogroups off, not Linux
        return False
    return True


def lower_priority(nice: int) -> None:
    """Run this process at niceness `nice` (never higher priority than it has) and, when it leads a session of its
    own (`setsid nohup ...`), its autogroup too. A runner started from a terminal shares that terminal's group,
    whose niceness is not this process's to change; its units get their own groups (run_until) at its niceness."""
    os.nice(max(0, nice - os.nice(0)))
    if os.getsid(0) == os.getpid():
        set_autogroup_nice(os.nice(0))


def run_until(cmd: list[str], deadline: float, grace: float = 0.0, log: Path | None = None) -> int | None:
    """Run `cmd` in a process group and session of its own, scheduled at this process's niceness (its output to
    `log` when given; this checkout's code first: own_code_env); its exit status, or None when the deadline came
    first. `grace` seconds before the deadline the group gets SIGTERM (rlt's stages then save their last step), at
    the deadline SIGKILL; the whole group goes, a unit's own children with it. The runner stopped
    (Ctrl-C, SIGTERM) takes its unit down too, the same way: SIGTERM, up to `grace` seconds to save its last step,
    then SIGKILL, so nothing runs on past the deadline unaccounted and a piece cut short keeps what it trained."""
    with contextlib.ExitStack() as stack:
        out = stack.enter_context(log.open("a")) if log is not None else None
        # The new session is a new autogroup at niceness 0: it gets the runner's, or the unit would not give way. The
        # child sets it itself, after setsid and before exec: set from here, a unit favoured over a reniced runner
        # could run (and print its group's niceness) first. The runners have no threads, so preexec_fn is safe.
        nice = os.nice(0)
        proc = subprocess.Popen(
            cmd,
            start_new_session=True,
            preexec_fn=lambda: set_autogroup_nice(nice),  # noqa: PLW1509 (no threads, see above)
            stdout=out,
            stderr=subprocess.STDOUT if out else None,
            env=own_code_env(),
        )
        try:
            try:
                return proc.wait(timeout=max(1.0, deadline - grace - time.time()))
            except subprocess.TimeoutExpired:
                if grace > 0:
                    os.killpg(proc.pid, signal.SIGTERM)
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        proc.wait(timeout=max(1.0, deadline - time.time()))
                kill_group(proc)
                return None
        except BaseException:
            try:  # a second signal during the grace still takes the unit down (finally)
                if grace > 0 and proc.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGTERM)
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        proc.wait(timeout=max(0.1, min(grace, deadline - time.time())))
            finally:
                kill_group(proc)
            raise


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL `proc`'s whole process group (it was started with start_new_session: a unit's own children go with
    it) and reap it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def stop_on_sigterm() -> None:
    """SIGTERM (a session ending, `kill`) raises SystemExit in the runner, so that run_until takes its unit down."""
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


def deadline_ts(hhmm: str | None, minutes: float | None, now: dt.datetime) -> float:
    """--deadline HH:MM (UTC, its next occurrence) or --minutes N from now, as a timestamp; a bad or past value is
    refused. A session can run past midnight, so 00:35 at 22:00 is tomorrow's; but an earlier HH:MM that would be
    tomorrow's more than 12 h ahead is taken for one just past (a typo, a deadline missed) and refused rather than
    run for a day. A later HH:MM today is today's, however far."""
    if hhmm:
        try:
            hh, mm = (int(x) for x in hhmm.split(":"))
            end = now.replace(hour=hh, minute=mm, second=0, microsecond=0)
        except ValueError:
            raise SystemExit(f"--deadline {hhmm!r}: expected HH:MM (UTC)") from None
        if end <= now:
            end += dt.timedelta(days=1)
            if end - now > dt.timedelta(hours=12):
                raise SystemExit(f"--deadline {hhmm}: already past ({now:%H:%M} UTC now)")
        return end.timestamp()
    if minutes is not None:
        if minutes <= 0:
            raise SystemExit(f"--minutes {minutes}: must be positive")
        return now.timestamp() + 60 * minutes
    raise SystemExit("give --deadline HH:MM or --minutes N")
