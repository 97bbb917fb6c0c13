"""The cases of benchmarks/door_fuzz.py: files made by mutating valid ones (run files of manifests/examples/, rows,
a model folder from the built-in tiny Qwen2, the bundled format, YAML bytes), each from a seeded random.Random."""

from __future__ import annotations

import copy
import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = {p.stem: yaml.safe_load(p.read_text()) for p in sorted((ROOT / "manifests" / "examples").glob("*.yaml"))}
TINY = EXAMPLES["rltrun-tiny"]
DEFAULT_FORMAT = yaml.safe_load((ROOT / "training" / "rlt" / "method" / "formats" / "default.yaml").read_text())
TINY_MODEL = "tiny-qwen2-v1"  # rlt's built-in tiny Qwen2 (rlt.data.models), built once in the user's cache
INVISIBLE = "\u200b\u200c\u200d\u2060\ufeff\u200e\u202e\u3164\u2800\u00ad"
SPECIAL = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "<|begin_of_thought|>", "<answer>"]

# ------------------------------------------------------------------------------------------------ values

# Near-valid values of fields the door checks by a consumer's rule: most are valid, each pool has its edge cases.
POOLS: dict[str, list[Any]] = {
    "seed": [0, 1, 42, 2**31, 2**63 - 1, 2**63, -1, 1.0, 1.5, "7"],
    "teacher.revision": ["main", "v1.0", "0123abcd", "", " ", "a b", "refs/pr/1", None],
    "dataset.split": ["train", "test", "train[:10]", "", " ", "train[:50%]"],
    "scheduling.queueName": ["team-a", "a", "Team_A", "", "x" * 64, "team-a.b", None],
    "scheduling.nodeSelector": [
        {"kubernetes.io/arch": "amd64"},
        {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.memory": "81559"},
        {"a": "1", "b": "2"},
        {"a ": "x"},
        {"": "x"},
        {"a/b/c": "x"},
        {"example.com/": "x"},
        {"1": "x", "true": "y"},
    ],
    "outputs": [
        {"teacher": "s3://my-bucket/teacher"},
        {"teacher": "s3://my-bucket/t", "student": "s3://my-bucket/s"},
        {"teacher": "s3://my-bucket/t", "student": "s3://my-bucket/t/s"},
        {"teacher": "gs://my-bucket/x", "student": "gcs://my-bucket/x"},
        {"teacher": "file:///tmp/out/t", "student": "file:///tmp/out/./t"},
        {"teacher": "file:///data/tiny/exported"},
        {"student": "file:///data/out"},
        {"teacher": "file:///tmp/out/t"},
        {"distillDataset": "s3://my-bucket/d", "teacher": "s3://my-bucket/d/"},
        {"teacher": "hf://org/model"},
        {"teacher": "hf://Org/Model", "student": "hf://org/model"},
        {"teacher": "s3://ab/x"},
        {"teacher": "s3://My_Bucket/x"},
    ],
    "env": [
        [{"name": "X", "value": "1"}],
        [{"name": "X", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
        [{"name": "X", "valueFrom": {"fieldRef": {"fieldPath": "spec.nope"}}}],
        [{"name": "X", "valueFrom": {"resourceFieldRef": {"resource": "limits.nope"}}}],
        [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "s", "key": "..data"}}}],
        [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "s", "key": "token"}}}],
        [{"name": "X", "valueFrom": {}}],
        [{"name": "X", "value": "1", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}],
        [{"name": "1X", "value": "1"}],
    ],
    "storage.writeBytesPerSecond": ["250M", "1Gi", "1n", "1Ei", 100_000_000, "1e9", "0", "-1M"],
    "stages.rl.generation": [{"mode": "server"}, {"mode": "inprocess"}, {"mode": "server", "maxModelLen": 4096}],
    "resources.generator": [{"gpus": 1}, {"gpus": 2, "tensorParallelSize": 2}, {"gpus": 3, "tensorParallelSize": 3}],
    "teacher.model": ["builtin:tiny-qwen2", "Qwen/Qwen2.5-7B-Instruct", "org/m@dev", "./missing-model", "builtin:x"],
    "dataset.source": ["builtin:arithmetic", "builtin:sums", "org/data", "./missing.jsonl", "builtin:nope"],
}


