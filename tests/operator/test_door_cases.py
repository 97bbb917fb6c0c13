"""The door's classes, one case each (issue: "The door, round three"), and the counterexamples the property test
(test_door_properties.py) found, kept as regular tests. Every refusal is one line naming the field (and the line of
the file where the reader refuses), never a traceback; every example and a manifest exported from a cluster pass."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml
from suite_helpers import EXAMPLES, ROOT, deep_merge, tiny_doc
from test_door_properties import check_door

TINY = (EXAMPLES / "rltrun-tiny.yaml").read_text()


def _with(spec_yaml: str) -> str:
    """The tiny example with more spec lines appended (YAML text, so the reader sees exactly this)."""
    return TINY.rstrip("\n") + "\n" + spec_yaml


def _patched(patch: dict) -> str:
    doc = tiny_doc()

    deep_merge(doc["spec"], patch)
    return yaml.safe_dump(doc, sort_keys=False)


BIG = "9" * 5000
DEEP = "[" * 3000 + "]" * 3000
# name: (run file text, what the one line says)
RUN_FILES = {
    # the strict reader
    "huge-int": (
        _with(f"  seed: {BIG}\n"),
        "spec.seed: line {n}: 999999999999…(5000 characters) is outside the 64-bit",
    ),
    "beyond-int64": (
        _with("  backoffLimit: 9223372036854775808\n"),
        "spec.backoffLimit: line {n}: 9223372036854775808",
    ),
    "deep": (_with(f"  env: {DEEP}\n"), "nested deeper than 64 levels"),
    "alias-loop": (_with("  env: &a [*a]\n"), "spec.env.0: line {n}: alias *a is inside the node &a it names"),
    "laughs": (
        "a: &a [1,1,1,1,1,1,1,1,1,1]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b,*b]\n"
        "d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c,*c]\ne: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d,*d]\n",
        "line 5: the text holds more than 100000 values (MAX_VALUES, aliases expanded)",
    ),
    "duplicate-key": (_with("  seed: 1\n  seed: 2\n"), "spec: line {m}: key 'seed' is given twice (lines {n} and {m})"),
    "yaml11-bool": (_with("  suspend: yes\n"), "spec.suspend: line {n}: 'yes' is a boolean to YAML 1.1 readers"),
    "inf": (_with("  stages:\n    rl: {temperature: .inf}\n"), "line {m}: .inf is not a finite number"),
    # a quantity's exponent: 10 to it took Python minutes (the long property run's hang); the server keeps an int32
    "huge-quantity": (
        TINY.replace("      gpus: 1", '      memory: "1e999999999"\n      gpus: 1', 1),
        "spec.resources.trainer.memory: '1e999999999': above 2^63-1, the most a Kubernetes quantity holds",
    ),
    "quantity-exponent": (
        TINY.replace("      gpus: 1", "      gpus: 1\n      extra: {rdma/x: '.6E-20680814200'}", 1),
        "spec.resources.trainer.extra.rdma/x: '.6E-20680814200': its exponent is outside what the API server reads",
    ),
    # types as strict as the API server's
    "quoted-number": (_with("  backoffLimit: '3'\n"), "spec.backoffLimit: Input should be a valid integer"),
    "label-value": (
        TINY.replace("  name: tiny\n", "  name: tiny\n  labels: {team: 'not a value!'}\n"),
        "metadata.labels.team: 'not a value!' is not a label value",
    ),
    "metadata-unknown": (
        TINY.replace("  name: tiny\n", "  name: tiny\n  lables: {team: a}\n"),
        "metadata.lables: unknown field",
    ),
    # refused by the API server or the kubelet after the pods are made
    "toleration-operator": (
        _patched({"scheduling": {"tolerations": [{"key": "gpu", "operator": "Exist"}]}}),
        "spec.scheduling.tolerations.0.operator: Input should be '', 'Equal' or 'Exists'",
    ),
    "toleration-exists-value": (
        _patched({"scheduling": {"tolerations": [{"key": "gpu", "operator": "Exists", "value": "a"}]}}),
        "spec.scheduling.tolerations.0.value: must be empty when operator is Exists",
    ),
    "affinity-operator": (
        _patched(
            {
                "scheduling": {
                    "affinity": {
                        "nodeAffinity": {
                            "requiredDuringSchedulingIgnoredDuringExecution": {
                                "nodeSelectorTerms": [{"matchExpressions": [{"key": "gpu", "operator": "Within"}]}]
                            }
                        }
                    }
                }
            }
        ),
        "matchExpressions.0.operator: Input should be 'In', 'NotIn', 'Exists', 'DoesNotExist', 'Gt' or 'Lt'",
    ),
    "image-two-tags": (
        _patched({"images": {"trainer": "ghcr.io/x/y:1:2"}}),
        "spec.images.trainer: 'ghcr.io/x/y:1:2' is not a container image reference",
    ),
    "server-no-gpu": (
        _patched({"stages": {"rl": {"generation": {"mode": "server"}}}, "resources": {"generator": {"gpus": 0}}}),
        "spec.resources.generator.gpus: 0 with stages.rl.generation.mode server",
    ),
    # failing hours later in the trainer
    "batch-vs-processes": (
        _patched({"resources": {"trainer": {"gpus": 8}}}),
        "spec.stages.sft.batchSize: 4 is not a multiple of perDeviceBatchSize × trainer processes = 4 × 8",
    ),
    "max-model-len": (
        _patched({"stages": {"rl": {"generation": {"mode": "colocate", "maxModelLen": 200}}}}),
        "spec.stages.rl.generation.maxModelLen: 200 is below maxPromptLength + maxCompletionLength = 280",
    ),
    "seed": (_patched({"seed": 2**32}), "spec.seed: Input should be less than or equal to 4294967295"),
    "adam-beta": (
        _patched({"stages": {"rl": {"trainerArgs": {"adam_beta1": 1.0}}}}),
        "spec.stages.rl.trainerArgs.adam_beta1: 1 is out of range: must be in [0, 1) (torch.optim.AdamW)",  # 1.0 is sent as 1, as kubectl sends it
    ),
    "evaluate-no-held-out": (
        _patched({"dataset": {"source": "org/data"}, "stages": {"evaluate": {"enabled": True}}}),
        "spec.dataset.evalFraction: 0 leaves no held-out rows for stages.evaluate",
    ),
    "model-url": (
        _patched({"teacher": {"model": "https://huggingface.co/org/m"}}),
        "spec.teacher.model: 'https://huggingface.co/org/m' is a URL; models load from a hub id or a local "
        "directory: give the hub id 'org/m'",
    ),
    "dataset-url": (_patched({"dataset": {"source": "ftp://x/y.jsonl"}}), "spec.dataset.source: 'ftp://x/y.jsonl' is"),
    # found by the long property run: a Literal of ints took True as 1
    "zero-stage-bool": (
        _patched({"stages": {"rl": {"deepspeedZeroStage": True}}}),
        "spec.stages.rl.deepspeedZeroStage: Input should be 0, 1, 2 or 3, not the boolean true",
    ),
    # the wrong words
    "empty-tag": (
        _patched({"format": {"tags": {"solutionStart": ""}}}),
        "spec.format.tags.solutionStart: String should have at least 1 character",
    ),
}


@pytest.fixture(scope="module")
def validated(tmp_path_factory):
    """`rlt validate --no-data --no-plan` on every case file in one process: {name: its problem lines}."""
    folder = tmp_path_factory.mktemp("door-cases")
    paths = {}
    for name, (text, _) in RUN_FILES.items():
        paths[name] = folder / f"{name}.yaml"
        paths[name].write_text(text)
    res = subprocess.run(
        [sys.executable, "-m", "rlt.cli", "validate", "--no-data", "--no-plan", *map(str, paths.values())],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert "Traceback" not in res.stderr + res.stdout, res.stderr
    out: dict[str, list[str]] = {}
    current = None
    for line in res.stderr.splitlines():
        if line.endswith(": INVALID"):
            current = next(n for n, p in paths.items() if line == f"{p}: INVALID")
            out[current] = []
        elif current and line.startswith("  "):
            out[current].append(line.strip())
    return out


@pytest.mark.parametrize("name", list(RUN_FILES))
def test_each_class_of_bad_run_file_is_refused_in_one_line_naming_the_field(validated, name):
    n = len(TINY.splitlines()) + 1  # the first line _with appends
    expected = RUN_FILES[name][1].replace("{n}", str(n)).replace("{m}", str(n + 1))
    assert name in validated, f"{name} was accepted"
    assert any(expected in line for line in validated[name]), validated[name]


def test_the_empty_tag_is_not_blamed_on_the_preset_nor_shows_an_install_path(validated):
    assert not any("format.preset" in line or "/formats/" in line for line in validated["empty-tag"])


# ------------------------------------------------------------------------------------------------- accepted


EXPORTED = """\
apiVersion: rlt.dev/v1alpha1
kind: RLTRun
metadata:
  annotations:
    kubectl.kubernetes.io/last-applied-configuration: |
      {"apiVersion":"rlt.dev/v1alpha1","kind":"RLTRun","metadata":{"name":"tiny","namespace":"default"}}
  creationTimestamp: "2026-11-20T10:00:00Z"
  finalizers:
  - rlt.dev/finalizer
  generation: 3
  labels:
    app.kubernetes.io/part-of: research
  managedFields:
  - apiVersion: rlt.dev/v1alpha1
    fieldsType: FieldsV1
    fieldsV1:
      f:spec:
        .: {}
        f:seed: {}
    manager: kubectl-client-side-apply
    operation: Update
    time: "2026-11-20T10:00:00Z"
  - apiVersion: rlt.dev/v1alpha1
    fieldsType: FieldsV1
    fieldsV1:
      f:status:
        f:phase: {}
    manager: rlt-operator
    operation: Update
    subresource: status
    time: "2026-11-20T10:05:00Z"
  name: tiny
  namespace: default
  resourceVersion: "48213"
  uid: 2b0c8f4e-3c1d-4a55-9a57-6f0e8f1d2c3b
