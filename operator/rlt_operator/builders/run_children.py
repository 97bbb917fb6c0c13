"""The run-wide children: the ConfigMap with the current spec (for people and tools) and the run's volume claim."""

from __future__ import annotations

import functools
from typing import Any

from rlt.contract.layout import CONFIG_FILE
from rlt.spec.loading import dump_run
from rlt.spec.run import Metadata, RLTRun, RLTRunSpec
from rlt.spec.stages import generation
from rlt_operator.builders.common import (
    A_CONFIG_HASH,
    ROLE_CONFIG,
    ROLE_DATA,
    RunRef,
    config_hash,
    config_name,
    data_claim_name,
    generator_url,
    labels,
    object_meta,
    type_meta,
)
from rlt_operator.config.kinds import RUN

# --------------------------------------------------------------------------- run-wide children


def pod_config(ref: RunRef, spec: RLTRunSpec) -> str:
    """The run.yaml the pods read: the spec as given, plus the generator URL the operator owns."""
    # Every reconcile asks for it; rendering YAML costs ~4 ms, so render each distinct spec once.
    return _pod_config(ref.name, ref.namespace, spec.model_dump_json(by_alias=True))


@functools.lru_cache(maxsize=1024)
def _pod_config(name: str, namespace: str, spec_json: str) -> str:
    ref = RunRef(name=name, namespace=namespace, uid="")
    spec = RLTRunSpec.model_validate_json(spec_json)
    gen = generation(spec)  # the generators serve the stages that sample from the teacher
    if gen.mode == "server":
        gen.server_url = generator_url(ref.name, ref.namespace)
    run = RLTRun(
        **type_meta(RUN.plural),
        metadata=Metadata(name=ref.name, namespace=ref.namespace),
        spec=spec,
    )
    return dump_run(run)


def configmap(ref: RunRef, spec: RLTRunSpec) -> dict[str, Any]:
    text = pod_config(ref, spec)
    return {
        **type_meta("configmaps"),
        "metadata": object_meta(
            ref, config_name(ref.name), labels(ref.name, ROLE_CONFIG), {A_CONFIG_HASH: config_hash(text)}
        ),
        "data": {CONFIG_FILE: text},
    }


def pvc(ref: RunRef, spec: RLTRunSpec) -> dict[str, Any] | None:
    """None when the user names an existing claim (then it is theirs: never created or deleted)."""
    storage = spec.storage
    if storage.existing_claim:
        return None
    claim: dict[str, Any] = {
        "accessModes": [storage.access_mode],
        "resources": {"requests": {"storage": storage.size}},
    }
    if storage.storage_class_name:
        claim["storageClassName"] = storage.storage_class_name
    meta = object_meta(ref, data_claim_name(ref.name, spec), labels(ref.name, ROLE_DATA))
    if storage.retention_policy == "Retain":
        # An owner reference would let the garbage collector delete the checkpoints with the run.
        del meta["ownerReferences"]
    return {
        **type_meta("persistentvolumeclaims"),
        "metadata": meta,
        "spec": claim,
    }
