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
from suite_helpers import EXAMPLES, ROOT, kill_gang, send_vllm_stream, tiny_doc

from rlt.checks.validation import validate_spec
from rlt.contract.layout import RunLayout
from rlt.method import generation
from rlt.spec.loading import parse_run
from rlt.stages.distill_parts import parts_folder
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
    folder = parts_folder(layout.stage_dir("distill"), distill_spec())
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
    """A HAND-WRITTEN STAND-IN for a vLLM server (last resort: the real one needs minutes to start and cannot be made
    to stall or cut a stream on cue): /v1/models and a streamed /v1/completions in vLLM's shape. It answers 500 to
    the first `fail` completion requests; on the first request it stops after `stall_after` finished sequences and
    holds the connection for `stall` seconds (a read timeout) or, with `cut`, closes it (a lost connection). Sample
    j of a prompt is [seed + j, first prompt token]: vLLM's seeding, so a sequence asked for again is the same."""

    protocol_version = "HTTP/1.1"  # a streamed answer is chunked

    fail = 1
    posts = 0
    gets = 0  # /v1/models requests
    delay = 0.0  # seconds each completion request takes (a long generation)
    slower: dict[int, float] = {}  # first prompt token -> seconds more (requests that finish out of order)
    seed_delay: dict[int, float] = {}  # request seed -> seconds more (one slow sequence)
    fail_after: int | None = None  # every completion request after this many answers 500 (a server gone bad)
    fold: int | None = None  # token ids folded into [10, 10 + fold): a real tokenizer decodes them
    stall_after: int | None = None
    stall = 0.0
    cut = False
    cut_all = False  # every request stops at stall_after, not only the first
    abort = False  # at stall_after the rest end as vLLM ends requests it aborts: finish_reason "abort", cut short
    refuse: int | None = None  # a request whose first prompt token is this is answered 400 (a bad request)
    asked: list[tuple[int, int | None]] = []  # (sequences, seed) of every completion request
    running = 0  # completion requests being answered now
    most_running = 0
    lock = threading.Lock()

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
        type(self).gets += 1
        self._send(200, {"data": [{"id": "teacher"}]})

    def do_POST(self):
        cls = type(self)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with cls.lock:
            cls.posts += 1
            first = cls.posts == cls.fail + 1
            cls.asked.append((len(body["prompt"]) * body["n"], body.get("seed")))
            cls.running += 1
            cls.most_running = max(cls.most_running, cls.running)
        ended = False

        def end() -> None:
            # counted as ended before the answer's last bytes go out: once the client reads them it may send its
            # next request, and a count still held then would see one more at the server than the client sent
            nonlocal ended
            if not ended:
                ended = True
                with cls.lock:
                    cls.running -= 1

        def then_end(events):
            yield from events
            end()

        try:
            time.sleep(cls.delay + cls.slower.get(body["prompt"][0][0], 0.0) + cls.seed_delay.get(body.get("seed"), 0))
            if body["prompt"][0][0] == cls.refuse:
                end()
                self._send(400, {"error": "injected bad request"})
                return
            if cls.posts <= cls.fail or (cls.fail_after is not None and cls.posts > cls.fail_after):
                end()
                self._send(500, {"error": "injected"})
                return
            stop = cls.stall_after if first or cls.cut_all else None
            send_vllm_stream(self, then_end(self.events(body, stop)))
        finally:
            end()

    def events(self, body: dict, stop: int | None):
        n, seed = body["n"], body.get("seed") or 0
        for i, prompt in enumerate(p for p in body["prompt"] for _ in range(n)):
            if stop is not None and i >= stop and type(self).abort:  # a server stopping with --shutdown-timeout 0
                yield {
                    "choices": [
                        {
                            "index": i,
                            "token_ids": [seed],
                            "logprobs": {"token_logprobs": [-0.5]},
                            "finish_reason": "abort",
                        }
                    ]
                }
                continue
            if stop is not None and i == stop:
                if not type(self).cut:
                    time.sleep(type(self).stall)  # the client's read timeout fires first
                raise ConnectionAbortedError  # the handler ends: the connection closes mid-stream
            first = seed + i % n if type(self).fold is None else 10 + (seed + i % n) % type(self).fold
            choice = {"index": i, "token_ids": [first, prompt[0]], "finish_reason": "length"}
            yield {"choices": [{**choice, "logprobs": {"token_logprobs": [-0.5, -0.25]}}]}


