"""benchmarks/gpu_teachers.py (issue 52): the teaching comparison's teacher units on a lent GPU. The code's
fingerprint (the box has no git) against a real git repository's commit, the pool of unit processes (real
processes: at most `parallel` at once, killed at the deadline, no new unit after a failure), and the import of what
came back (complete seeds only, each dataset checked, a unit never replaced, each row committed with its dataset).
The device run itself, on the tiny model, is the CPU rehearsal (hack/pilot_rehearsal.sh BOX teachers)."""

import gzip
import hashlib
import io
import json
import runpy
import subprocess
import sys
import tarfile

import pytest
from suite_helpers import ROOT


@pytest.fixture(scope="module")
def gt():
    return runpy.run_path(str(ROOT / "benchmarks" / "gpu_teachers.py"), run_name="not_main")


def git(repo, *args):
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path):
    """A git repository with Python files under training/ and benchmarks/ and one file that is not Python."""
    r = tmp_path / "repo"
    (r / "training" / "rlt").mkdir(parents=True)
    (r / "benchmarks").mkdir()
    (r / "training" / "rlt" / "stage.py").write_text("STEPS = 60\n")
    (r / "benchmarks" / "runner.py").write_text("print('unit')\n")
    (r / "benchmarks" / "rows.jsonl").write_text("")
    git(r, "init", "-q")
    git(r, "-c", "user.name=t", "-c", "user.email=t@t", "add", ".")
    git(r, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "code")
    return r


def test_the_trees_fingerprint_is_its_commits_and_any_python_edit_changes_it(gt, repo):
    head = git(repo, "rev-parse", "HEAD")
    assert gt["tree_fingerprint"](repo) == gt["commit_fingerprint"](repo, head)
    (repo / "benchmarks" / "rows.jsonl").write_text('{"a": 1}\n')  # data, not code: the same
    assert gt["tree_fingerprint"](repo) == gt["commit_fingerprint"](repo, head)
    (repo / "training" / "rlt" / "stage.py").write_text("STEPS = 61\n")
    assert gt["tree_fingerprint"](repo) != gt["commit_fingerprint"](repo, head)
    (repo / "training" / "rlt" / "stage.py").write_text("STEPS = 60\n")
    (repo / "training" / "rlt" / "extra.py").write_text("")  # a file the commit lacks
    assert gt["tree_fingerprint"](repo) != gt["commit_fingerprint"](repo, head)


def stand_in(tmp_path, seconds):
    """A unit's command: a real process that notes its start, sleeps, notes its end (a stand-in for a teacher
    unit, named so: what is tested is the pool around it)."""

    def command(u):
        marks = tmp_path / f"{u.name}-{u.seed}"
        code = (
            "import sys, time, pathlib; m = sys.argv[1]; pathlib.Path(m + '.start').write_text('');"
            f" time.sleep({seconds[u.name, u.seed]}); pathlib.Path(m + '.end').write_text('');"
            f" sys.exit({3 if seconds[u.name, u.seed] < 0 else 0})"
        )
        return [sys.executable, "-c", code.replace("time.sleep(-1)", "time.sleep(0)"), str(marks)]

    return command


def test_the_pool_runs_at_most_parallel_units_and_kills_the_rest_at_the_deadline(gt, tmp_path):
    units = gt["schedule"]([2, 3])
    assert [(u.name, u.seed) for u in units] == [
        ("rl.teacher", 2),
        ("sft-continued.teacher", 2),
        ("rl.teacher", 3),
        ("sft-continued.teacher", 3),
    ]
    seconds = {("rl.teacher", 2): 0.2, ("sft-continued.teacher", 2): 0.2, ("rl.teacher", 3): 120}
    seconds["sft-continued.teacher", 3] = 0.2
    short = {key for key, t in seconds.items() if t < 1}
    running_counts = []

    def clock():
        """The deadline (100) comes once the pool has seen every short unit done. Not on their end files: a CI run
        on a busy machine saw the file of a unit whose process had not yet exited, and the pool killed it."""
        return 1000.0 if all(u.status == "done" for u in units if (u.name, u.seed) in short) else 0.0

    def on_poll():
        running_counts.append(sum(u.status == "running" for u in units))

    gt["run_pool"](
        units, stand_in(tmp_path, seconds), 2, 100.0, tmp_path / "logs", clock=clock, on_poll=on_poll, poll=0.05
    )
    status = {(u.name, u.seed): u.status for u in units}
    assert status == {
        ("rl.teacher", 2): "done",
        ("sft-continued.teacher", 2): "done",
        ("rl.teacher", 3): "stopped at the deadline",
        ("sft-continued.teacher", 3): "done",
    }
    assert max(running_counts) == 2  # two at once, never three
    assert (tmp_path / "rl.teacher-3.start").exists() and not (tmp_path / "rl.teacher-3.end").exists()
    assert (tmp_path / "logs" / "rl.teacher-seed3.log").exists()


