"""Each value checked by its consumer's rule (issue 54, class 3), one property test per rule: the spec accepts a
value exactly when the consumer would. Each oracle is transcribed here from the consumer's own source, apart from
rlt's code: Kubernetes' IsConfigMapKey (apimachinery/pkg/util/validation), Kueue's LocalQueue (an object name, and
the value of the kueue.x-k8s.io/queue-name label), vLLM's tensor-parallel rule for KV heads
(vllm/config: num_kv_heads % tp == 0 when tp <= num_kv_heads, else tp % num_kv_heads == 0) and its refusal of a
--max-model-len beyond the model's max_position_embeddings."""

from __future__ import annotations

import json
import re
import string

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from suite_helpers import EXAMPLES, door_problems

from rlt.cli import main
from rlt.spec.loading import SpecError, parse_run

KEY_CHARS = string.ascii_letters + string.digits + "-._" + " /:@é"


def k8s_config_map_key_ok(key: str) -> bool:
    """apimachinery IsConfigMapKey: at most 253, [-._a-zA-Z0-9]+, not '.', not '..', not starting with '..'."""
    return (
        0 < len(key) <= 253
        and re.fullmatch(r"[-._a-zA-Z0-9]+", key) is not None
        and key not in (".", "..")
        and not key.startswith("..")
    )


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    key=st.one_of(
        st.text(st.sampled_from(KEY_CHARS), min_size=1, max_size=12),
        st.sampled_from([".", "..", "..data", "..a", ".a", "a..b"]),
    )
)
def test_a_secret_key_is_accepted_exactly_when_kubernetes_takes_it(key):
    for ref in ("secretKeyRef", "configMapKeyRef"):
        problems = door_problems({"env": [{"name": "X", "valueFrom": {ref: {"name": "s", "key": key}}}]})
        named = [p for p in problems if p.startswith(f"spec.env.0.valueFrom.{ref}.key:")]
        assert bool(named) != k8s_config_map_key_ok(key), (key, problems)


def kueue_queue_ok(name: str) -> bool:
    """A LocalQueue's metadata.name (DNS-1123 subdomain) that is also a label value (at most 63 characters)."""
    label = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
    return len(name) <= 63 and re.fullmatch(rf"{label}(\.{label})*", name) is not None


@settings(max_examples=200, deadline=None, derandomize=True)
@given(name=st.text(st.sampled_from(string.ascii_letters[:6] + "AZ09-._ "), min_size=1, max_size=70))
def test_a_queue_name_is_accepted_exactly_when_kueue_can_name_a_local_queue_so(name):
    problems = door_problems({"scheduling": {"queueName": name}})
    named = [p for p in problems if p.startswith("spec.scheduling.queueName:")]
    assert bool(named) != kueue_queue_ok(name), (name, problems)


def vllm_tp_ok(heads: int, kv_heads: int, tp: int) -> bool:
    kv = kv_heads if kv_heads >= tp else None
    return heads % tp == 0 and (kv_heads % tp == 0 if kv is not None else tp % kv_heads == 0)


def _model(folder, **fields) -> str:
    folder.mkdir(exist_ok=True)
    config = {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_size": 64 * fields.get("num_attention_heads", 2),
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 64,
        "vocab_size": 256,
        "max_position_embeddings": 4096,
    }
    config.update(fields)
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


def _served(model: str, tp: int = 1, **rl) -> list[str]:
    from rlt.checks.capacity import model_problems

    doc = yaml.safe_load((EXAMPLES / "rltrun-tiny.yaml").read_text())
    doc["spec"]["teacher"]["model"] = model
    doc["spec"]["stages"]["rl"]["generation"] = {"mode": "server", **rl.pop("generation", {})}
    doc["spec"]["stages"]["rl"].update(rl)
    doc["spec"]["resources"]["generator"] = {"gpus": tp, "tensorParallelSize": tp}
    run = parse_run(doc, "run.yaml")
    return model_problems(run.spec)[0]


@settings(max_examples=60, deadline=None, derandomize=True)
@given(heads=st.sampled_from([4, 8, 12, 16, 28]), kv=st.sampled_from([1, 2, 3, 4, 6, 8]), tp=st.sampled_from([2, 4, 8]))
def test_tensor_parallelism_is_accepted_exactly_when_vllm_can_shard_the_heads(tmp_path_factory, heads, kv, tp):
    if heads % kv:
        return  # not a model (grouped-query attention groups the heads evenly)
    model = _model(tmp_path_factory.mktemp("m") / "m", num_attention_heads=heads, num_key_value_heads=kv)
    named = [p for p in _served(model, tp) if p.startswith("spec.resources.generator.tensorParallelSize:")]
    assert bool(named) != vllm_tp_ok(heads, kv, tp), (heads, kv, tp, named)