@pytest.fixture
def stub():
    FlakyVllmStub.posts, FlakyVllmStub.delay, FlakyVllmStub.asked = 0, 0.0, []
    FlakyVllmStub.stall_after, FlakyVllmStub.stall, FlakyVllmStub.cut = None, 0.0, False
    FlakyVllmStub.cut_all, FlakyVllmStub.slower, FlakyVllmStub.abort = False, {}, False
    FlakyVllmStub.seed_delay, FlakyVllmStub.fail_after, FlakyVllmStub.fold = {}, None, None
    FlakyVllmStub.running = FlakyVllmStub.most_running = 0
    FlakyVllmStub.refuse = None
    server = ThreadingHTTPServer(("127.0.0.1", 0), FlakyVllmStub)
    server.handle_error = lambda *a: None  # the injected cuts are not failures of the test
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    # a handler can outlive its test (a stall the client gave up on, a cut the client already retried): let it end,
    # or its late `running -= 1` lands in the next test's count
    deadline = time.monotonic() + 10
    while FlakyVllmStub.running and time.monotonic() < deadline:
        time.sleep(0.01)
    assert FlakyVllmStub.running == 0, f"{FlakyVllmStub.running} stand-in requests still being answered after 10 s"


def test_an_http_500_is_retried_and_a_lasting_one_is_a_clear_error(stub, monkeypatch):
    monkeypatch.setattr(generation, "HTTP_BACKOFF", 0.01)
    server, url = stub
    FlakyVllmStub.fail = 1
    s = generation.server_generate(url, [[1, 2], [3]], n=2, temperature=1.0, top_p=1.0, max_new_tokens=2)
    assert FlakyVllmStub.posts == 2, "the batch is sent again after the 500"
    assert s.completion_ids == [[0, 1], [1, 1], [0, 3], [1, 3]] and s.prompt_ids == [[1, 2], [1, 2], [3], [3]]

    FlakyVllmStub.posts, FlakyVllmStub.fail = 0, 100
    with pytest.raises(RuntimeError, match=r"answered 500 \(after up to 6 attempts\)"):
        generation.server_generate(url, [[1]], n=1, temperature=1.0, top_p=1.0, max_new_tokens=2)
    assert FlakyVllmStub.posts == 6


@pytest.mark.parametrize("cut", [False, True], ids=["read-timeout", "connection-lost"])
def test_a_cut_stream_asks_again_for_the_unfinished_sequences_only(stub, monkeypatch, cut):
    """vLLM cancels a request whose client went away: asking for the whole batch again would make every finished
    sequence again. After a read timeout or a lost connection mid-stream, only the unfinished sequences are asked
    for again, each with its own seed (n=1, seed + j), so the batch comes out as an uncut one."""
    monkeypatch.setattr(generation, "HTTP_BACKOFF", 0.01)
    server, url = stub
    FlakyVllmStub.fail = 0
    # a 2 s read timeout: the uncut call must never meet it on a loaded machine; the stall (5 s) always does
    args = dict(n=3, temperature=1.0, top_p=1.0, max_new_tokens=2, timeout=2.0, seed=100)
    whole = generation.server_generate(url, [[1, 2], [3], [4]], **args)
    assert FlakyVllmStub.asked == [(9, 100)]

    FlakyVllmStub.posts, FlakyVllmStub.asked = 0, []
    FlakyVllmStub.stall_after, FlakyVllmStub.stall, FlakyVllmStub.cut = 4, 5.0, cut
    again = generation.server_generate(url, [[1, 2], [3], [4]], **args)
    # 4 of 9 finished before the cut: the other 5 are prompt [3] sample 1, 2 and prompt [4] samples 0, 1, 2
    assert sorted(FlakyVllmStub.asked) == sorted([(9, 100), (1, 100), (2, 101), (2, 102)]), FlakyVllmStub.asked
    assert sum(k for k, _ in FlakyVllmStub.asked) == 9 + 5, "a finished sequence was generated again"
    assert again == whole


def test_sequences_the_server_aborted_are_asked_for_again_not_kept_cut(stub, monkeypatch):
    """vLLM ends the requests it aborts (a server stopping with --shutdown-timeout 0, a cancelled request) with
    finish_reason "abort" and the tokens so far (tests/training/test_vllm_drain.py: 2-3 of 480 on the real server).
    Such a sequence is not finished: it is asked for again like a cut one, and the batch equals an uncut one."""
    monkeypatch.setattr(generation, "HTTP_BACKOFF", 0.01)
    server, url = stub
    FlakyVllmStub.fail = 0
    args = dict(n=2, temperature=1.0, top_p=1.0, max_new_tokens=2, seed=7)
    whole = generation.server_generate(url, [[1, 2], [3]], **args)
    FlakyVllmStub.posts, FlakyVllmStub.asked = 0, []
    FlakyVllmStub.stall_after, FlakyVllmStub.abort = 1, True
    again = generation.server_generate(url, [[1, 2], [3]], **args)
    assert again == whole, "an aborted sequence was kept cut short"
    assert sorted(FlakyVllmStub.asked) == [(1, 7), (2, 8), (4, 7)], FlakyVllmStub.asked  # the 3 aborted, by seed