def test_after_a_failed_unit_the_pool_starts_no_other(gt, tmp_path):
    units = gt["schedule"]([2])
    seconds = {("rl.teacher", 2): -1, ("sft-continued.teacher", 2): 0.1}  # -1: exits 3 at once
    gt["run_pool"](units, stand_in(tmp_path, seconds), 1, 1e12, tmp_path / "logs", poll=0.05)
    assert [(u.status, u.exit) for u in units] == [("failed", 3), ("not started (a unit failed)", None)]


def teacher_row(arm, seed, explanations, settings="quick"):
    data = "".join(json.dumps(e) + "\n" for e in explanations).encode()
    return {
        "kind": "teacher",
        "unit": f"{arm}.teacher",
        "arm": arm,
        "seed": seed,
        "dataset": f"{arm}-seed{seed}.jsonl.gz",
        "dataset_sha256": hashlib.sha256(data).hexdigest(),
        "settings": settings,
        "device": "NVIDIA H200",
        "seconds": 300.0,
    }, gzip.compress(data, mtime=0)


def device_files(out, fingerprint, rows, datasets):
    """teachers.tar.gz and teachers.json as the device packs them."""
    out.mkdir(parents=True, exist_ok=True)
    with tarfile.open(out / "teachers.tar.gz", "w:gz") as tar:
        for name, data in [("rows.jsonl", "".join(json.dumps(r) + "\n" for r in rows).encode()), *datasets.items()]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    (out / "teachers.json").write_text(json.dumps({"code_fingerprint": fingerprint}))
    return out / "teachers.tar.gz"


def test_the_import_takes_complete_seeds_checks_datasets_commits_and_never_replaces(gt, repo, tmp_path):
    head = git(repo, "rev-parse", "HEAD")
    fp = gt["tree_fingerprint"](repo)
    rows, datasets = [], {}
    for arm, seed in (("rl", 2), ("sft-continued", 2), ("rl", 3)):  # seed 3's sft-continued did not finish
        row, data = teacher_row(arm, seed, [{"question": f"q{seed}", "reasoning_trace": arm}])
        rows.append(row)
        datasets[f"records/{row['dataset']}"] = data
    tarball = device_files(tmp_path / "back", fp, rows, datasets)
    units, records = repo / "benchmarks" / "rows.jsonl", repo / "benchmarks" / "records"
    before = int(git(repo, "rev-list", "--count", "HEAD"))

    imported = gt["import_rows"](tarball, units, records, head, repo, "quick", True)

    assert [(r["unit"], r["seed"], r["code"]) for r in imported] == [
        ("rl.teacher", 2, head),
        ("sft-continued.teacher", 2, head),
    ]
    kept = [json.loads(line) for line in units.read_text().splitlines()]
    assert [(r["unit"], r["seed"]) for r in kept] == [("rl.teacher", 2), ("sft-continued.teacher", 2)]
    for r in kept:  # each dataset in place, the bytes its row's sha256 names
        assert hashlib.sha256(gzip.decompress((records / r["dataset"]).read_bytes())).hexdigest() == r["dataset_sha256"]
    assert not (records / "rl-seed3.jsonl.gz").exists()
    assert int(git(repo, "rev-list", "--count", "HEAD")) == before + 2  # one commit per row, its dataset in it
    assert git(repo, "show", "--name-only", "--format=", "HEAD").splitlines() == [
        "benchmarks/records/sft-continued-seed2.jsonl.gz",
        "benchmarks/rows.jsonl",
    ]

    with pytest.raises(SystemExit, match="rl.teacher of teacher seed 2 already has a row.*never replaced"):
        gt["import_rows"](tarball, units, records, head, repo, "quick", False)


