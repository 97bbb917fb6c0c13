"""A plain YAML mapping key as kubectl sends it to the API server.

kubectl reads YAML with go-yaml v2 (YAML 1.1 tag resolution) and turns each key into a JSON object key
(sigs.k8s.io/yaml): a plain key that YAML 1.1 reads as a number or a boolean arrives as that number's or boolean's
text, so `0x1`, `1.0`, `+1` and `1` all arrive as "1" and `TRUE` as "true" (a float key through Go's float32
formatting, so `1.00000001` is "1" too); two such keys of one mapping collapse into one, the last kept without a
word. A null key (`~`, `null`) kubectl refuses ("unsupported map key"). Measured with kubectl 1.31
(`kubectl label --local -f FILE -o json`); tests/unit/test_door_keys.py compares this with the kubectl at hand.
"""

from __future__ import annotations

import math
import re
import struct

_NULLS = frozenset(["", "~", "null", "Null", "NULL"])
_TRUE = frozenset(["y", "Y", "yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON"])
_FALSE = frozenset(["n", "N", "no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF"])
_SPECIAL_FLOATS = {
    **dict.fromkeys([".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF"], ".inf"),
    **dict.fromkeys(["-.inf", "-.Inf", "-.INF"], "-.inf"),
    **dict.fromkeys([".nan", ".NaN", ".NAN"], ".nan"),
}
# Go's strconv.ParseInt(s, 0, 64) after go-yaml drops every '_': a sign, then hex, octal (0o or a leading 0), binary
_GO_INT = re.compile(r"([-+]?)(0[xX][0-9a-fA-F]+|0[oO][0-7]+|0[bB][01]+|0[0-7]*|[1-9][0-9]*)")
_GO_YAML_FLOAT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?")  # go-yaml v2's yamlStyleFloat
_DOT_FLOAT = re.compile(r"\.[0-9]+([eE][-+]?[0-9]+)?")  # a scalar starting with '.': Go's ParseFloat alone
_INT64 = 2**63


class NullKey(ValueError):
    """kubectl refuses a null mapping key."""


def _go_int(plain: str) -> int | None:
    match = _GO_INT.fullmatch(plain) if len(plain) <= 80 else None
    if match is None:
        return None
    sign, body = match.groups()
    low = body.lower()
    if low.startswith(("0x", "0o", "0b")):
        value = int(low[2:], {"x": 16, "o": 8, "b": 2}[low[1]])
    else:
        value = int(body, 8) if body.startswith("0") and len(body) > 1 else int(body)
    value = -value if sign == "-" else value
    return value if -_INT64 <= value < 2 * _INT64 else None  # past uint64 go-yaml tries a float


def _go_float32_text(value: float) -> str:
    """Go's strconv.FormatFloat(value, 'g', -1, 32), as sigs.k8s.io/yaml writes a float key (Inf as .inf)."""
    try:
        single = struct.unpack("f", struct.pack("f", value))[0]
    except OverflowError:
        single = float("inf") if value > 0 else float("-inf")
    if math.isnan(single):
        return ".nan"
    if single in (float("inf"), float("-inf")):
        return ".inf" if single > 0 else "-.inf"
    if single == 0:
        return "-0" if str(single).startswith("-") else "0"
    for digits in range(1, 10):  # the shortest decimal that reads back as the same float32
        text = f"{single:.{digits - 1}e}"
        if struct.unpack("f", struct.pack("f", float(text)))[0] == single:
            break
    mantissa, exp_text = text.split("e")
    negative = mantissa.startswith("-")
    figures = mantissa.lstrip("-").replace(".", "").rstrip("0") or "0"
    exp = int(exp_text)
    if exp < -4 or exp >= 6:  # %e for the shortest form (Go's eprec 6)
        body = (
            figures[0] + ("." + figures[1:] if len(figures) > 1 else "") + f"e{'-' if exp < 0 else '+'}{abs(exp):02d}"
        )
    elif exp < 0:
        body = "0." + "0" * (-exp - 1) + figures
    else:
        whole = figures[: exp + 1].ljust(exp + 1, "0")
        rest = figures[exp + 1 :]
        body = whole + ("." + rest if rest else "")
    return ("-" if negative else "") + body


def kubectl_key(text: str) -> str:
    """The JSON key kubectl makes of the plain (unquoted) YAML key `text`; NullKey when kubectl refuses it."""
    if text in _NULLS:
        raise NullKey(text)
    if text in _TRUE or text in _FALSE:
        return "true" if text in _TRUE else "false"
    if text in _SPECIAL_FLOATS:
        return _SPECIAL_FLOATS[text]
    first = text[:1]
    if first.isdigit() or first in "+-":
        plain = text.replace("_", "")
        whole = _go_int(plain)
        if whole is not None:
            return str(whole)
        if len(plain) <= 400 and _GO_YAML_FLOAT.fullmatch(plain):
            return _go_float32_text(float(plain))
    elif first == "." and len(text) <= 400 and _DOT_FLOAT.fullmatch(text):
        return _go_float32_text(float(text))
    return text
