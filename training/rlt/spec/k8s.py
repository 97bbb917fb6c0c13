"""One type per Kubernetes concept the spec holds, with the API server's own grammar.

Every spec field that holds a quantity, a name, a label value, an annotation or label key, an env var name or a
Secret key uses one of these types, so a field added later cannot forget the rule, and a value the API server
would refuse on a child object (a pod, a PVC) is refused by `rlt validate` and the operator first. Each type
carries its pattern and length into the generated CRD (`pattern`, `maxLength`; not for map keys, see rlt_operator.crd),
and its own one-line message here (pydantic's would print the regular expression).

Grammars: k8s.io/apimachinery (resource.Quantity, validation.IsDNS1123Label/Subdomain, IsDNS1035Label,
IsQualifiedName, IsValidLabelValue, IsConfigMapKey, IsCIdentifier).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from fractions import Fraction
from typing import Annotated, Any

from pydantic import AfterValidator
from pydantic.json_schema import WithJsonSchema

# -------------------------------------------------------------------------------------------------- the grammars

_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS1123_LABEL = rf"^{_DNS_LABEL}$"
DNS1123_SUBDOMAIN = rf"^{_DNS_LABEL}(\.{_DNS_LABEL})*$"
DNS1035_LABEL = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
# a label value or the name part of a qualified name: alphanumeric at both ends, '-', '_', '.' inside
_NAME_PART = r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
LABEL_VALUE = rf"^({_NAME_PART})?$"
QUALIFIED_NAME = rf"^({_DNS_LABEL}(\.{_DNS_LABEL})*/)?{_NAME_PART}$"
EXTENDED_RESOURCE = rf"^{_DNS_LABEL}(\.{_DNS_LABEL})*/{_NAME_PART}$"
C_IDENTIFIER = r"^[A-Za-z_][A-Za-z0-9_]*$"
CONFIG_KEY = r"^[-._a-zA-Z0-9]+$"
# An image reference as the kubelet parses it (the distribution/reference grammar: [domain[:port]/]path[:tag][@digest],
# path components lowercase): the API server checks only for whitespace, a pull of anything else fails with
# InvalidImageName after the pods are made.
_ALNUM = r"[a-z0-9]+"
_PATH_COMPONENT = rf"{_ALNUM}(?:(?:[._]|__|-+){_ALNUM})*"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[a-fA-F0-9:]+\])(?::[0-9]+)?"
_TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
# A digest as go-digest validates it after the grammar: an algorithm it knows, lower-case hex of that algorithm's length.
DIGEST_HEX = {"sha256": 64, "sha384": 96, "sha512": 128}
_DIGEST = "(?:" + "|".join(f"{alg}:[a-f0-9]{{{n}}}" for alg, n in DIGEST_HEX.items()) + ")"
IMAGE = rf"^(?:{_DOMAIN}/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*(?::{_TAG})?(?:@{_DIGEST})?$"
MAX_IMAGE = 4096
MAX_IMAGE_NAME = 255  # distribution/reference NameTotalLengthMax: the name (registry and path), no tag or digest


def _image_name(value: str) -> str | None:
    name = value.split("@", 1)[0]
    last = name.rfind("/")
    colon = name.rfind(":")
    if colon > last:  # a tag (a colon before the last '/' is a registry's port)
        name = name[:colon]
    if len(name) > MAX_IMAGE_NAME:
        return f"the repository name is {len(name)} characters, over {MAX_IMAGE_NAME}"
    if re.fullmatch(r"[a-f0-9]{64}", name):  # ParseNormalizedNamed: that is an image ID, not a name
        return "a 64-character hex string is an image ID, not a repository name"
    return None


# resource.Quantity without a sign (requests and limits must not be negative): a number, then a binary suffix
# (Ki..Ei), a decimal one (n u m k M G T P E) or an integer exponent (e3, E-2); no spaces.
_NUMBER = r"(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
QUANTITY = rf"^\+?{_NUMBER}(([KMGTPE]i)|[numkMGTPE]|([eE][-+]?[0-9]+))?$"

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL: dict[str, Fraction | int] = {"n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000), "": 1}
_DECIMAL.update({s: 10 ** (3 * (i + 1)) for i, s in enumerate("kMGTPE")})


def quantity_bytes(q: str) -> int:
    """A quantity of bytes (memory, storage) as a whole number: '1.5Gi' → 1610612736."""
    return int(quantity_value(q))


def quantity_value(q: str) -> Fraction:
    """The exact value of a quantity in its base unit (bytes, cores): '1.5Gi' → 1610612736, '500m' → 1/2."""
    m = re.fullmatch(rf"\+?(?P<num>{_NUMBER})(?P<suffix>[KMGTPE]i|[numkMGTPE]|[eE][-+]?[0-9]+)?", q)
    if m is None:
        raise ValueError(f"{q!r} is not a Kubernetes quantity")
    num, suffix = Fraction(m.group("num")), m.group("suffix") or ""
    if suffix in _BINARY:
        value = num * _BINARY[suffix]
    elif suffix in _DECIMAL:
        value = num * _DECIMAL[suffix]
    else:
        # An exponent is bounded before Python raises 10 to it (1e999999999 would take minutes): past 10^400 the
        # CRD's CEL rules see +Inf (asApproximateFloat) and below 10^-200 the server rounds up to 1n anyway.
        exponent = max(-200, min(400, int(suffix[1:])))
        value = num * Fraction(10) ** exponent
    # The API server rounds a non-zero quantity up to the nearest nano (0.1n is 1n).
    return Fraction(math.ceil(value * 10**9), 10**9) if value else value


# -------------------------------------------------------------------------------------------------- the types


def _check(
    pattern: str, max_length: int | None, what: str, extra: Callable[[str], str | None] | None = None
) -> AfterValidator:
    """Checks a str against `pattern` and `max_length` with a message saying what it must be."""
    compiled = re.compile(pattern)

    def check(value: str) -> str:
        if max_length is not None and len(value) > max_length:
            raise ValueError(f"{value[:40]!r}… is {len(value)} characters, over {max_length} ({what})")
        # fullmatch: Python's `$` also matches before a final newline, the API server's (Go RE2) does not
        if not compiled.fullmatch(value):
            raise ValueError(f"{value!r} is not {what}")
        problem = extra(value) if extra else None
        if problem:
            raise ValueError(f"{value!r}: {problem}")
        return value

    return AfterValidator(check)


def _schema(pattern: str, max_length: int | None = None) -> WithJsonSchema:
    """The same pattern and bound in the JSON schema (and so the CRD)."""
    schema: dict[str, Any] = {"type": "string", "pattern": pattern}
    if max_length is not None:
        schema["maxLength"] = max_length
    return WithJsonSchema(schema)


def _qualified_name_parts(value: str) -> str | None:
    prefix, _, name = value.rpartition("/")
    if len(prefix) > 253:
        return f"the prefix before '/' is {len(prefix)} characters, over 253"
    if len(name) > 63:
        return f"the name after the prefix is {len(name)} characters, over 63"
    return None


# Kubernetes documents that no quantity may hold more than 2^63-1 (its parser caps or wraps beyond): a request of
# 1e999999999 bytes would only leave a pod that nothing schedules (and the pod builders' arithmetic on it).
MAX_QUANTITY_VALUE = 2**63 - 1


def _bounded(value: str) -> str | None:
    exponent = re.search(r"[eE]([-+]?[0-9]+)$", value)
    if exponent and not -(2**31) <= int(exponent.group(1)) < 2**31:  # the API server keeps an int32 of it
        return "its exponent is outside what the API server reads (a 32-bit integer)"
    if quantity_value(value) > MAX_QUANTITY_VALUE:
        return "above 2^63-1, the most a Kubernetes quantity holds"
    return None


def _whole(value: str) -> str | None:
    if problem := _bounded(value):
        return problem
    return (
        None
        if quantity_value(value).denominator == 1
        else "an extended resource must be a whole number (request = limit)"
    )


# Bounded so that the CRD's CEL rules on quantities stay cheap in the apiserver's cost estimate.
MAX_QUANTITY = 64
Quantity = Annotated[
    str,
    _check(QUANTITY, MAX_QUANTITY, "a Kubernetes quantity (e.g. 200Gi, 500m, 1.5T, 4; no spaces)", extra=_bounded),
    _schema(QUANTITY, MAX_QUANTITY),
]
# Extended resources (nvidia.com/gpu, rdma/...): the API server takes whole numbers only.
WholeQuantity = Annotated[
    str,
    _check(QUANTITY, MAX_QUANTITY, "a Kubernetes quantity (e.g. 1, 2, 1k; no spaces)", extra=_whole),
    _schema(QUANTITY, MAX_QUANTITY),
]
DNS1123Label = Annotated[
    str, _check(DNS1123_LABEL, 63, "a DNS-1123 label (lowercase letters, digits, '-')"), _schema(DNS1123_LABEL, 63)
]
DNS1123Subdomain = Annotated[
    str,
    _check(
        DNS1123_SUBDOMAIN, 253, "a Kubernetes object name (DNS-1123 subdomain: lowercase letters, digits, '-', '.')"
    ),
    _schema(DNS1123_SUBDOMAIN, 253),
]
# The run's own name: its children append suffixes (up to "-generator-<index>" plus controller hashes) and its
# Services need DNS-1035 names (a letter first), so it is stricter than an object name.
MAX_RUN_NAME = 40
RunName = Annotated[
    str,
    _check(
        DNS1035_LABEL,
        MAX_RUN_NAME,
        f"a run name (a DNS-1035 label of at most {MAX_RUN_NAME} characters, as child names add suffixes: "
        "lowercase letters, digits and '-', a letter first)",
    ),
    _schema(DNS1035_LABEL, MAX_RUN_NAME),
]
# Kueue's LocalQueue is an object (its name a DNS-1123 subdomain) named in a pod label (a value of at most 63).
QueueName = Annotated[
    str,
    _check(
        DNS1123_SUBDOMAIN,
        63,
        "a Kueue LocalQueue name (an object name: lowercase letters, digits, '-', '.'; at most 63 characters, as "
        "it is also the value of the kueue.x-k8s.io/queue-name label)",
    ),
    _schema(DNS1123_SUBDOMAIN, 63),
]
LabelValue = Annotated[
    str,
    _check(LABEL_VALUE, 63, "a label value (letters, digits, '-', '_', '.', alphanumeric at both ends)"),
    _schema(LABEL_VALUE, 63),
]
QualifiedName = Annotated[
    str,
    _check(
        QUALIFIED_NAME,
        253 + 1 + 63,
        "a label or annotation key ([prefix/]name: a DNS subdomain prefix, a name of letters, digits, '-', '_', '.')",
        extra=_qualified_name_parts,
    ),
    _schema(QUALIFIED_NAME, 253 + 1 + 63),
]
ResourceName = Annotated[
    str,
    _check(
        EXTENDED_RESOURCE,
        253 + 1 + 63,
        "an extended resource name (domain/name, e.g. rdma/hca or nvidia.com/mig-3g.40gb)",
        extra=_qualified_name_parts,
    ),
    _schema(EXTENDED_RESOURCE, 253 + 1 + 63),
]
EnvVarName = Annotated[
    str,
    _check(C_IDENTIFIER, None, "an environment variable name (letters, digits, '_', not a digit first)"),
    _schema(C_IDENTIFIER),
]
Image = Annotated[
    str,
    _check(
        IMAGE,
        MAX_IMAGE,
        "a container image reference ([registry/]path[:tag][@sha256:<64 lower-case hex>], lowercase path, one tag; "
        "e.g. ghcr.io/org/image:tag)",
        extra=_image_name,
    ),
    _schema(IMAGE, MAX_IMAGE),
]


def _config_key_dots(value: str) -> str | None:
    """The rest of Kubernetes' IsConfigMapKey: '.', '..' and a '..' prefix are the names of a mounted volume's
    own entries (its ..data link), never a key."""
    if value in (".", "..") or value.startswith(".."):
        return "'.', '..' and names starting with '..' are not Secret or ConfigMap keys (Kubernetes refuses them)"
    return None


ConfigKey = Annotated[
    str,
    _check(CONFIG_KEY, 253, "a Secret or ConfigMap key (letters, digits, '-', '_', '.')", extra=_config_key_dots),
    _schema(CONFIG_KEY, 253),
]


# -------------------------------------------------------------------------------------------------- CEL rules


def cel_rules(*rules: tuple[str, ...]) -> dict[str, Any]:
    """A model's cross-field rules as the CRD's `x-kubernetes-validations` ((CEL rule, message[, field path])
    tuples), for the model's `json_schema_extra`: the API server applies them at `kubectl apply`, the model's
    validator applies the same rule in Python (tests/operator/test_crd_cel.py evaluates both on the same inputs).
    A field path (e.g. ".cpuLimit", relative to the object the rule is on) makes the API server name that field
    in its refusal, with reason FieldValueInvalid; tests/operator/test_crd_cel_cost.py keeps every rule within
    what the API server's cost estimator accepts."""
    out = []
    for rule, message, *path in rules:
        entry = {"rule": rule, "message": message}
        if path:
            entry.update(fieldPath=path[0], reason="FieldValueInvalid")
        out.append(entry)
    return {"x-kubernetes-validations": out}


def cel_string(pattern: str) -> str:
    """A regular expression as a CEL raw string literal (RE2 in both the API server and cel-python)."""
    if "'" in pattern:
        raise ValueError(f"pattern {pattern!r} cannot be a raw single-quoted CEL string")
    return f"r'{pattern}'"