def test_the_import_refuses_a_changed_dataset_other_settings_and_other_code(gt, repo, tmp_path):
    head = git(repo, "rev-parse", "HEAD")
    fp = gt["tree_fingerprint"](repo)
    units, records = tmp_path / "units.jsonl", tmp_path / "records"
    rl, rl_data = teacher_row("rl", 4, [{"question": "q"}])
    sft, sft_data = teacher_row("sft-continued", 4, [{"question": "q"}])
    tampered = gzip.compress(b'{"question": "other"}\n')
    back = device_files(
        tmp_path / "a", fp, [rl, sft], {f"records/{rl['dataset']}": rl_data, f"records/{sft['dataset']}": tampered}
    )
    with pytest.raises(SystemExit, match="sft-continued.teacher of teacher seed 4: sft-continued-seed4.jsonl.gz is"):
        gt["import_rows"](back, units, records, head, repo, "quick", False)
    assert not units.exists() and not records.exists()  # refused before anything is written

    back = device_files(
        tmp_path / "b", fp, [rl, sft], {f"records/{rl['dataset']}": rl_data, f"records/{sft['dataset']}": sft_data}
    )
    with pytest.raises(SystemExit, match="rl.teacher of teacher seed 4: a quick row, this import is protocol"):
        gt["import_rows"](back, units, records, head, repo, "protocol", False)

    (repo / "training" / "rlt" / "stage.py").write_text("STEPS = 61\n")  # the device ran code the commit lacks
    back = device_files(tmp_path / "c", gt["tree_fingerprint"](repo), [rl, sft], {})
    with pytest.raises(SystemExit, match="not commit .*: name the commit it ran with --code"):
        gt["import_rows"](back, units, records, head, repo, "quick", False)


def test_a_teacher_unit_on_a_gpu_trains_in_float32_as_on_cpu(tmp_path):
    """run_spec(fp32=True), what teacher_unit asks for on a GPU: the weights and both teacher stages in float32,
    where rlt's auto would be bf16 on a GPU; on CPU the pin resolves as auto does (the CPU units are unchanged)."""
    import torch

    from rlt.data.models import torch_dtype
    from rlt.spec.loading import parse_run
    from rlt.stages.trainer import trainer_precision

    tc = runpy.run_path(str(ROOT / "benchmarks" / "teaching_comparison.py"), run_name="not_main")
    s = tc["Settings"]()
    auto = parse_run(tc["run_spec"](s, "rl", 2, str(tmp_path / "h.jsonl"), part="teacher")).spec
    pinned = parse_run(tc["run_spec"](s, "rl", 2, str(tmp_path / "h.jsonl"), part="teacher", fp32=True)).spec
    assert torch_dtype(auto.teacher, "cuda") == torch.bfloat16 and torch_dtype(pinned.teacher, "cuda") == torch.float32
    assert torch_dtype(pinned.student, "cuda") == torch.float32  # the reward's student
    assert torch_dtype(auto.teacher, "cpu") == torch_dtype(pinned.teacher, "cpu") == torch.float32
    for stage in ("sft", "rl"):
        a, p = getattr(auto.stages, stage), getattr(pinned.stages, stage)
        assert trainer_precision("cuda", p.precision)["bf16"] is False
        assert trainer_precision("cuda", a.precision)["bf16"] is True
        assert trainer_precision("cpu", p.precision) == trainer_precision("cpu", a.precision)


@pytest.mark.slow
def test_the_device_run_brings_back_each_finished_teachers_row_and_dataset(gt, tmp_path):
    """The device half on CPU with the tiny model (--quick): seed 2's two real teacher units side by side, then
    teachers.json (both done, the code's fingerprint) and teachers.tar.gz (their rows, each dataset the bytes its
    row's sha256 names) — what the import reads."""
    out = tmp_path / "out"
    argv = ["--out", str(out), "--work", str(tmp_path / "work"), "--quick", "--units", str(tmp_path / "none.jsonl")]
    assert gt["main"](argv + ["--seeds", "2", "--parallel", "2", "--minutes", "20"]) == 0
    summary = json.loads((out / "teachers.json").read_text())
    assert [(u["name"], u["seed"], u["status"]) for u in summary["units"]] == [
        ("rl.teacher", 2, "done"),
        ("sft-continued.teacher", 2, "done"),
    ]
    assert summary["code_fingerprint"] == gt["tree_fingerprint"](ROOT) and summary["rows"] == 2
    with tarfile.open(out / "teachers.tar.gz") as tar:
        rows = [json.loads(line) for line in tar.extractfile("rows.jsonl").read().decode().splitlines()]
        assert [(r["unit"], r["settings"], r["device"]) for r in rows] == [
            ("rl.teacher", "quick", "cpu"),
            ("sft-continued.teacher", "quick", "cpu"),
        ]
        for r in rows:
            data = gzip.decompress(tar.extractfile(f"records/{r['dataset']}").read())
            assert hashlib.sha256(data).hexdigest() == r["dataset_sha256"] and len(data.splitlines()) == 16
