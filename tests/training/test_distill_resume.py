"""Distillation survives a lost rank and a bad HTTP answer: each rank's finished batches are on the volume, a
restart does only the missing rows (every row exactly once in the dataset), and a 500 from the server is retried.

Real processes: the operator's rendered 2-process distill command (`rlt launch` → torchrun → 2 `rlt stage distill`
ranks, which share no process group), one rank SIGKILLed half-way."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from suite_helpers import EXAMPLES, ROOT, kill_gang, tiny_doc

from rlt.checks.validation import validate_spec
from rlt.contract.layout import RunLayout
from rlt.method import generation
from rlt.spec.fingerprint import stage_fingerprint
from rlt.spec.loading import parse_run
from rlt.stages.distill_parts import parts_dir
from rlt_operator import builders

ROWS = 16


def distill_spec():
    doc = tiny_doc()
    doc["metadata"]["name"] = "dres"
    st = doc["spec"]["stages"]
    st["sft"] = {"enabled": False}
    st["rl"]["enabled"] = False
    st["distill"].update(limit=ROWS, batchSize=1, samplesPerQuestion=2, maxNewTokens=8)
    doc["spec"]["dataset"]["size"] = 32
    doc["spec"]["resources"] = {"trainer": {"gpus": 2}}
    return validate_spec(doc["spec"], name="dres")


def start(tmp_path: Path, log: Path) -> subprocess.Popen:
    job = builders.trainer_job(builders.RunRef("dres", "default", "u"), distill_spec(), "distill", 0)
    container = job["spec"]["template"]["spec"]["containers"][0]
    cmd = [a.replace(builders.PVC_MOUNT, str(tmp_path / "pvc")) for a in container["command"]]
    assert cmd[:4] == ["rlt", "launch", "--", "torchrun"], cmd
    cmd[0] = str(Path(sys.executable).parent / "rlt")
    literal = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    env = {
        **os.environ,
        "RLT_RUN_YAML": literal["RLT_RUN_YAML"],  # the gang's spec, as the pod gets it
        "PYTHONPATH": f"{ROOT / 'training'}:{ROOT / 'operator'}",
        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": "1",
        "CUDA_VISIBLE_DEVICES": "",
        "RLT_METRICS_PORT": "-1",
    }
    return subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env, start_new_session=True)


def indices(path: Path) -> list[int]:
    if not path.exists():
        return []
    return [json.loads(line)["index"] for line in path.read_text().splitlines() if line.endswith("}")]


@pytest.mark.slow
def test_a_distill_rank_killed_half_way_resumes_with_every_row_exactly_once(tmp_path):
    layout = RunLayout.for_run(tmp_path / "pvc", "dres")
    folder = parts_dir(layout.stage_dir("distill"), stage_fingerprint(distill_spec(), "distill"))
    log1 = tmp_path / "attempt1.log"
    proc = start(tmp_path, log1)
    deadline = time.monotonic() + 600
    while len(indices(folder / "rank-1.jsonl")) < 2:
        assert proc.poll() is None, log1.read_text()[-4000:]
        if time.monotonic() > deadline:
            kill_gang(proc, log1)
            raise AssertionError(log1.read_text()[-4000:])
        time.sleep(0.05)
    pids = dict(re.findall(r"rlt-world stage=distill rank=(\d+) .* pid=(\d+)", log1.read_text()))
    os.kill(int(pids["1"]), signal.SIGKILL)  # a lost rank: no chance to save anything
    assert proc.wait(timeout=120) != 0
    text1 = log1.read_text()
    kept = set(indices(folder / "rank-0.jsonl")) | set(indices(folder / "rank-1.jsonl"))
    said_written = {
        int(i) for rows in re.findall(r"rlt-distill-written rank=\d rows=(\S+)", text1) for i in rows.split(",")
    }
    assert said_written <= kept, "a batch reported written was lost"
    assert 0 < len(kept) < ROWS, kept
    # work lost: the batch each rank had in progress at most (batchSize 1 → ≤ 1 row per rank)
    assert not (layout.distill_dataset.exists())

    log2 = tmp_path / "attempt2.log"
    proc = start(tmp_path, log2)
    try:
        assert proc.wait(timeout=600) == 0, log2.read_text()[-4000:]
    except subprocess.TimeoutExpired:
        kill_gang(proc, log2)
        raise
    text2 = log2.read_text()
    shares = {
        int(r): {int(i) for i in rows.split(",") if i}
        for r, rows in re.findall(r"rlt-shard stage=distill rank=(\d) rows=(\S*)", text2)
    }
    redone = shares[0] | shares[1]
    assert redone == set(range(ROWS)) - kept, (redone, kept)  # resumed by row index: nothing done twice
    rows = [json.loads(line) for line in layout.distill_dataset.read_text().splitlines()]
    assert len(rows) == ROWS
    src = [r["source_row"] for r in rows]
    assert src == sorted(src) and len(set(src)) == ROWS, "every row exactly once, in dataset order"
    assert layout.stage_done("distill").exists()
    print(
        f"\nrank 1 killed after {len(kept)}/{ROWS} rows were written: resumed with {len(redone)} rows; "
        f"rows generated twice: 0; lost work: the batch in progress (≤ 1 row per rank)"
    )


class FlakyVllmStub(BaseHTTPRequestHandler):
    """A HAND-WRITTEN STAND-IN for a vLLM server (last resort: the real one needs minutes to start): /v1/models and
    /v1/completions in vLLM's shape, answering 500 to the first `fail` completion requests."""

    fail = 1
    posts = 0
    delay = 0.0  # seconds each completion request takes (a long generation)

    def log_message(self, *args):
        pass

    def _send(self, code: int, doc: dict) -> None:
        data = json.dumps(doc).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self._send(200, {"data": [{"id": "teacher"}]})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).posts += 1
        time.sleep(type(self).delay)
        if type(self).posts <= type(self).fail:
            self._send(500, {"error": "injected"})
            return
        choices = [
            {"token_ids": [7, 8], "logprobs": {"token_logprobs": [-0.5, -0.25]}}
            for _ in body["prompt"]
            for _ in range(body["n"])
        ]
        self._send(200, {"choices": choices})