"""


def test_every_example_and_a_manifest_exported_from_a_cluster_are_accepted(tmp_path):
    spec = yaml.safe_load(TINY)["spec"]
    status = {"phase": "Running", "stage": "rl", "conditions": [], "restarts": 0, "observedGeneration": 3}
    exported = tmp_path / "exported.yaml"
    exported.write_text(EXPORTED + yaml.safe_dump({"spec": spec, "status": status}, sort_keys=False))
    files = [*map(str, sorted(EXAMPLES.glob("*.yaml"))), str(exported)]
    res = subprocess.run(
        [sys.executable, "-m", "rlt.cli", "validate", "--no-data", "--no-plan", *files],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.count(": ok (") == len(files)


# ------------------------------------------------------------------------------------------------- data rows


def test_data_rows_beyond_the_bounds_are_bad_rows_naming_the_line(tmp_path):
    from rlt.data.dataset import DataError, check_data
    from rlt.method.prompts import resolve_format
    from rlt.spec.inputs import DatasetSpec, FormatSpec

    fmt = resolve_format(FormatSpec())
    good = '{"question": "1+1?", "solution": "2"}\n'
    cases = {
        "huge.jsonl": (good + '{"question": "q", "solution": ' + "9" * 5000 + "}\n", "line 2: 999999999999…"),
        # json.loads gives up at the interpreter's recursion limit, which imported libraries raise: then the reader's
        # own bound names the path (line 2: x[0][0]...: nested deeper), else the line only
        "deep.jsonl": (good + '{"question": "q", "solution": "s", "x": ' + DEEP + "}\n", "nested deeper than 64"),
        "surrogate.jsonl": (good + '{"question": "q\\ud800", "solution": "s"}\n', "line 2: question: holds a lone"),
        "nan.jsonl": (good + '{"question": "q", "solution": "s", "reasoning_trace": NaN}\n', "line 2: NaN is not"),
        "header.csv": ("question,solution\n", "header.csv: cannot be read as .csv (a header line and no rows)"),
        "object.json": (json.dumps({"rows": [{"question": "q", "solution": "s"}]}, indent=1), "one JSON object"),
    }
    for name, (text, expected) in cases.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(DataError) as err:
            check_data(DatasetSpec(source=str(tmp_path / name)), fmt)
        assert expected in str(err.value) and "\n" not in str(err.value), (name, str(err.value))
        assert name.endswith(".json") or name.endswith(".csv") or " line 2: " in str(err.value), str(err.value)
        if name == "object.json":
            assert "not valid JSON" not in str(err.value) and "its list 'rows'" in str(err.value)
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    with pytest.raises(DataError, match=r"spec.dataset.source: folder .*empty holds no data files"):
        check_data(DatasetSpec(source=str(tmp_path / "empty")), fmt)


def test_sft_needs_reasoning_traces_at_the_door(tmp_path):
    """A NaN (or no) reasoning trace where stage sft needs one: refused by `rlt validate`, not by the stage."""
    (tmp_path / "rows.jsonl").write_text('{"question": "1+1?", "solution": "2"}\n' * 3)
    doc = tiny_doc()
    doc["spec"]["dataset"] = {"source": str(tmp_path / "rows.jsonl")}
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(doc))
    res = subprocess.run(
        [sys.executable, "-m", "rlt.cli", "validate", "--no-plan", str(tmp_path / "run.yaml")],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert res.returncode == 1 and "line 1: reasoning_trace is missing (3 of 3 rows)" in res.stderr, res.stderr


# ------------------------------------------------------------------------------------------------- libraries


def test_the_adamw_ranges_are_torchs():
    torch = pytest.importorskip("torch")
    from rlt.spec.trainer_args import range_problem

    param = [torch.nn.Parameter(torch.zeros(1))]
    for value in (-0.1, 0.0, 0.5, 0.999, 1.0, 1.5):
        for key, kwargs in (
            ("adam_beta1", {"betas": (value, 0.9)}),
            ("adam_beta2", {"betas": (0.9, value)}),
            ("adam_epsilon", {"eps": value}),
        ):
            try:
                torch.optim.AdamW(param, **kwargs)
                torch_ok = True
            except ValueError:
                torch_ok = False
            assert torch_ok == (range_problem(key, value) is None), (key, value)


def test_the_seed_bound_is_numpys():
    np = pytest.importorskip("numpy")
    from rlt.spec.run import MAX_SEED

    np.random.seed(MAX_SEED)
    with pytest.raises(ValueError):
        np.random.seed(MAX_SEED + 1)


# ------------------------------------------------------------------------------------------------- counterexamples


@pytest.mark.parametrize(
    "patch",
    [
        # every trainer stage's batch against the processes, not only the first (the CRD says each)
        {"resources": {"trainer": {"gpus": 8}}, "stages": {"student": {"enabled": True}}},
        # a refusal inside the tolerations hid the cross-field rules of the spec
        {"resources": {"trainer": {"gpus": 8}}, "scheduling": {"tolerations": [{"operator": "Equal"}]}},
        # evalFraction named where the CRD names it
        {"dataset": {"source": "org/data"}, "stages": {"evaluate": {"enabled": True}}},
        # a key that reads as a number (`1e5:`) is text to the API server: an unknown field, and the spec's other
        # rules still run (the long run's 2,000th example: rlt said only "Keys should be strings")
        {"resources": {"1e5": None, "trainer": {"gpus": 8}}},
        # a NUL in a path: the OS's "embedded null byte" traceback (the final long run's 2,590th example)
        {"format": {"file": "\x00"}},
        # a float where the CRD's integer enum is: the Literal took 0.0 as 0 (the final long run, 6,000th example)
        {"stages": {"student": {"deepspeedZeroStage": 0.0}}},
        # a null in a nullable field is absent to the server's CEL (kube-apiserver 1.36 accepts it, the harness did not)
        {"stages": {"rl": {"generation": {"mode": "server", "maxModelLen": None}}}},
        {"method": None, "stages": {"student": {"deepspeedZeroStage": 0.0}}},
        {"dataset": {"source": "data\x00.jsonl"}, "teacher": {"model": "a\x00b"}},
    ],
)
def test_counterexamples_of_the_property_test(patch, tmp_path):
    doc = yaml.safe_load(_patched(patch))
    check_door(doc, tmp_path)
    del doc["metadata"]  # a document with no metadata: the CRD harness said nothing, rlt refuses it
    check_door(doc, tmp_path)


def test_the_run_the_operator_hands_its_pods_reads_back_the_same():
    """dump_run (the pods' spec) quotes what the strict reader would read otherwise: a label value `y`, a column
    `1e5`, a tag `0o7` come back as the same text, not as a refusal or a number."""
    from rlt.spec.loading import dump_run, parse_run
    from rlt.spec.reader import load_yaml

    doc = tiny_doc()
    doc["spec"]["scheduling"] = {"nodeSelector": {"pool": "y"}}
    doc["spec"]["dataset"]["columns"] = {"question": "1e5", "solution": "0o7", "reasoningTrace": "on"}
    run = parse_run(doc)
    (again,) = load_yaml(dump_run(run))
    assert parse_run(again) == run


def test_the_kubernetes_definitions_are_kubernetes_validates_for_the_charts_floor():
    """spec/k8s_api.json is the package's schema of the chart's oldest Kubernetes (`hack/generate.py k8s-api`)."""
    pytest.importorskip("kubernetes_validate")
    from rlt.spec import k8s_api

    chart = yaml.safe_load((ROOT / "charts" / "rlt-operator" / "Chart.yaml").read_text())
    assert chart["kubeVersion"].startswith(f">={k8s_api.K8S_VERSION}")
    assert k8s_api.DEFS_FILE.read_text() == k8s_api.render(), "run `python hack/generate.py k8s-api`"


def test_a_quantity_with_a_huge_exponent_is_read_at_once():
    """`1e999999999` is a quantity by the CRD's pattern; Python raising 10 to it took minutes (the hang in the long
    property run; the run files 'huge-quantity' and 'quantity-exponent' above are refused at once). A tiny one is
    read as the API server rounds it (up to 1n), and the CRD harness reads both without hanging."""
    from test_crd_cel import crd_refusals

    from rlt.spec.k8s import quantity_value

    assert quantity_value("9e-999999999") == quantity_value("1n")
    assert quantity_value("1e999999999") > 2**63
    crd_refusals(yaml.safe_load(RUN_FILES["huge-quantity"][0]))
