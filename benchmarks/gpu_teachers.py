"""The teaching comparison's teacher units on a lent GPU (issue 52; docs/experiments.md, "Teachers on a lent GPU").

The registered design runs the students on CPU and the teachers "on a GPU when one is lent (one prepared command,
the same rollouts as the CPU protocol)". This is that command's two halves:

  on the device (after `hack/pilot_device.sh stash`, within the machine's warm time):
    hack/pilot_device.sh teachers $OUT --seeds 2-15 --minutes 7
  here, on what came back:
    python benchmarks/gpu_teachers.py --import FILES_AT/teachers.tar.gz --commit

A teacher unit on the device is the CPU runner's own unit (`teaching_comparison.py --unit <arm>.teacher --seed s`):
the same RLTRun, the same settings, rlt's own stages, with the weights and the training pinned to float32 (rlt's
auto would be bf16 on a GPU; the CPU units run float32), HF generation (no vLLM on the box). The device runs every
missing seed's two primary teacher units (rl, sft-continued) side by side on its one GPU, `--parallel` processes at
a time, rl's first within each seed; at `--minutes` it kills what still runs (a killed unit's pieces stay on the box,
which goes back bare: it is run again, under its own seed, on CPU or the next GPU). What comes back is two files:
teachers.json (every unit's status, seconds and log tail, the GPU, the code's fingerprint) and teachers.tar.gz (the
finished units' rows and their distillation datasets).

Its first run (2026-12-04, one H200, twelve units at once) found that an rl unit needs about 20 minutes there, more
than a lease gives (10 minutes a command, 15 a session): read docs/experiments.md before spending a lease on it.

Fixed before any device run: a teacher seed is imported only with both primary teacher units (its teachers then
ran on one device), each row keeps `device` (the GPU's name), gets `code` (the commit whose training/ and
benchmarks/ Python files the device ran, checked against the fingerprint) and is appended and committed as the CPU
runner's rows are; a unit already in the units file is never replaced; a finished unit of an incomplete seed is not
imported (its seed's units run again elsewhere) and the summary says so.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from comparison_runner import PRIMARY_TEACHERS, SCRIPT, unit_name
from unit_runner import ROOT, append_row, commit_rows, git, kill_group, own_code_env, read_rows

CODE_DIRS = ("training", "benchmarks")  # the Python a unit runs: rlt's stages and the runner
POLL = 2.0  # seconds between looks at the running units
TAIL = 40  # log lines of each unit that come back


# ---- the code a unit ran: a fingerprint the box computes without git, and the same from a commit


def blob_id(data: bytes) -> str:
    """git's object id of a file's bytes (what `git ls-tree` lists)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def fingerprint(entries: Iterable[tuple[str, str]]) -> str:
    return hashlib.sha256("".join(f"{blob} {path}\n" for path, blob in sorted(entries)).encode()).hexdigest()


def tree_fingerprint(root: Path) -> str:
    """The fingerprint of the Python files under CODE_DIRS of a folder (the device's copy of the working tree)."""
    files = [p for d in CODE_DIRS for p in (root / d).rglob("*.py") if "__pycache__" not in p.parts]
    return fingerprint((p.relative_to(root).as_posix(), blob_id(p.read_bytes())) for p in files)


def commit_fingerprint(repo: Path, commit: str) -> str:
    """The same fingerprint of a commit's tree."""
    listing = git(repo, "ls-tree", "-r", "--format=%(objectname) %(path)", commit, "--", *CODE_DIRS)
    pairs = (line.split(" ", 1) for line in listing.splitlines())
    return fingerprint((path, blob) for blob, path in pairs if path.endswith(".py"))


# ---- the device: the teacher units side by side, killed at the deadline


@dataclass
class UnitRun:
    """One teacher unit on the device: its status (waiting, running, done, failed, stopped at the deadline or not
    started), its seconds and, when it ends, the tail of its log."""

    name: str
    seed: int
    status: str = "waiting"
    seconds: float | None = None
    exit: int | None = None
    tail: list[str] = field(default_factory=list)


def schedule(seeds: list[int]) -> list[UnitRun]:
    """Each seed's primary teacher units in the CPU runner's order (rl's first: the longest), seed by seed."""
    return [UnitRun(unit_name(arm), seed) for seed in seeds for arm in PRIMARY_TEACHERS]


