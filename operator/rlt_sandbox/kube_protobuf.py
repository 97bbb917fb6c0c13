"""Decode the Kubernetes protobuf encoding of a Secret or ConfigMap into its JSON form, for the emulated API.

Helm (client-go) stores each release as a Secret and sends it as protobuf; the emulator only speaks JSON. This reads
the wire format of the few messages involved (the `k8s\\x00` envelope, runtime.Unknown, ObjectMeta, Secret,
ConfigMap; field numbers from k8s.io/api/core/v1/generated.proto) and nothing else: any other kind is refused.
"""

from __future__ import annotations

import base64
import datetime as dt
from collections.abc import Callable
from typing import Any

from rlt.contract.layout import format_time

MAGIC = b"k8s\x00"


class UnsupportedProtobuf(ValueError):
    pass


def _fields(buf: bytes) -> list[tuple[int, Any]]:
    """(field number, value) pairs of one message: ints for varints, bytes for length-delimited fields."""
    out: list[tuple[int, Any]] = []
    i = 0

    def varint() -> int:
        nonlocal i
        shift = result = 0
        while True:
            if i >= len(buf):
                raise UnsupportedProtobuf("truncated varint")
            b = buf[i]
            i += 1
            result |= (b & 0x7F) << shift
            if not b & 0x80:
                return result
            shift += 7

    while i < len(buf):
        key = varint()
        number, wire = key >> 3, key & 7
        if wire == 0:
            out.append((number, varint()))
        elif wire == 2:
            n = varint()
            out.append((number, buf[i : i + n]))
            i += n
        elif wire == 1:
            out.append((number, buf[i : i + 8]))
            i += 8
        elif wire == 5:
            out.append((number, buf[i : i + 4]))
            i += 4
        else:
            raise UnsupportedProtobuf(f"wire type {wire}")
    return out


def _map(entries: list[bytes], value: Callable[[bytes], str] = lambda b: b.decode()) -> dict[str, str]:
    out = {}
    for entry in entries:
        f = dict(_fields(entry))
        out[f.get(1, b"").decode()] = value(f.get(2, b""))
    return out


def _time(buf: bytes) -> str:
    seconds = dict(_fields(buf)).get(1, 0)
    return format_time(dt.datetime.fromtimestamp(seconds, dt.timezone.utc))


def _object_meta(buf: bytes) -> dict[str, Any]:
    fields = _fields(buf)
    meta: dict[str, Any] = {}
    strings = {1: "name", 2: "generateName", 3: "namespace", 5: "uid", 6: "resourceVersion"}
    for number, value in fields:
        if number in strings and value:
            meta[strings[number]] = value.decode()
        elif number == 7 and value:
            meta["generation"] = value
        elif number == 8 and dict(_fields(value)).get(1):  # an unset Time is 0 s: leave it to the server
            meta["creationTimestamp"] = _time(value)
        elif number == 14:
            meta.setdefault("finalizers", []).append(value.decode())
    labels = [v for n, v in fields if n == 11]
    annotations = [v for n, v in fields if n == 12]
    if labels:
        meta["labels"] = _map(labels)
    if annotations:
        meta["annotations"] = _map(annotations)
    return meta


def decode(body: bytes) -> dict[str, Any]:
    """A protobuf-encoded Secret or ConfigMap as the JSON object the API would store."""
    if not body.startswith(MAGIC):
        raise UnsupportedProtobuf("not a Kubernetes protobuf envelope")
    unknown = dict(_fields(body[len(MAGIC) :]))
    type_meta = dict(_fields(unknown.get(1, b"")))
    api_version, kind = type_meta.get(1, b"").decode(), type_meta.get(2, b"").decode()
    fields = _fields(unknown.get(2, b""))
    obj: dict[str, Any] = {"apiVersion": api_version, "kind": kind}
    meta = next((v for n, v in fields if n == 1), None)
    obj["metadata"] = _object_meta(meta) if meta is not None else {}
    if (api_version, kind) == ("v1", "Secret"):
        data = [v for n, v in fields if n == 2]
        if data:
            obj["data"] = _map(data, lambda b: base64.b64encode(b).decode())
        kind_type = next((v for n, v in fields if n == 3), None)
        if kind_type is not None:
            obj["type"] = kind_type.decode()
    elif (api_version, kind) == ("v1", "ConfigMap"):
        data = [v for n, v in fields if n == 2]
        binary = [v for n, v in fields if n == 3]
        if data:
            obj["data"] = _map(data)
        if binary:
            obj["binaryData"] = _map(binary, lambda b: base64.b64encode(b).decode())
    else:
        raise UnsupportedProtobuf(f"{api_version} {kind} in protobuf is not emulated; send JSON")
    return obj