def test_a_stream_cut_every_time_is_a_clear_error(stub, monkeypatch):
    monkeypatch.setattr(generation, "HTTP_BACKOFF", 0.01)
    server, url = stub
    FlakyVllmStub.fail, FlakyVllmStub.stall_after, FlakyVllmStub.cut, FlakyVllmStub.cut_all = 0, 0, True, True
    with pytest.raises(RuntimeError, match=r"2 of 2 sequences unfinished after 6 cut streams"):
        generation.server_generate(url, [[1]], n=2, temperature=1.0, top_p=1.0, max_new_tokens=2, seed=0)


def test_the_rollout_client_process_answers_as_server_generate(stub):
    """rlt.stages.overlap.ClientProcess (a one-step-off rollout's HTTP client, in a spawned process of its own): a
    rollout's requests, sent together, give each the samples server_generate gives it in-process; the child's errors
    are raised in the parent with their message, and a dead child is a clear error, not a hang."""
    from rlt.stages.overlap import ClientProcess, Request

    server, url = stub
    FlakyVllmStub.fail = 0
    args = dict(temperature=1.0, top_p=1.0, max_new_tokens=2, timeout=30)
    here = [generation.server_generate(url, [p], n=2, seed=s, **args) for p, s in (([1, 2], 7), ([3], 8))]
    rollout = [Request([1, 2], 2, 7), Request([3], 2, 8)]
    client = ClientProcess()
    FlakyVllmStub.posts = 0
    assert client(url, rollout, **args) == here
    assert client.proc is not None and client.proc.pid != os.getpid() and FlakyVllmStub.posts == 2  # one per request
    with pytest.raises(RuntimeError, match=r"RuntimeError: vLLM server nowhere:"):
        client("nowhere:", rollout, **args)  # no scheme: requests refuses it at once, no retries
    assert client(url, rollout[1:], **args) == here[1:]  # still serving after the error
    client.proc.kill()
    client.proc.join(10)
    with pytest.raises(RuntimeError, match=r"client process ended \(exit code -9\)"):
        client(url, rollout, **args)
    assert client(url, rollout[1:], **args) == here[1:]  # a new child on the next call


def test_a_rollouts_requests_go_in_flight_at_most_and_one_failure_is_the_rollouts(stub):
    """rlt.stages.overlap.generate_all (a served rollout's requests, one per group): never more than `in_flight` at
    the server, the next sent as one ends, each request's samples those server_generate gives it alone; the served
    model's name asked once per process, not once per rollout, and forgotten when a rollout fails; a request the
    server refuses fails the rollout with the server's answer, the other requests cancelled."""
    from rlt.stages.overlap import SERVED_NAMES, Request, generate_all

    server, url = stub
    FlakyVllmStub.fail, FlakyVllmStub.delay = 0, 0.5
    args = dict(temperature=1.0, top_p=1.0, max_new_tokens=2, timeout=30)
    rollout = [Request([p, 1], 2, 100 + p) for p in range(6)]
    alone = [generation.server_generate(url, [r.prompt_ids], n=r.n, seed=r.seed, **args) for r in rollout]
    FlakyVllmStub.most_running, FlakyVllmStub.gets = 0, 0
    SERVED_NAMES.pop(url, None)
    assert generate_all(url, rollout, in_flight=2, **args) == alone
    assert FlakyVllmStub.most_running == 2
    FlakyVllmStub.most_running = 0
    assert generate_all(url, rollout, **args) == alone and FlakyVllmStub.most_running > 2  # None: all at once
    assert FlakyVllmStub.gets == 1 and SERVED_NAMES[url] == "teacher"  # two rollouts, one /v1/models
    FlakyVllmStub.refuse, FlakyVllmStub.slower = 3, {5: 2.0}
    with pytest.raises(RuntimeError, match=r"answered 400"):
        generate_all(url, rollout, in_flight=3, **args)
    assert url not in SERVED_NAMES  # a failed rollout forgets the name: a server serving another model is asked again


def stage_against(url: str, out: Path, rows: int = 12) -> Path:
    """The real distill stage (run_local, one rank, the tiny models scoring) against the server at `url`, with
    1 row per written batch and 2 samples per row; the dataset it wrote."""
    from rlt.run.runner import run_local
    from rlt.spec.run import RLTRun

    doc = tiny_doc()
    doc["metadata"]["name"] = "order"
    st = doc["spec"]["stages"]
    st["sft"]["enabled"] = st["rl"]["enabled"] = False
    st["rl"]["generation"] = {"mode": "server", "serverUrl": url}
    st["distill"].update(limit=rows, batchSize=1, samplesPerQuestion=2, maxNewTokens=8)
    run_local(RLTRun.model_validate(doc), out, metrics_port=None, show_progress=False, device="cpu")
    return RunLayout.for_run(out, "order").distill_dataset