def missing_seeds(seeds: list[int], units_path: Path, settings: str) -> list[int]:
    """The seeds none of whose primary teacher units has a row (a seed with one has its other on that device)."""
    have = {(r["unit"], r["seed"]) for r in read_rows(units_path) if r.get("settings") == settings}
    return [s for s in seeds if not any((unit_name(a), s) in have for a in PRIMARY_TEACHERS)]


def run_pool(
    units: list[UnitRun],
    command: Callable[[UnitRun], list[str]],
    parallel: int,
    deadline: float,
    logs: Path,
    env: dict[str, str] | None = None,
    clock: Callable[[], float] = time.time,
    report: Callable[[str], None] = print,
    on_poll: Callable[[], None] = lambda: None,
    poll: float = POLL,
) -> list[UnitRun]:
    """Run `units` at most `parallel` at a time, each `command(unit)` in a process group of its own, its output in
    logs/<name>-seed<seed>.log; in order, while the deadline has not come and no unit has failed (a failure on the
    device is most likely the code, and the next units would fail the same way). At the deadline every running
    group is killed whole. Each unit's status is set; the units are returned. on_poll() runs at every look."""
    logs.mkdir(parents=True, exist_ok=True)
    waiting: list[UnitRun] = list(units)
    running: list[tuple[UnitRun, subprocess.Popen[bytes], float]] = []
    failed = False
    try:
        while waiting or running:
            now = clock()
            for entry in list(running):
                u, proc, started = entry
                code = proc.poll()
                if code is None and now < deadline:
                    continue
                if code is None:
                    kill_group(proc)
                    u.status = "stopped at the deadline"
                else:
                    u.status, u.exit = ("done", 0) if code == 0 else ("failed", code)
                    failed = failed or code != 0
                u.seconds = round(now - started, 1)
                u.tail = log_of(logs, u).read_text(errors="replace").splitlines()[-TAIL:]
                running.remove(entry)
                report(f"[unit] seed {u.seed} {u.name}: {u.status} after {u.seconds:.0f} s")
            while waiting and len(running) < parallel and now < deadline and not failed:
                u = waiting.pop(0)
                with log_of(logs, u).open("w") as out:
                    proc = subprocess.Popen(
                        command(u), start_new_session=True, stdout=out, stderr=subprocess.STDOUT, env=env
                    )
                running.append((u, proc, clock()))
                u.status = "running"
                report(f"[unit] seed {u.seed} {u.name}: started")
            if waiting and (now >= deadline or failed):
                for u in waiting:
                    u.status = "not started" + (" (a unit failed)" if failed else " (the deadline)")
                waiting = []
            if running:
                on_poll()
                time.sleep(poll)
    finally:  # the pool itself stopped (Ctrl-C, SIGTERM): nothing it started runs on
        for _, proc, _ in running:
            kill_group(proc)
    return units


def log_of(logs: Path, u: UnitRun) -> Path:
    return logs / f"{u.name}-seed{u.seed}.log"


def gpu_memory() -> dict[str, Any]:
    """The GPU's name and memory (MiB) as nvidia-smi reports it now; {} without one."""
    try:
        line = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.used,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout.splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return {}
    name, used, total = (x.strip() for x in line.split(","))
    return {"name": name, "used_mib": int(used), "total_mib": int(total)}


def pack(units: list[UnitRun], work: Path, out: Path, records: Path, summary: dict[str, Any]) -> None:
    """out/teachers.json (the summary, every unit's status and log tail) and out/teachers.tar.gz (rows.jsonl: the
    finished units' rows; records/: their distillation datasets as the CPU runner keeps them)."""
    out.mkdir(parents=True, exist_ok=True)
    rows = [json.loads((work / f"unit-{u.name}-seed{u.seed}.json").read_text()) for u in units if u.status == "done"]
    with tarfile.open(out / "teachers.tar.gz", "w:gz") as tar:
        data = "".join(json.dumps(r) + "\n" for r in rows).encode()
        info = tarfile.TarInfo("rows.jsonl")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
        for r in rows:
            tar.add(records / r["dataset"], arcname=f"records/{r['dataset']}")
    summary = summary | {"units": [asdict(u) for u in units], "rows": len(rows)}
    (out / "teachers.json").write_text(json.dumps(summary, indent=1) + "\n")


