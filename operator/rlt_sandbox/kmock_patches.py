"""The two fixes that replace kmock 0.8 internals (`parse_path`, `View.__contains__`), installed only by an explicit
`patch_kmock()` (rlt_sandbox.kmock_glue says what the glue adds)."""

from __future__ import annotations

import re

from kmock._internal import dsl, filtering, parsing, rendering

_original_parse_path = parsing.parse_path
_NAMESPACES_PATH = re.compile(r"^/?(api/v1|apis/[^/]+/[^/]+)/namespaces/?$")


def _parse_path(path: str) -> parsing.ParsedPath:
    # kmock 0.8 unpacks the segment after `namespaces` unconditionally; a bare list of namespaces has none.
    m = _NAMESPACES_PATH.match(path)
    if m:
        gv = m.group(1).split("/")
        group, version = ("", "v1") if gv[0] == "api" else (gv[1], gv[2])
        return parsing.ParsedPath(group, version, "namespaces", None, None, None)
    return _original_parse_path(path)


_original_contains = dsl.View.__contains__


def _contains(view: dsl.View, item: filtering.Criterion) -> bool:
    """Is a request seen by a view? kmock re-filters the whole request log for that (quadratic over a
    long sandbox session); for the plain filter/priority chains behind the emulator's fallbacks, test the
    request against the chain's criteria instead."""
    if isinstance(item, rendering.Request):
        node = view
        while True:
            if type(node) is dsl.Filter:
                if not node.criteria(item):
                    return False
                node = node._source
            elif type(node) is dsl.Priority:
                node = node._source
            elif type(node) is dsl.Root or isinstance(node, dsl.Root):
                return any(r is item for r in reversed(node._requests))
            else:
                break
    return _original_contains(view, item)


def patch_kmock() -> None:
    """Install the two fixes that replace kmock 0.8 internals (`parse_path`, `View.__contains__`).

    Explicit, not done at import: importing this module changes nothing of kmock's. `serve` (the sandbox, the
    tests, the benchmark) calls it before starting an emulator; calling it again does nothing."""
    parsing.parse_path = _parse_path
    dsl.View.__contains__ = _contains  # type: ignore[method-assign]  # the patch replaces kmock's method on purpose


def kmock_patched() -> bool:
    return parsing.parse_path is _parse_path and dsl.View.__contains__ is _contains
