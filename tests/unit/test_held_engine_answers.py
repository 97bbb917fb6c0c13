"""Partial rollouts' hold (rlt.stages.overlap.held_engine) reads vLLM's answers, not only their status codes.

vLLM (0.31 and 0.32) answers POST /reset_prefix_cache with 200 and {"success": false} when it could not drop the
cache: rows would then go on over KV the old weights computed. The real server cannot be made to answer so on
purpose, so this test stands up a hand-written stand-in (a mock, named as such: http.server speaking the three
endpoints' documented answers); tests/training/test_partial_rollouts.py holds rows on the real CPU server."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from rlt.stages.overlap import held_engine


def stand_in_vllm(reset_success: bool) -> tuple[ThreadingHTTPServer, list[str]]:
    """A server answering /pause, /reset_prefix_cache and /resume as vLLM's dev mode does; records each path."""
    seen: list[str] = []

    class Answers(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            path = self.path.split("?")[0]
            seen.append(path)
            body = {
                "/pause": {"status": "paused"},
                "/reset_prefix_cache": {"success": reset_success},
                "/resume": {"status": "resumed"},
            }[path]
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:  # quiet
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Answers)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, seen


@pytest.mark.parametrize("reset_success", [True, False])
def test_a_cache_reset_vllm_says_failed_fails_the_push_and_still_resumes(reset_success):
    server, seen = stand_in_vllm(reset_success)
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        if reset_success:
            with held_engine(base, timeout=10)():
                pass
        else:
            refused = r"POST /reset_prefix_cache answered 200: \{\"success\": false\}"
            with pytest.raises(RuntimeError, match=refused), held_engine(base, timeout=10)():
                pass
    finally:
        server.shutdown()
        server.server_close()
    assert seen == ["/pause", "/reset_prefix_cache", "/resume"]  # resumed either way: no server left paused