def read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def same_rows(a: list[dict], b: list[dict]) -> bool:
    keys = ("source_row", "reasoning_trace", "reward", "candidate_rewards", "candidates")
    return [{k: r[k] for k in keys} for r in a] == [{k: r[k] for k in keys} for r in b]


def test_distill_keeps_every_slot_busy_and_merges_rows_completed_out_of_order_by_index(stub, tmp_path, monkeypatch):
    """One request per sequence, 4 in flight: row 0's first sample is 30× slower than the others, yet the other
    slots never wait for it (4 sequences in flight at nearly every instant while any is left to send, never 5); the
    rows are written in the order they complete (row 0 late), and the dataset is merged by index: the rows of a
    run where nothing was slow."""
    from rlt.stages import distill
    from rlt.stages.distill import sequence_seed

    server, url = stub
    FlakyVllmStub.fail, FlakyVllmStub.delay, FlakyVllmStub.fold = 0, 0.02, 400
    monkeypatch.setattr(distill, "sequences_in_flight", lambda spec, prompt: (4, "the test's"))
    reference = read_rows(stage_against(url, tmp_path / "even"))

    seed = parse_run(tiny_doc()).spec.seed
    FlakyVllmStub.seed_delay = {sequence_seed(seed, 0, 2, 0): 0.6}
    real, lock = distill.server_generate, threading.Lock()
    live = {"now": 0, "sent": 0}
    samples: list[int] = []

    def counted(url, prompt_ids, **kw):
        with lock:
            live["now"] += len(prompt_ids) * kw["n"]
            live["sent"] += len(prompt_ids) * kw["n"]
        try:
            return real(url, prompt_ids, **kw)
        finally:
            with lock:
                live["now"] -= len(prompt_ids) * kw["n"]

    def sample() -> None:
        while live["sent"] < 12 * 2:
            if live["sent"] >= 4:  # the first 4 are sent
                samples.append(live["now"])
            time.sleep(0.002)

    monkeypatch.setattr(distill, "server_generate", counted)
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    path = stage_against(url, tmp_path / "skewed")
    sampler.join(timeout=10)
    written = indices(next((tmp_path / "skewed").rglob("rank-0.jsonl")))
    assert sorted(written) == list(range(12)) and written.index(0) > 0, f"written in request order: {written}"
    assert same_rows(read_rows(path), reference), "the rows merged by index are not the rows of an even run"
    assert max(samples) == 4, f"{max(samples)} sequences in flight, 4 allowed"
    mean = sum(samples) / len(samples)
    assert mean >= 0.9 * 4, f"mean sequences in flight {mean:.2f} of 4 while sequences were left to send"


def test_distill_stopped_by_a_failing_server_resumes_with_only_the_missing_rows(stub, tmp_path, monkeypatch):
    """Rows written in completion order still resume by index: the server fails for good after 10 requests, the
    stage stops with a clear error, and the rerun asks only for the sequences of the rows not written, giving the
    rows of an uninterrupted run."""
    from rlt.stages import distill
    from rlt.stages.distill import sequence_seed

    monkeypatch.setattr(generation, "HTTP_BACKOFF", 0.001)
    monkeypatch.setattr(distill, "sequences_in_flight", lambda spec, prompt: (4, "the test's"))
    server, url = stub
    FlakyVllmStub.fail, FlakyVllmStub.fold = 0, 400
    reference = read_rows(stage_against(url, tmp_path / "whole"))

    FlakyVllmStub.posts, FlakyVllmStub.fail_after = 0, 10
    with pytest.raises(RuntimeError, match="answered 500"):
        stage_against(url, tmp_path / "cut")
    kept = set(indices(next((tmp_path / "cut").rglob("rank-0.jsonl"))))
    assert 0 < len(kept) < 12, kept

    FlakyVllmStub.posts, FlakyVllmStub.fail_after, FlakyVllmStub.asked = 0, None, []
    path = stage_against(url, tmp_path / "cut")
    seed = parse_run(tiny_doc()).spec.seed
    missing = sorted(set(range(12)) - kept)
    asked = sorted(s for _, s in FlakyVllmStub.asked)
    assert asked == sorted(sequence_seed(seed, i, 2, j) for i in missing for j in range(2)), "a written row again"
    assert same_rows(read_rows(path), reference)


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
