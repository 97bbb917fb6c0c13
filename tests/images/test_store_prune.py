"""hack/images.py prunes buildah's vfs store after a build (every layer there is a full copy of its files, so an
interrupted multi-GB build or a replaced image costs GBs of disk): on a private store with tiny images, the
image a rebuild replaced, leftover working containers and dangling images go; the base, the built images and
untagged parents of other images (the operator's layer cache) stay."""

from __future__ import annotations

import fcntl
import json

import pytest
from image_helpers import images


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("RLT_BUILDAH_ROOT", str(tmp_path / "buildah"))
    monkeypatch.setattr(images, "CACHE", tmp_path / "cache")  # its own lock: a build elsewhere must not matter
    yield
    images.buildah("rm", "--all", check=False)
    images.buildah("rmi", "--all", "--force", check=False)


def commit(tmp_path, name: str | None, content: str, parent: str = "scratch") -> str:
    """A one-file image on `parent`, tagged `name` (untagged if None); returns its ID."""
    f = tmp_path / "payload.txt"
    f.write_text(content)
    c = images.buildah("from", "--pull=never", parent).stdout.strip()
    images.buildah("copy", c, str(f), f"/{content}.txt")
    return images.buildah("commit", "--rm", "-q", c, *([name] if name else [])).stdout.strip()


def ids() -> set[str]:
    return {
        i["id"].removeprefix("sha256:")
        for i in json.loads(images.buildah("images", "--json", "--all", "--no-trunc").stdout) or []
    }


def test_prune_drops_replaced_dangling_and_leftovers_keeps_tagged_and_cache(store, tmp_path):
    base = commit(tmp_path, images.BASE_IMAGE, "base")
    old = commit(tmp_path, "localhost/rlt-x:1", "v1")
    new = commit(tmp_path, "localhost/rlt-x:1", "v2")  # the rebuild: the tag moves, `old` is left untagged
    cache_parent = commit(tmp_path, None, "layer", parent=base)  # untagged, but the parent of a tagged image
    child = commit(tmp_path, "localhost/rlt-y:1", "top", parent=cache_parent)
    dangling = commit(tmp_path, None, "orphan")
    leftover = images.buildah("from", "--pull=never", "localhost/rlt-x:1").stdout.strip()  # an interrupted build's
    assert images.image_names(old) == [] and {old, new, cache_parent, child, dangling} <= ids()

    images.prune(old)

    left = ids()
    assert {base, new, cache_parent, child} <= left, "prune removed a tagged image or a cached parent layer"
    assert old not in left and dangling not in left
    assert leftover not in {c["containername"] for c in json.loads(images.buildah("containers", "--json").stdout) or []}


def test_prune_only_drops_the_replaced_image_while_another_build_holds_the_store(store, tmp_path):
    old = commit(tmp_path, "localhost/rlt-x:1", "v1")
    new = commit(tmp_path, "localhost/rlt-x:1", "v2")
    dangling = commit(tmp_path, None, "orphan")  # could be a running build's freshly committed layer
    images.CACHE.mkdir(parents=True)
    with (images.CACHE / "store.lock").open("a") as f:
        fcntl.flock(f, fcntl.LOCK_SH)  # what build() and rootfs() hold while they use the store
        images.prune(old)
    assert old not in ids() and {new, dangling} <= ids()
    images.prune()
    assert dangling not in ids()
