"""The kubelet emulator's containers as processes: image pulls, the environment, volumes and the mapping of cluster
names, paths and ports onto this machine (rlt_sandbox.kubelet_emulator says what is emulated)."""

from __future__ import annotations

import os
import re
import secrets
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from rlt.contract.layout import format_time
from rlt_sandbox.kubelet_core import KubeletCore
from rlt_sandbox.kubelet_model import (
    IMAGE_BACKOFF_CAP,
    LOOPBACK,
    PATHS,
    PodConfigError,
    PodRun,
    PodWaiting,
    expand,
    image_problem,
)
from rlt_sandbox.kubelet_processes import TAG_VAR

_FIELD_KEY = re.compile(r"^metadata\.(annotations|labels)\['(.+)'\]$")


class ContainerRuntime(KubeletCore):
    """Starts the container whose turn it is as a local process."""

    def _pull(self, pod: PodRun, image: str) -> None:
        """The image of the container now due, "pulled" (image_problem says which cannot be); a failed pull is
        ErrImagePull for the first half of its back-off and ImagePullBackOff for the second, then tried again."""
        problem = image_problem(image, self.missing_images)
        if problem is None:
            pod.pull_failures = 0
            return
        reason, said = problem
        if reason != "ErrImagePull":
            raise PodWaiting(reason, said)
        now = time.monotonic()
        if now >= pod.pull_retry_at:
            pod.pull_failures += 1
            pod.pull_failed_at = now
            pod.pull_retry_at = now + min(self.image_backoff * 2 ** (pod.pull_failures - 1), IMAGE_BACKOFF_CAP)
        if now < (pod.pull_failed_at + pod.pull_retry_at) / 2:
            raise PodWaiting(
                "ErrImagePull",
                f'rpc error: code = NotFound desc = failed to pull and unpack image "{image}": failed to resolve '
                f'reference "{image}": {image}: not found (rlt sandbox: the image matches --missing-image {said!r})',
            )
        raise PodWaiting("ImagePullBackOff", f'Back-off pulling image "{image}"')

    async def _schedule(self, ns: str, pod: PodRun) -> None:
        """The scheduler's checks, once per pod (a bound pod stays on its node): the node selector against the one
        node, and every claim the pod names must exist, else the pod stays Pending (Unschedulable) as on a cluster."""
        wanted = pod.body["spec"].get("nodeSelector") or {}
        if any(self.node_labels.get(k) != v for k, v in wanted.items()):
            raise PodWaiting(
                "Unschedulable",
                "0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector "
                f"(the sandbox's one node has {self.node_labels})",
            )
        for vol in pod.body["spec"].get("volumes") or []:
            claim = (vol.get("persistentVolumeClaim") or {}).get("claimName")
            if claim is None:
                continue
            pvc = await self._get(f"{PATHS['persistentvolumeclaims'].format(ns=ns)}/{claim}")
            if pvc is None or pvc["metadata"].get("deletionTimestamp"):
                why = "not found" if pvc is None else "is being deleted"
                raise PodWaiting(
                    "Unschedulable",
                    f'0/1 nodes are available: persistentvolumeclaim "{claim}" {why}. '
                    "preemption: 0/1 nodes are available: 1 Preemption is not helpful for scheduling.",
                )
        pod.scheduled = True

    def _wait_for_leaving_pods(self, ns: str, pod: PodRun) -> None:
        """PodWaiting while another pod of the pod's run is terminating with live processes: here the pods of a
        run share its ports (one loopback), so a restarted gang's rank 0 would find the old gang's rendezvous port
        still held; on a cluster each pod has its own IP and they never meet."""
        leaving = [
            p.name
            for (n, _), p in self.pods.items()
            if n == ns and p is not pod and p.run == pod.run and p.terminating and not self._gone(p)
        ]
        if leaving:
            raise PodWaiting(
                "ContainerCreating",
                f"waiting for {', '.join(sorted(leaving))} of run {pod.run} to end: its processes hold the run's "
                "ports on this machine's one loopback (the emulator's limit; a cluster gives each pod its own IP)",
            )

    async def _start(self, ns: str, pod: PodRun) -> None:
        """Start the container whose turn it is (the next init container, else the main one)."""
        c = pod.current
        if not pod.scheduled:
            await self._schedule(ns, pod)
        self._wait_for_leaving_pods(ns, pod)
        self._pull(pod, c.get("image", ""))
        image = self.images.get(c.get("image", ""), self.default_image)
        if image is None:
            raise PodConfigError(f"no local stand-in for image {c.get('image')!r}")
        # The termination message file, fresh for each start, where the container's terminationMessagePath says.
        message_file = pod.message_file(c["name"])
        message_file.write_bytes(b"")
        termination = (c.get("terminationMessagePath") or "/dev/termination-log").rstrip("/")
        mounts = sorted([*await self._mounts(ns, pod, c), (termination, message_file)], key=lambda t: -len(t[0]))
        env = {
            "PATH": f"{image.bin_dir}{os.pathsep}/usr/local/bin:/usr/bin:/bin",
            # This machine's home stands for the image's: its caches hold what an image bakes in (the tiny
            # model, DeepSpeed's compiled CPU ops).
            "HOME": os.environ.get("HOME", str(self.workdir / "home")),
            "LANG": "C.UTF-8",
            "CUDA_VISIBLE_DEVICES": "",
            "HOSTNAME": pod.body["spec"].get("hostname", pod.name),
            **image.env,
        }
        pod.tag = f"{ns}/{pod.name}/{secrets.token_hex(4)}"
        env_tag = {TAG_VAR: pod.tag}
        rendered: dict[str, str] = {}
        for entry in c.get("env") or []:
            rendered[entry["name"]] = await self._env_value(ns, pod, entry, {**env, **rendered})
        ports = pod.ports
        declared = {str(p["containerPort"]) for p in c.get("ports") or []}
        # Only what the pod spec says is mapped onto this machine; the stand-in image's own env is already local.
        env |= {
            k: str(ports[int(v)])
            if k.endswith("PORT") and v.isdigit() and int(v) in ports
            else self._localize(v, mounts, ports)
            for k, v in rendered.items()
        }
        argv = [
            str(ports[int(a)]) if a in declared else self._localize(expand(a, env), mounts, ports)
            for a in [*(c.get("command") or []), *(c.get("args") or [])]
        ]
        if not argv:
            raise PodConfigError("the container has no command (image entrypoints are not emulated)")
        exe = shutil.which(argv[0], path=env["PATH"])
        if exe is None:
            raise PodConfigError(f"executable {argv[0]!r} not found in the image stand-in ({image.bin_dir})")
        Path(env["HOME"]).mkdir(parents=True, exist_ok=True)
        cwd = self._localize(c["workingDir"], mounts) if c.get("workingDir") else str(pod.dir)
        logf = pod.log_of(c["name"]).open("ab")
        logf.write(f"--- {time.strftime('%H:%M:%S')} start {' '.join(argv)}\n".encode())
        logf.flush()
        try:
            pod.proc = subprocess.Popen(
                [exe, *argv[1:]],
                env={**env, **env_tag},
                cwd=cwd,
                stdout=logf,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError as err:  # the runtime's StartError
            raise PodConfigError(f"cannot start {argv[0]!r}: {err}") from None
        finally:
            logf.close()
        if pod.initializing:  # an init container runs: the pod is still Pending
            pod.started_at = time.monotonic()
            return
        pod.phase, pod.exit_code, pod.ready, pod.started_at = "Running", None, False, time.monotonic()
        pod.started_wall = format_time()

    async def _env_value(self, ns: str, pod: PodRun, entry: dict[str, Any], env: dict[str, str]) -> str:
        if "value" in entry:
            return expand(str(entry["value"]), env)
        src = entry.get("valueFrom") or {}
        meta = pod.body["metadata"]
        if "fieldRef" in src:
            path = src["fieldRef"]["fieldPath"]
            m = _FIELD_KEY.match(path)
            if m:
                return str((meta.get(m.group(1)) or {}).get(m.group(2), ""))
            simple: dict[str, str] = {
                "metadata.name": meta["name"],
                "metadata.namespace": ns,
                "status.podIP": LOOPBACK,
                "status.hostIP": LOOPBACK,
                "spec.nodeName": "localhost",
                "spec.serviceAccountName": pod.body["spec"].get("serviceAccountName", "default"),
            }
            if path not in simple:
                raise PodConfigError(f"env {entry['name']}: fieldRef {path!r} is not emulated")
            return simple[path]
        for kind, plural in (("secretKeyRef", "secrets"), ("configMapKeyRef", "configmaps")):
            if kind in src:
                ref = src[kind]
                obj = await self._get(f"{PATHS[plural].format(ns=ns)}/{ref['name']}")
                data = (obj or {}).get("data") or {}
                if ref["key"] not in data:
                    if ref.get("optional"):
                        return ""
                    # A kubelet keeps the pod Pending (CreateContainerConfigError) until the object or key exists.
                    what = "Secret" if plural == "secrets" else "ConfigMap"
                    raise PodWaiting(
                        "CreateContainerConfigError",
                        f'{plural[:-1]} "{ref["name"]}" not found'
                        if obj is None
                        else f"couldn't find key {ref['key']} in {what} {ns}/{ref['name']}",
                    )
                value: str = data[ref["key"]]
                if plural == "secrets":
                    import base64

                    value = base64.b64decode(value).decode()
                return value
        raise PodConfigError(f"env {entry['name']}: unsupported valueFrom {sorted(src)}")

    async def _mounts(self, ns: str, pod: PodRun, container: dict[str, Any]) -> list[tuple[str, Path]]:
        """(mountPath, host folder) per volumeMount of `container`, longest mount path first."""
        volumes = {v["name"]: v for v in pod.body["spec"].get("volumes") or []}
        out = []
        files: list[tuple[Path, dict[str, str]]] = []
        for m in container.get("volumeMounts") or []:
            vol = volumes.get(m["name"])
            if vol is None:
                raise PodConfigError(f"volumeMount {m['name']!r} names no volume of the pod")
            if "persistentVolumeClaim" in vol:
                host = self.workdir / "volumes" / ns / vol["persistentVolumeClaim"]["claimName"]
            elif "configMap" in vol:
                host = pod.dir / "volumes" / m["name"]
                cm = await self._get(f"{PATHS['configmaps'].format(ns=ns)}/{vol['configMap']['name']}")
                if cm is None:
                    raise PodConfigError(f"configmap {vol['configMap']['name']!r} not found")
                host.mkdir(parents=True, exist_ok=True)
                files.append((host, cm.get("data") or {}))
            elif "emptyDir" in vol:
                host = pod.dir / "volumes" / m["name"]
                host.mkdir(parents=True, exist_ok=True)
                host = self._short_link(host)
            else:
                raise PodConfigError(
                    f"volume {m['name']!r}: only persistentVolumeClaim, configMap and emptyDir are emulated"
                )
            host.mkdir(parents=True, exist_ok=True)
            out.append((m["mountPath"].rstrip("/"), host))
        mounts = sorted(out, key=lambda t: -len(t[0]))
        # ConfigMap files are read by the programs: DNS names and paths under the pod's mounts in them (a run
        # file's `/data/datasets/x.jsonl` on the run's claim) are mapped as in args and env.
        for host, data in files:
            for key, text in data.items():
                (host / key).write_text(self._localize(text, mounts, pod.ports))
        return mounts

    def _short_link(self, folder: Path) -> Path:
        """A short path (a symlink) to a pod's folder. Programs put their Unix sockets in emptyDirs (/tmp, /dev/shm;
        vLLM's ZMQ sockets go to $TMPDIR), and a socket path must fit in sun_path (107 bytes): in a pod /tmp is four,
        a folder under `workdir` can leave no room."""
        if self._links_dir is None:
            self._links_dir = Path(tempfile.mkdtemp(prefix="kubelet-"))
        link = self._links.get(folder)
        if link is None:
            link = self._links_dir / str(len(self._links))
            link.symlink_to(folder, target_is_directory=True)
            self._links[folder] = link
        return link

    def _localize(self, text: str, mounts: list[tuple[str, Path]], ports: dict[int, int] | None = None) -> str:
        """Cluster DNS names → loopback (`name:port` → loopback and the run's port); paths under a mount → its host
        folder (no mount namespace here)."""
        ports = ports or {}

        def host(m: re.Match[str]) -> str:
            port = m.group(1)
            return LOOPBACK if port is None else f"{LOOPBACK}:{ports.get(int(port), int(port))}"

        text = self.dns_port.sub(host, text)
        if not mounts:
            return text
        # One pass: a host folder put in for one mount (say under /tmp) is never rewritten again by another.
        hosts = dict(mounts)
        pattern = "|".join(re.escape(m) for m, _ in mounts)  # longest first
        return re.sub(rf"(?<![\w/.-])({pattern})(?=/|$|[\s:,;\"'])", lambda m: str(hosts[m.group(1)]), text)
