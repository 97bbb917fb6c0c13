"""The sandbox stays up (issue 53, item 6): `rlt sandbox --run-pods` with `kubectl get rlt -w` open for longer than
its operator's watches live (RLT_WATCH_SERVER_TIMEOUT, 300 s), then the tiny run applied near the end must succeed.

Each of the operator's watches ends at its time limit and is opened again; before the fix the first such end was a
500 and the operator died 300 s after the start (the sandbox exits when it does), so a run applied later froze.
Opt-in and long (the default is 15 minutes; `make sandbox-soak`); it prints one line of figures and exits 1 on a
failure, naming it.

    python hack/sandbox_soak.py                       # 15 min, the tiny run applied at minute 12
    python hack/sandbox_soak.py --minutes 11 --apply-at 8
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "manifests" / "examples" / "rltrun-tiny.yaml"


def kubectl_path() -> str:
    path = os.pathsep.join([str(ROOT / ".tools" / "bin"), str(Path(sys.executable).parent), os.environ["PATH"]])
    found = shutil.which("kubectl", path=path)
    if found is None:
        raise SystemExit("sandbox_soak: kubectl not found (make tools puts it in .tools/bin)")
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def follow(proc: subprocess.Popen[str], lines: list[str]) -> None:
    threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True).start()  # type: ignore[union-attr]


def watch_failures(log: Path) -> list[str]:
    """Kopf's lines for a watch that ended in an error: its operator stops reconciling (the thread may live on)."""
    text = log.read_text(errors="replace") if log.exists() else ""
    return [line[:300] for line in text.splitlines() if "has failed: Error in the watch-stream" in line]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=15.0, help="how long the sandbox must stay up (default 15)")
    ap.add_argument("--apply-at", type=float, default=12.0, help="minute at which the tiny run is applied")
    ap.add_argument("--run-minutes", type=float, default=15.0, help="how long the tiny run may take (default 15)")
    args = ap.parse_args()
    if not 0 < args.apply_at < args.minutes:
        raise SystemExit("sandbox_soak: --apply-at must lie between 0 and --minutes")
    kubectl, work = kubectl_path(), Path(tempfile.mkdtemp(prefix="rlt-soak-"))
    config = work / "kubeconfig"
    env = {**os.environ, "KUBECONFIG": str(config), "PYTHONPATH": f"{ROOT / 'training'}:{ROOT / 'operator'}"}
    env.setdefault("RLT_OPERATOR_METRICS_PORT", "-1")  # beside another sandbox or operator: no port to fight over
    cmd = [sys.executable, "-c", "from rlt.cli import main; raise SystemExit(main())", "sandbox"]
    cmd += ["--port", str(free_port()), "--kubeconfig", str(config), "--run-pods", str(work / "pods")]
    out: list[str] = []
    box = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT)
    follow(box, out)
    t0 = time.monotonic()
    while "Ctrl-C" not in "".join(out) and box.poll() is None and time.monotonic() - t0 < 120:
        time.sleep(0.2)
    if "Ctrl-C" not in "".join(out):
        box.kill()
        raise SystemExit("sandbox_soak: rlt sandbox did not start:\n" + "".join(out)[-3000:])
    seen: list[str] = []
    watch = subprocess.Popen(
        [kubectl, "get", "rlt", "-w"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    follow(watch, seen)
    failure, applied, succeeded = "", None, None
    try:
        while not failure:
            now = time.monotonic() - t0
            if now >= args.minutes * 60 and (succeeded is not None or now - (applied or 0) > args.run_minutes * 60):
                break  # up long enough, and the run ended (or ran out of time)
            broken = watch_failures(work / "operator.log")  # the in-process operator's log, by the kubeconfig
            if broken:
                failure = f"the operator's watches failed at {now / 60:.1f} min: {broken[:2]}"
            elif box.poll() is not None:
                failure = f"the sandbox exited at {now / 60:.1f} min (its operator died)"
            elif watch.poll() is not None:
                failure = f"`kubectl get rlt -w` ended at {now / 60:.1f} min: {''.join(seen)[-500:]}"
            elif applied is None and now >= args.apply_at * 60:
                subprocess.run([kubectl, "apply", "--validate=false", "-f", str(TINY)], env=env, check=True)
                applied = now
            elif applied is not None and succeeded is None:
                phase = subprocess.run(
                    [kubectl, "get", "rlt", "tiny", "-o", "jsonpath={.status.phase}"],
                    check=False,
                    env=env,
                    capture_output=True,
                    text=True,
                ).stdout
                if phase == "Succeeded":
                    succeeded = now
                elif phase == "Failed":
                    failure = "the tiny run Failed"
            time.sleep(2)
        if not failure and succeeded is None:
            failure = f"the tiny run did not succeed within {args.run_minutes} min"
        if not failure and not any("Succeeded" in line for line in seen):
            failure = "the open watch never showed the run Succeeded"
    finally:
        watch.send_signal(signal.SIGINT)
        box.send_signal(signal.SIGINT)
        for proc in (watch, box):
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
    up = time.monotonic() - t0
    if not failure and watch_failures(work / "operator.log"):
        failure = f"the operator's watches failed: {watch_failures(work / 'operator.log')[:2]}"
    if failure:
        print(f"sandbox_soak: FAILED: {failure}\n" + "".join(out)[-3000:], file=sys.stderr)
        return 1
    assert applied is not None and succeeded is not None  # no failure: both happened
    print(
        f"sandbox_soak: ok: the sandbox and its operator up {up / 60:.1f} min with `kubectl get rlt -w` open; the "
        f"tiny run applied at minute {applied / 60:.1f} succeeded {succeeded - applied:.0f} s later"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