def nudge(rng: random.Random, value: Any) -> Any:
    """A value near `value`: most nudges keep its type, some move it past a bound or change it."""
    if isinstance(value, bool):
        return rng.choice([not value, None, "true", 1])
    if isinstance(value, int):
        return rng.choice(
            [value + 1, value - 1, value * 2, 0, -1, -value, 2**63, value * 1000, float(value), str(value)]
        )
    if isinstance(value, float):
        return rng.choice([value * 10, value / 10, 0.0, -value, 1e300, float("inf"), float("nan"), int(value)])
    if isinstance(value, str):
        return rng.choice(
            [
                "",
                " ",
                value + " ",
                value.upper(),
                value + "x",
                value[: len(value) // 2],
                value + rng.choice(INVISIBLE),
                value + rng.choice(SPECIAL),
                value * 3,
            ]
        )
    if isinstance(value, list):
        return rng.choice([[], value + value[:1], value[1:], None])
    if isinstance(value, dict):
        return rng.choice([{}, None, {**value, "unknownField": 1}])
    return rng.choice([0, "", [], {}])


def leaves(node: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [path] if path else []
    if isinstance(node, dict):
        for k, v in node.items():
            out += leaves(v, (*path, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += leaves(v, (*path, i))
    return out


def set_at(doc: Any, path: tuple[Any, ...], value: Any, delete: bool = False) -> None:
    node = doc
    for p in path[:-1]:
        if isinstance(node, dict):
            if not isinstance(node.get(p), (dict, list)):
                node[p] = {}
            node = node[p]
        else:
            node = node[p]
    if delete:
        node.pop(path[-1])
    else:
        node[path[-1]] = value


def mutate_run(rng: random.Random, doc: dict[str, Any]) -> None:
    for _ in range(rng.choice([0, 1, 1, 1, 2, 2, 3])):
        kind = rng.random()
        if kind < 0.45:
            key = rng.choice(list(POOLS))
            set_at(doc, ("spec", *key.split(".")), copy.deepcopy(rng.choice(POOLS[key])))
        elif not leaves(doc["spec"]):
            continue
        elif kind < 0.85:
            path = rng.choice(leaves(doc["spec"]))
            node = doc["spec"]
            for p in path:
                node = node[p]
            set_at(doc, ("spec", *path), nudge(rng, node))
        else:
            path = rng.choice(leaves(doc["spec"]))
            set_at(doc, ("spec", *path), None, delete=True)


# kubectl (YAML 1.1) reads these plain keys and values otherwise than YAML 1.2; the text edits put them in.
YAML11 = ["0x1", "1.0", "1e2", "+1", "True", "TRUE", "0o17", "0b11", "yes", "on", "~", "010", "1_000", ".inf"]


def edit_text(rng: random.Random, text: str) -> str:
    lines = text.splitlines()
    for _ in range(rng.choice([1, 1, 2])):
        i = rng.randrange(len(lines))
        choice = rng.random()
        if choice < 0.25:
            lines.insert(i, lines[i])  # a key given twice, or a list item doubled
        elif choice < 0.5 and ":" in lines[i]:
            key, _, rest = lines[i].partition(":")
            lines[i] = f"{key}: {rng.choice(YAML11)}" if rest.strip() else lines[i]
        elif choice < 0.75:
            indent = len(lines[i]) - len(lines[i].lstrip())
            lines.insert(i + 1, " " * indent + f"{rng.choice(YAML11)}: {rng.choice(['a', '1', 'x y'])}")
        else:
            lines[i] = " " + lines[i] if rng.random() < 0.5 else lines[i].lstrip()
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------------ families


def case_run(rng: random.Random, folder: Path) -> list[str]:
    name = rng.choice(list(EXAMPLES))
    doc = copy.deepcopy(EXAMPLES[name])
    mutate_run(rng, doc)
    text = yaml.safe_dump(doc, allow_unicode=True, sort_keys=False)
    if rng.random() < 0.25:
        text = edit_text(rng, text)
    (folder / "run.yaml").write_text(text)
    return ["--no-data", *(["--no-plan"] if rng.random() < 0.5 else []), str(folder / "run.yaml")]


QUESTIONS = [("What is 2 + 3?", "5"), ("What is 7 * 6?", "42"), ("Sort 3, 1, 2.", "1, 2, 3"), ("Is 7 prime?", "yes")]


def make_row(rng: random.Random, chat: bool) -> dict[str, Any]:
    q, a = rng.choice(QUESTIONS)
    trace = f"We compute it: the answer is {a}."
    if chat:
        turns = [
            {"from": "human", "value": q},
            {"from": "gpt", "value": f"<think>{trace}</think>\n<answer>{a}</answer>"},
        ]
        if rng.random() < 0.3:
            turns = [{"role": "user" if t["from"] == "human" else "assistant", "content": t["value"]} for t in turns]
        row: dict[str, Any] = {"conversations": turns}
    else:
        row = {"question": q, "solution": a, "reasoning_trace": trace}
    if rng.random() < 0.15:  # a nudged row: a field emptied, spaced, hidden, tagged, doubled, typed otherwise
        path = rng.choice(leaves(row))
        node: Any = row
        for p in path:
            node = node[p]
        set_at(row, path, nudge(rng, node))
    if rng.random() < 0.03:
        row[rng.choice(["question", "solution", "conversations"])] = rng.choice(INVISIBLE) * 3
    return row


def write_rows(rows: list[dict[str, Any]], path: Path, kind: str) -> None:
    if kind == "jsonl":
        path.write_text("".join(json.dumps(r, allow_nan=True) + "\n" for r in rows))
    elif kind == "json":
        path.write_text(json.dumps(rows, allow_nan=True))
    else:
        import pandas as pd

        frame = pd.DataFrame([{k: v if isinstance(v, str) else json.dumps(v) for k, v in r.items()} for r in rows])
        if kind == "csv":
            frame.to_csv(path, index=False)
        else:
            frame.to_parquet(path)


def case_rows(rng: random.Random, folder: Path) -> list[str]:
    chat = rng.random() < 0.3
    rows = [make_row(rng, chat) for _ in range(rng.randint(1, 8))]
    kind = rng.choice(["jsonl"] * 5 + ["json", "csv", "parquet"])
    if rng.random() < 0.15:  # a folder of two files, sometimes of two formats
        source = folder / "data"
        source.mkdir()
        other = kind if rng.random() < 0.6 else rng.choice(["jsonl", "parquet", "csv"])
        cut = len(rows) // 2
        write_rows(rows[:cut] or rows, source / f"a.{kind}", kind)
        write_rows(rows[cut:] or rows, source / f"b.{other}", other)
        rows_written = len(rows[:cut] or rows) + len(rows[cut:] or rows)
    else:
        source = folder / f"rows.{kind}"
        write_rows(rows, source, kind)
        rows_written = len(rows)
    doc = copy.deepcopy(TINY)
    doc["spec"]["dataset"] = {"source": source.name}
    if chat:
        doc["spec"]["dataset"]["layout"] = "conversations"
        doc["spec"]["stages"]["sft"] = {"enabled": False}
    (folder / "run.yaml").write_text(yaml.safe_dump(doc))
    (folder / "rows.count").write_text(str(rows_written))
    return ["--no-plan", str(folder / "run.yaml")]


def _swap_entry(rng: random.Random, path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
    how = rng.choice(["loop", "device", "folder", "dangling", "fifo", "empty"])
    if how == "loop":
        path.symlink_to(path.name)
    elif how == "device":
        path.symlink_to("/dev/zero")
    elif how == "folder":
        path.mkdir()
    elif how == "dangling":
        path.symlink_to("/nonexistent/x")
    elif how == "fifo":
        os.mkfifo(path)
    else:
        path.write_text("")


def case_model(rng: random.Random, folder: Path, cache: Path) -> list[str]:
    model = folder / "model"
    shutil.copytree(cache / "models" / TINY_MODEL, model, ignore=shutil.ignore_patterns("*.safetensors"))
    for _ in range(rng.choice([0, 1, 1, 2])):
        name = rng.choice(["config.json"] * 3 + ["tokenizer_config.json", "tokenizer.json", "chat_template.jinja"])
        path = model / name
        roll = rng.random()
        if roll < 0.08:
            _swap_entry(rng, path)
        elif roll < 0.2 and path.is_file():
            text = path.read_text()
            path.write_text(text[: rng.randrange(len(text) or 1)])
        elif name.endswith(".json") and path.is_file():
            try:
                data = json.loads(path.read_text())
            except ValueError:  # cut short by an earlier mutation of this case
                continue
            if isinstance(data, dict) and data:
                key = rng.choice(list(data)) if rng.random() < 0.7 else rng.choice(["chat_template", "head_dim"])
                data[key] = nudge(rng, data.get(key, 64))
                if rng.random() < 0.1:
                    data.pop(key)
            path.write_text(json.dumps(data, allow_nan=True))
        elif path.is_file():
            path.write_text(rng.choice(["{{ messages[0]['content'] }}", "{% for m in messages %}", "", "{{ 1/0 }}"]))
    if rng.random() < 0.05:
        _swap_entry(rng, model)
    doc = copy.deepcopy(TINY)
    doc["spec"]["teacher"]["model"] = "./model"
    doc["spec"]["student"]["model"] = "./model" if rng.random() < 0.5 else "builtin:tiny-qwen2"
    if rng.random() < 0.4:
        doc["spec"]["stages"]["rl"]["generation"] = {"mode": "server"}
        doc["spec"]["resources"]["generator"] = rng.choice(POOLS["resources.generator"])
    (folder / "run.yaml").write_text(yaml.safe_dump(doc))
    return [str(folder / "run.yaml")]


def case_format(rng: random.Random, folder: Path) -> list[str]:
    fmt = copy.deepcopy(DEFAULT_FORMAT)
    for _ in range(rng.choice([0, 1, 1, 2])):
        if not leaves(fmt):
            break
        path = rng.choice(leaves(fmt))
        node: Any = fmt
        for p in path:
            node = node[p]
        if rng.random() < 0.15 and len(path) > 0:
            set_at(fmt, path, None, delete=True)
        else:
            set_at(fmt, path, nudge(rng, node) if rng.random() < 0.7 else rng.choice(SPECIAL))
    text = yaml.safe_dump(fmt, allow_unicode=True, sort_keys=False)
    (folder / "fmt.yaml").write_text(edit_text(rng, text) if rng.random() < 0.1 else text)
    doc = copy.deepcopy(TINY)
    doc["spec"]["format"] = {"file": "fmt.yaml"}
    (folder / "run.yaml").write_text(yaml.safe_dump(doc))
    return ["--no-plan", str(folder / "run.yaml")]


def case_yaml(rng: random.Random, folder: Path) -> list[str]:
    data = bytearray(yaml.safe_dump(copy.deepcopy(EXAMPLES[rng.choice(list(EXAMPLES))]), sort_keys=False).encode())
    for _ in range(rng.choice([1, 1, 2, 3])):
        i = rng.randrange(len(data))
        roll = rng.random()
        if roll < 0.3:
            del data[i : i + rng.randint(1, 8)]
        elif roll < 0.6:
            data[i:i] = data[i : i + rng.randint(1, 16)]
        elif roll < 0.8:
            data[i] = rng.choice(b"\t :-[]{}#&*!|>'\"%@`,?\x00\xff\n")
        else:
            data[i:i] = rng.choice(["\u00a0", "\ufeff", "\u2028", "\t"]).encode()
    (folder / "run.yaml").write_bytes(bytes(data))
    return ["--no-data", "--no-plan", str(folder / "run.yaml")]


MAKERS = {
    "run": lambda rng, folder, cache: case_run(rng, folder),
    "rows": lambda rng, folder, cache: case_rows(rng, folder),
    "model": case_model,
    "format": lambda rng, folder, cache: case_format(rng, folder),
    "yaml": lambda rng, folder, cache: case_yaml(rng, folder),
}
