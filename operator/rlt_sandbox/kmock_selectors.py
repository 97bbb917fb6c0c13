"""Label and field selectors as the API server applies them to lists and watches, and the subset of JSONPath that
field selectors and printer columns use."""

from __future__ import annotations

import re
from typing import Any


def parse_label_selector(selector: str) -> list[tuple[str, str, str | None]]:
    """'a=b,c!=d,e,!f' → [(key, op, value)]; set-based `in`/`notin` are not supported (said loudly)."""
    out: list[tuple[str, str, str | None]] = []
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if " in " in term or " notin " in term:
            raise ValueError(f"set-based label selectors are not emulated: {term!r}")
        if "!=" in term:
            k, v = term.split("!=", 1)
            out.append((k.strip(), "!=", v.strip()))
        elif "==" in term or "=" in term:
            k, v = re.split("==?", term, maxsplit=1)
            out.append((k.strip(), "=", v.strip()))
        elif term.startswith("!"):
            out.append((term[1:].strip(), "!", None))
        else:
            out.append((term, "exists", None))
    return out


def labels_match(labels: dict[str, str], terms: list[tuple[str, str, str | None]]) -> bool:
    for key, op, value in terms:
        have = labels.get(key)
        if op == "=" and have != value:
            return False
        if op == "!=" and have == value:
            return False
        if op == "exists" and key not in labels:
            return False
        if op == "!" and key in labels:
            return False
    return True


def parse_field_selector(selector: str) -> list[tuple[str, str, str]]:
    """'involvedObject.name=x,metadata.namespace!=y' → [(path, op, value)] (equality only, as the API offers)."""
    out = []
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            k, v = term.split("!=", 1)
            out.append((k.strip(), "!=", v.strip()))
        else:
            k, v = re.split("==?", term, maxsplit=1)
            out.append((k.strip(), "=", v.strip()))
    return out


def fields_match(obj: dict[str, Any], terms: list[tuple[str, str, str]]) -> bool:
    for path, op, value in terms:
        have = jsonpath(obj, path)
        have = "" if have is None else str(have)
        if (op == "=") != (have == value):
            return False
    return True


def resource_version(obj: Any) -> int | None:
    try:
        return int(obj.get("metadata", {}).get("resourceVersion"))
    except (AttributeError, TypeError, ValueError):
        return None


_FILTER = re.compile(r'^(\w+)\[\?\(@\.(\w+)==["\'](.*?)["\']\)\]$')


def jsonpath(obj: Any, path: str) -> Any:
    """The subset of JSONPath printer columns use: `.a.b.c`, and a list filtered by one field
    (`.status.conditions[?(@.type=="Ready")].reason`, the first match)."""
    for part in re.findall(r'[^.\[]+(?:\[\?\(@\.\w+==["\'][^"\']*["\']\)\])?', path):
        if not isinstance(obj, dict):
            return None
        m = _FILTER.match(part)
        if m is None:
            obj = obj.get(part)
            continue
        key, field, value = m.groups()
        obj = next((i for i in obj.get(key) or [] if isinstance(i, dict) and str(i.get(field)) == value), None)
    return obj