@pytest.mark.parametrize("positions", [512, 2048])
@pytest.mark.parametrize("max_model_len", [None, 1024, 4096])
def test_max_model_len_and_request_lengths_fit_the_models_positions(tmp_path, positions, max_model_len):
    """vLLM refuses a maxModelLen over max_position_embeddings; without one it serves at most that many tokens."""
    model = _model(tmp_path / "m", max_position_embeddings=positions)
    gen = {"maxModelLen": max_model_len} if max_model_len else {}
    problems = _served(model, generation=gen, maxPromptLength=600, maxCompletionLength=200)
    over_len = max_model_len is not None and max_model_len > positions
    over_need = max_model_len is None and positions < 800
    assert any(p.startswith("spec.stages.rl.generation.maxModelLen:") for p in problems) == over_len, problems
    assert any(p.startswith("spec.stages.rl.maxPromptLength:") for p in problems) == over_need, problems


def test_the_positions_rule_reaches_the_user_through_validate(tmp_path, capsys):
    doc = yaml.safe_load((EXAMPLES / "rltrun-tiny.yaml").read_text())
    doc["spec"]["teacher"]["model"] = _model(tmp_path / "m", max_position_embeddings=128)
    doc["spec"]["stages"]["rl"]["generation"] = {"mode": "server", "maxModelLen": 4096}
    run_file = tmp_path / "run.yaml"
    run_file.write_text(yaml.safe_dump(doc))
    assert main(["validate", "--no-data", str(run_file)]) == 1
    assert "spec.stages.rl.generation.maxModelLen: 4096 is above the 128 positions" in capsys.readouterr().err


def s3_bucket_ok(name: str) -> bool:
    """AWS S3 general purpose bucket naming rules, from the S3 user guide."""
    return (
        3 <= len(name) <= 63
        and re.fullmatch(r"[a-z0-9.-]+", name) is not None
        and name[0].isalnum()
        and name[-1].isalnum()
        and ".." not in name
        and re.fullmatch(r"\d+\.\d+\.\d+\.\d+", name) is None
        and not name.startswith(("xn--", "sthree-", "amzn-s3-demo-"))
        and not name.endswith(("-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3"))
    )


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    bucket=st.one_of(
        st.text(st.sampled_from("ab9.-_A"), min_size=1, max_size=66),
        st.sampled_from(["192.168.0.1", "xn--abc", "my-s3alias", "ab", "a" * 63, "a" * 64, "a..b", "ok.bucket-1"]),
    )
)
def test_an_s3_output_is_accepted_exactly_when_its_bucket_is_an_s3_bucket_name(bucket):
    problems = door_problems({"outputs": {"teacher": f"s3://{bucket}/teacher"}})
    named = [p for p in problems if p.startswith("spec.outputs.teacher:") or p.startswith("spec.outputs:")]
    assert bool(named) != s3_bucket_ok(bucket), (bucket, problems)


@settings(max_examples=100, deadline=None, derandomize=True)
@given(
    a=st.sampled_from(["s3://bkt/x", "s3://bkt/x/", "s3://bkt/x/y", "s3://bkt/xy", "gs://other/x"]),
    b=st.sampled_from(["s3://bkt/x", "s3://bkt/x/y/z", "s3://bkt/z", "s3://bkt/xy/"]),
)
def test_two_outputs_are_refused_exactly_when_one_would_land_in_the_other(a, b):
    problems = door_problems({"outputs": {"teacher": a, "student": b}})
    x, y = a.rstrip("/") + "/", b.rstrip("/") + "/"
    overlap = x.startswith(y) or y.startswith(x)
    assert any(p.startswith("spec.outputs") and "place too" in p for p in problems) == overlap, (a, b, problems)


@pytest.mark.parametrize(
    ("rate", "ok"),
    [("1n", False), ("1m", False), ("1", False), ("999k", False), ("1M", True), ("250M", True), ("2Gi", True)],
)
def test_a_write_rate_below_any_volumes_is_refused_naming_the_field(rate, ok):
    problems = door_problems({"storage": {"writeBytesPerSecond": rate}})
    assert (not any(p.startswith("spec.storage") and "writeBytesPerSecond" in p for p in problems)) == ok, problems


@settings(max_examples=100, deadline=None, derandomize=True)
@given(mantissa=st.integers(1, 9), exponent=st.integers(15, 20))
def test_an_integer_written_as_a_float_is_refused_beyond_64_bits(tmp_path_factory, mantissa, exponent):
    """kubectl sends a whole float below 1e21 as an integer: beyond 2^63 neither the API server nor rlt holds it."""
    text = (EXAMPLES / "rltrun-tiny.yaml").read_text().rstrip("\n") + f"\n  seed: {mantissa}.0e{exponent}\n"
    path = tmp_path_factory.mktemp("f") / "run.yaml"
    path.write_text(text)
    from rlt.spec.loading import read_runs

    value = mantissa * 10**exponent
    try:
        read_runs(path)
        refused = ""
    except SpecError as err:
        refused = " ".join(err.problems)
    if value > 2**63 - 1:
        assert "spec.seed" in refused and "64-bit" in refused, refused
    else:
        assert "64-bit" not in refused, refused