def device_run(args: argparse.Namespace) -> int:
    import teaching_comparison as tc

    s = tc.QUICK if args.quick else tc.Settings()
    settings = "quick" if args.quick else "protocol"
    work, out = Path(args.work), Path(args.out)
    work.mkdir(parents=True, exist_ok=True)
    seeds = missing_seeds(args.seeds, Path(args.units) if args.units else tc.UNITS_FILE, settings)
    started = time.time()
    deadline = started + 60 * args.minutes
    print(f"teacher seeds without a teacher row: {seeds}; {args.parallel} units at a time, {args.minutes} min")
    # The model once, before the units start (the SmolLM2 conversion is the longest part of loading it).
    from rlt.data.models import resolve_model_path

    env = own_code_env() | {"OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // args.parallel))}
    resolve_model_path(s.model)
    prepared = round(time.time() - started, 1)

    def command(u: UnitRun) -> list[str]:
        cmd = [sys.executable, "-u", str(SCRIPT), "--out", str(work), "--units", str(work / "units.jsonl")]
        cmd += ["--unit", u.name, "--seed", str(u.seed), "--no-plots"]  # the box has no matplotlib
        return cmd + (["--quick"] if args.quick else [])

    peak: dict[str, Any] = {}
    looked = [0.0]

    def look() -> dict[str, Any]:  # the GPU's memory, its peak kept (every 10 s while units run)
        looked[0] = time.time()
        mem = gpu_memory()
        if mem.get("used_mib", -1) > peak.get("used_mib", -1):
            peak.update(mem)
        return mem

    def report(line: str) -> None:
        mem = look()
        print(f"{time.time() - started:6.0f} s  {line}" + (f"  (GPU {mem['used_mib']} MiB used)" if mem else ""))

    def on_poll() -> None:
        if time.time() - looked[0] > 10:
            look()

    units = run_pool(
        schedule(seeds), command, args.parallel, deadline, work / "logs", env, report=report, on_poll=on_poll
    )
    summary = {
        "settings": settings,
        "seeds": seeds,
        "parallel": args.parallel,
        "minutes": args.minutes,
        "model_prepared_s": prepared,
        "wall_s": round(time.time() - started, 1),
        "gpu": peak or gpu_memory(),
        "code_fingerprint": tree_fingerprint(ROOT),
    }
    pack(units, work, out, tc.records_dir(s, work), summary)
    done = sum(u.status == "done" for u in units)
    print(f"{done} of {len(units)} teacher units done; {out / 'teachers.json'}, {out / 'teachers.tar.gz'}")
    return 1 if any(u.status == "failed" for u in units) else 0


# ---- here: the rows that came back, into the units file


def import_rows(
    tarball: Path, units_path: Path, records: Path, code: str, repo: Path, settings: str, commit: bool
) -> list[dict[str, Any]]:
    """Append the complete seeds' teacher rows of a device run's teachers.tar.gz to `units_path` (each with `code`,
    its dataset put in `records` and checked against the sha256 its row names), committing each with --commit.
    Refused, naming the unit: a row of other settings, a dataset that is not the one its row names, a unit already
    in the units file, code that is not `code`'s."""
    summary_file = tarball.with_name("teachers.json")
    if summary_file.exists():
        ran = json.loads(summary_file.read_text()).get("code_fingerprint")
        if ran != commit_fingerprint(repo, code):
            raise SystemExit(
                f"{summary_file}: the device ran Python files under {', '.join(CODE_DIRS)} that are not commit "
                f"{code}'s: name the commit it ran with --code"
            )
    else:
        raise SystemExit(f"{summary_file}: missing (it names the code the device ran); import both files together")
    with tarfile.open(tarball) as tar:
        member = tar.extractfile("rows.jsonl")
        if member is None:
            raise SystemExit(f"{tarball}: no rows.jsonl")
        rows = [json.loads(line) for line in member.read().decode().splitlines() if line.strip()]
        datasets = {
            m.name.removeprefix("records/"): f.read()
            for m in tar.getmembers()
            if m.name.startswith("records/") and (f := tar.extractfile(m)) is not None
        }
    have = {(r["unit"], r["seed"]) for r in read_rows(units_path)}
    by_seed: dict[int, dict[str, dict[str, Any]]] = {}
    for r in rows:
        by_seed.setdefault(r["seed"], {})[r["unit"]] = r
    imported: list[dict[str, Any]] = []
    for seed in sorted(by_seed):
        units = by_seed[seed]
        wanted = [unit_name(a) for a in PRIMARY_TEACHERS]
        if sorted(units) != sorted(wanted):
            print(f"teacher seed {seed}: not imported, only {', '.join(sorted(units))} finished on the device")
            continue
        for name in wanted:
            row = units[name]
            label = f"teacher unit {name} of teacher seed {seed}"
            if row.get("settings") != settings:
                raise SystemExit(f"{label}: a {row.get('settings')} row, this import is {settings}")
            if (name, seed) in have:
                raise SystemExit(f"{label} already has a row in {units_path}: a unit is never replaced")
            packed = datasets.get(row["dataset"])
            if packed is None or hashlib.sha256(gzip.decompress(packed)).hexdigest() != row["dataset_sha256"]:
                raise SystemExit(f"{label}: {row['dataset']} is missing or not the dataset its row names (sha256)")
            target = records / row["dataset"]
            if target.exists() and target.read_bytes() != packed:
                raise SystemExit(f"{label}: {target} exists with other explanations; it is never replaced")
        for name in wanted:
            row = units[name] | {"code": code}
            records.mkdir(parents=True, exist_ok=True)
            (records / row["dataset"]).write_bytes(datasets[row["dataset"]])
            append_row(units_path, row)
            if commit:
                message = f"teaching comparison: unit {name} of teacher seed {seed} (device {row['device']})"
                commit_rows(units_path, message, also=[records / row["dataset"]])
            imported.append(row)
            print(f"[import] seed {seed} {name}: {row['device']}, {row['seconds']:.0f} s, code {code[:10]}")
    return imported


def seed_list(value: str) -> list[int]:
    """ "2-15", "2,3,5" or both."""
    seeds: list[int] = []
    for part in value.split(","):
        lo, _, hi = part.partition("-")
        seeds += list(range(int(lo), int(hi or lo) + 1))
    return seeds


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--out", help="the device: where teachers.json and teachers.tar.gz go ($OUT)")
    p.add_argument("--work", default="/tmp/rlt-teachers", help="the device: the units' run folders (stay on the box)")
    p.add_argument("--seeds", type=seed_list, default=seed_list("1-15"), help="teacher seeds, e.g. 2-15")
    p.add_argument("--parallel", type=int, default=8, help="teacher units at a time on the GPU")
    p.add_argument("--minutes", type=float, default=7.0, help="the device: what still runs then is killed")
    p.add_argument("--quick", action="store_true", help="the tiny model and sizes (the rehearsal)")
    p.add_argument("--units", help="the units file (default: the committed one; --quick: required)")
    p.add_argument("--import", dest="tarball", type=Path, help="here: append a device run's rows (teachers.tar.gz)")
    p.add_argument("--code", default="HEAD", help="with --import: the commit the device ran (default HEAD)")
    p.add_argument("--records", type=Path, help="with --import: where the datasets go (default the runner's)")
    p.add_argument("--commit", action="store_true", help="with --import: commit each row and its dataset")
    args = p.parse_args(argv)
    if args.quick and not args.units:
        raise SystemExit("--quick: give --units (the quick rows never go to the committed file)")
    if args.tarball:
        import teaching_comparison as tc

        if args.commit and args.quick:
            raise SystemExit("--commit: only the protocol's rows are committed")
        units = Path(args.units) if args.units else tc.UNITS_FILE
        records = args.records or (Path(args.units).parent / "records" if args.quick else tc.RECORDS)
        code = git(ROOT, "rev-parse", "--verify", f"{args.code}^{{commit}}")
        settings = "quick" if args.quick else "protocol"
        import_rows(args.tarball, units, records, code, ROOT, settings, args.commit)
        return 0
    if not args.out:
        raise SystemExit("give --out (on the device) or --import FILE (here)")
    return device_run(args)


if __name__ == "__main__":
    sys.exit(main())