@pytest.fixture
def stub():
    server = ThreadingHTTPServer(("127.0.0.1", 0), FlakyVllmStub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    FlakyVllmStub.posts, FlakyVllmStub.delay = 0, 0.0
    yield server, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_an_http_500_is_retried_and_a_lasting_one_is_a_clear_error(stub, monkeypatch):
    monkeypatch.setattr(generation, "HTTP_BACKOFF", 0.01)
    server, url = stub
    FlakyVllmStub.fail = 1
    s = generation.server_generate(url, [[1, 2], [3]], n=2, temperature=1.0, top_p=1.0, max_new_tokens=2)
    assert FlakyVllmStub.posts == 2, "the batch is sent again after the 500"
    assert s.completion_ids == [[7, 8]] * 4 and s.prompt_ids == [[1, 2], [1, 2], [3], [3]]

    FlakyVllmStub.posts, FlakyVllmStub.fail = 0, 100
    with pytest.raises(RuntimeError, match=r"answered 500 \(after up to 6 attempts\)"):
        generation.server_generate(url, [[1]], n=1, temperature=1.0, top_p=1.0, max_new_tokens=2)
    assert FlakyVllmStub.posts == 6


def test_a_read_timeout_is_not_regenerated_from_scratch(stub, monkeypatch):
    """The request was sent and the server is generating: vLLM cancels a request whose client went away, so a
    retry after a read timeout starts the whole batch again (up to 6 times). A read timeout is one clear error
    after ONE request; the timeout itself comes from the rollout budget (rlt.spec.budgets.rollout_seconds)."""
    monkeypatch.setattr(generation, "HTTP_BACKOFF", 0.01)
    server, url = stub
    FlakyVllmStub.fail, FlakyVllmStub.delay = 0, 1.0
    with pytest.raises(RuntimeError, match="Read timed out"):
        generation.server_generate(url, [[1]], n=1, temperature=1.0, top_p=1.0, max_new_tokens=2, timeout=0.3)
    time.sleep(1.2)  # the stub's handler threads finish
    assert FlakyVllmStub.posts == 1, f"{FlakyVllmStub.posts} generation requests after a read timeout"


def test_distill_waits_as_long_as_the_rollout_budget(tmp_path):
    from rlt.spec.budgets import rollout_seconds
    from rlt.stages.distill import server_read_timeout

    spec = parse_run(yaml.safe_load((EXAMPLES / "rltrun-paper-7b.yaml").read_text())).spec
    assert server_read_timeout(spec) == rollout_seconds(spec, "distill") > 600  # 16k tokens: over the old 600 s


def test_rank_0_reads_each_written_row_once_while_it_waits(tmp_path, monkeypatch):
    """Rank 0 waits for slower ranks by polling their part files: each poll must parse only what was added, not
    every row again (at paper scale GBs every 2 s for hours)."""
    import json as json_module

    from rlt.stages import distill_parts
    from rlt.stages.distill_parts import append_rows, rank_file, wait_for_all

    parsed = {"n": 0}
    loads = json_module.loads

    def counting_loads(text, *a, **kw):
        parsed["n"] += 1
        return loads(text, *a, **kw)

    monkeypatch.setattr(distill_parts.json, "loads", counting_loads)
    folder = tmp_path / "parts"
    total, batches = 40, 5  # rank 1: 20 rows in 5 batches of 4
    append_rows(rank_file(folder, 0), [(i, {"q": i}) for i in range(0, total, 2)])

    def slow_rank_1():
        for b in range(batches):
            time.sleep(0.05)
            per = total // 2 // batches
            append_rows(
                rank_file(folder, 1), [(2 * (b * per + k) + 1, {"q": 2 * (b * per + k) + 1}) for k in range(per)]
            )

    writer = threading.Thread(target=slow_rank_1)
    writer.start()
    rows = wait_for_all(folder, total, poll=0.01)
    writer.join()
    assert rows == [{"q": i} for i in range(total)]
    assert parsed["n"] == total, f"{parsed['n']} lines parsed for {total} rows"
