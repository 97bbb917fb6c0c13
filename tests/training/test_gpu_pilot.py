"""benchmarks/gpu_pilot.py (issue 46): the re-gated report (paired real − shuffled and real − start at the training
τ, seed-level t intervals, secondary health gates) and what comes back from the box (≤ 8 files, ≤ 2 folders deep).
Built on per-seed result files written the way the workers write them; no model runs."""

import json
import runpy
import tarfile

import pytest
from suite_helpers import ROOT


@pytest.fixture(scope="module")
def pilot():
    return runpy.run_path(str(ROOT / "benchmarks" / "gpu_pilot.py"), run_name="not_main")


def write_run(work, real: list[float], shuffled: list[float], start: float = 0.0, cap_hits: float = 0.1):
    """Per-seed JSON as the workers write it: each held-out question scores the arm's objective."""
    work.mkdir(parents=True, exist_ok=True)

    def measures(v: float) -> dict:
        return {
            f"tau{t:g}": {
                "reward": [v, v],
                "solution_logprob": [v, v],
                "kl_teacher_logprob": [0, 0],
                "kl_student_ce": [0, 0],
            }
            for t in (1.0, 0.7)
        }

    (work / "start.json").write_text(json.dumps({"measures": measures(start)}))
    (work / "explanations-start.jsonl").write_text(json.dumps({"arm": "start", "seed": 0}) + "\n")
    for seed, (r, s) in enumerate(zip(real, shuffled, strict=True), 1):
        d = work / f"seed{seed}"
        d.mkdir()
        with (d / "steps.jsonl").open("w") as f:
            for arm, v in (("real", r), ("shuffled", s)):
                (d / f"{arm}.json").write_text(json.dumps({"arm": arm, "seed": seed, "measures": measures(v)}))
                (d / f"explanations-{arm}.jsonl").write_text(json.dumps({"arm": arm, "seed": seed}) + "\n")
                for step in (1, 2, 3):
                    row = dict(seed=seed, arm=arm, step=step, reward=v * step, zero_std_groups=0.1, cap_hits=cap_hits)
                    row.update(entropy=1.0, grad_norm=1.0, kl_teacher_logprob=-1.0)
                    f.write(json.dumps(row) + "\n")


def test_pass_needs_both_lower_bounds_above_zero(pilot, tmp_path):
    write_run(tmp_path, real=[1.0, 1.2, 0.9, 1.1], shuffled=[0.1, 0.0, 0.2, 0.1])
    res = pilot["report"](pilot["PILOT"], tmp_path, 0.0)
    d, lo, hi = res["tau1"]["real_vs_shuffled"]
    assert d == pytest.approx(0.95) and lo > 0
    assert res["gates"]["primary"] == "PASS"
    assert "weights_changed" not in res["gates"]  # a gate that cannot fail is gone


def test_fail_when_the_upper_bound_is_below_the_margin(pilot, tmp_path):
    write_run(tmp_path, real=[0.1, 0.0, 0.2, 0.1], shuffled=[0.1, 0.1, 0.1, 0.1])
    res = pilot["report"](pilot["PILOT"], tmp_path, 0.0)
    assert res["tau1"]["real_vs_shuffled"][2] < pilot["MARGIN"]
    assert res["gates"]["primary"] == "FAIL"


def test_inconclusive_between_and_health_gates_can_fail(pilot, tmp_path):
    # real beats shuffled by a wide, uncertain margin, but not the start: neither PASS nor FAIL
    write_run(tmp_path, real=[3.0, 0.0, 2.5, 0.2], shuffled=[0.0, 0.1, 0.0, 0.1], start=2.0, cap_hits=0.9)
    res = pilot["report"](pilot["PILOT"], tmp_path, 0.0)
    assert res["gates"]["primary"] == "inconclusive"
    assert res["gates"]["cap_hits_under_half"] is False


def test_what_comes_back_fits_the_device_limits(pilot, tmp_path):
    work, out = tmp_path / "work", tmp_path / "out"
    write_run(work, real=[1.0, 1.1], shuffled=[0.0, 0.1])
    pilot["report"](pilot["PILOT"], work, 0.0)
    pilot["pack"](work, out)
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert files == ["explanations.jsonl", "pilot.json", "results.tar.gz", "steps.jsonl"]
    arms = [json.loads(x)["arm"] for x in (out / "explanations.jsonl").read_text().splitlines()]
    assert sorted(arms) == ["real", "real", "shuffled", "shuffled", "start"]  # every teacher, the start too
    assert len((out / "steps.jsonl").read_text().splitlines()) == 2 * 2 * 3
    with tarfile.open(out / "results.tar.gz") as tar:
        names = tar.getnames()
    assert "seed1/real.json" in names and not any(n.endswith(".safetensors") for n in names)


def test_the_gpu_checks_constants_read_the_plans_current_names():
    """gpu_check.json sets each measured figure beside the plan's constant; on the first GPU run the plan had renamed
    its write rate and the whole block came back as an AttributeError. It must read every constant it names."""
    check = runpy.run_path(str(ROOT / "benchmarks" / "gpu_check.py"), run_name="gpu_check")
    out = check["constants"]({"peak": {"bf16_matmul_flops": 8e14}, "throughput": {"train_flops_per_s": 2e14}})
    assert "error" not in out["plan"], out["plan"]
    assert set(out["plan"]) == {"PEAK_FLOPS", "UTILISATION", "DECODE_TOKENS_PER_S", "WRITE_BYTES_PER_S"}
    assert out["measured"]["UTILISATION against the measured peak"] == 0.25
