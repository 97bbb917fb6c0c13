"""The generated tables of docs/: spec.md's field table from the spec model, metrics.md's from the metric catalogue,
operator.md's pod environment from its table, gpu-cluster.md's sizing from the capacity plan, architecture.md's floor
matrices from hack/import_graph.py (so the reference cannot drift from the code). `python hack/generate.py docs`
writes them; tests compare them."""

from __future__ import annotations

import typing
from pathlib import Path

import import_graph  # hack/, beside this file (on the path of whoever imports it: generate.py, hack_module)
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from rlt.spec.run import RLTRunSpec


def _type_name(annotation) -> str:
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:  # a str with validators (a quantity, a path): named by what it holds
        return _type_name(typing.get_args(annotation)[0])
    if origin is typing.Literal:
        return " \\| ".join(repr(a).replace("'", "") for a in typing.get_args(annotation))
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        return " \\| ".join(_type_name(a) for a in typing.get_args(annotation) if a is not type(None)) + " (optional)"
    if origin in (list, dict):
        return f"{origin.__name__}[{', '.join(_type_name(a) for a in typing.get_args(annotation))}]"
    return getattr(annotation, "__name__", str(annotation))


def _rows(model: type[BaseModel], prefix: str) -> list[str]:
    rows = []
    for name, field in model.model_fields.items():
        key = f"{prefix}.{field.alias or name}"
        ann = field.annotation
        nested = ann if isinstance(ann, type) and issubclass(ann, BaseModel) else None
        if nested is None:
            for arg in typing.get_args(ann):
                if isinstance(arg, type) and issubclass(arg, BaseModel):
                    nested = arg
        if nested is not None and typing.get_origin(ann) is not list:
            doc = (
                field.description or (nested.__doc__ or "").strip().splitlines()[0]
                if (field.description or nested.__doc__)
                else ""
            )
            rows.append(f"| `{key}` | object | | {doc.replace('|', '/')} |")
            rows += _rows(nested, key)
            continue
        if field.default is not PydanticUndefined:
            default = f"`{field.default}`" if field.default is not None else "—"
        elif field.default_factory is not None:
            default = f"`{field.default_factory()}`"
        else:
            default = "**required**"
        limits = [
            f"{k} {getattr(m, k)}"
            for m in field.metadata
            for k in ("gt", "ge", "lt", "le", "min_length")
            if getattr(m, k, None) is not None
        ]
        desc = (field.description or "") + (f" ({', '.join(limits)})" if limits else "")
        # a name checked against a table (spec.method: the method table) lists the table's names as a Literal would
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        kind = " \\| ".join(extra["enum"]) if isinstance(extra.get("enum"), list) else _type_name(ann)
        rows.append(f"| `{key}` | {kind} | {default} | {desc.replace('|', '/')} |")
    return rows


def replace_between(text: str, begin: str, end: str, body: str) -> str:
    return text[: text.index(begin) + len(begin)] + "\n" + body + "\n" + text[text.index(end) :]


DOCS = Path(__file__).resolve().parents[1] / "docs"


def regenerate(docs_dir: str | Path = DOCS) -> None:
    """`make docs`: rewrite the generated tables of docs/spec.md, docs/metrics.md, docs/operator.md,
    docs/gpu-cluster.md and the floor matrices of docs/architecture.md."""
    from pathlib import Path

    from rlt.contract import env, metrics

    for name, marker, body in (
        ("spec.md", "SPEC", spec_table()),
        ("metrics.md", "METRICS", metrics.markdown_table()),
        ("operator.md", "POD ENV", env.markdown_table()),
        ("gpu-cluster.md", "SIZING", sizing_table(Path(docs_dir).resolve().parent / "manifests" / "examples")),
        ("gpu-cluster.md", "STOP COST", stop_cost_table(Path(docs_dir).resolve().parent / "manifests" / "examples")),
        ("architecture.md", "RLT FLOORS", floors_block("rlt")),
        ("architecture.md", "OPERATOR FLOORS", floors_block("rlt_operator")),
    ):
        path = Path(docs_dir) / name
        path.write_text(
            replace_between(path.read_text(), f"<!-- BEGIN {marker} TABLE -->", f"<!-- END {marker} TABLE -->", body)
        )


def floors_block(package: str) -> str:
    """hack/import_graph.py's matrix of `package`'s floors (how many imports each floor makes of each below it)."""
    floors, _ = import_graph.PACKAGE_FLOORS[package]
    table = import_graph.floor_table(import_graph.subpackage_imports(import_graph.graph(), package), floors)
    return f"```\n{table}\n```"


def spec_table() -> str:
    return "\n".join(["| field | type | default | meaning |", "|---|---|---|---|"] + _rows(RLTRunSpec, "spec"))


# The examples meant for a GPU cluster, sized in docs/gpu-cluster.md from their capacity plan.
SIZED_EXAMPLES = (
    "rltrun-paper-7b.yaml",
    "rltrun-multinode.yaml",
    "rltrun-2x8.yaml",
    "rltrun-small-2gpu.yaml",
    "rltrun-lora-tracked.yaml",
)


def sizing_table(examples_dir) -> str:
    """docs/gpu-cluster.md's sizing section: `rlt plan` of each GPU example on 80Gi GPUs, one row per stage and
    resource (the numbers come from rlt.checks.capacity, never from hand)."""
    from pathlib import Path

    from rlt.checks.capacity import gib, plan_for_run
    from rlt.checks.validation import load_valid_run

    rows = ["| example | stage | resource | planned | has |", "|---|---|---|---|---|"]
    for name in SIZED_EXAMPLES:
        run = load_valid_run(Path(examples_dir) / name)
        plan = plan_for_run(run.spec, build=False)
        for c in plan.checks:
            has = gib(c.limit) if c.limit is not None else "-"
            rows.append(f"| `{name}` | {c.stage} | {c.resource} | {gib(c.total)} | {has} |")
    return "\n".join(rows)


# The paper-scale examples whose stop costs docs/gpu-cluster.md tabulates.
STOP_COST_EXAMPLES = ("rltrun-paper-7b.yaml", "rltrun-2x8.yaml")


def stop_cost_table(examples_dir) -> str:
    """docs/gpu-cluster.md's "what a stop costs": per paper-scale example, each phase of an rl step a stop may wait
    for (with its bound), the save at the write rate the plan assumed, the grace period `rlt plan` prints, and the
    goodput (rlt.checks.step_time; the numbers come from the plan, never from hand)."""
    from pathlib import Path

    from rlt.checks.capacity import plan_for_run
    from rlt.checks.goodput import goodput
    from rlt.checks.step_time import minutes, trainer_grace_period, trainer_step_times, write_rate
    from rlt.checks.validation import load_valid_run

    rows = ["| phase (rl step) | bound | " + " | ".join(f"`{n}`" for n in STOP_COST_EXAMPLES) + " |"]
    rows.append("|---|---|" + "---|" * len(STOP_COST_EXAMPLES))
    cells: dict[str, list[str]] = {}
    bounds = {
        "rollout": "decoding step by step, the batch emptying in its tail (rlt.checks.decode_tail) + weight transfer",
        "scoring": "the reward student's forward over the rank's rows",
        "reference pass": "one forward, × rank imbalance (the old-policy pass is folded into the update's forward)",
        "one micro-batch": "rows of the longest allowed length (forward, backward, recompute)",
        "save": "checkpoint bytes / write rate + 60 s (a stop's; a periodic save blocks for the local write)",
        "write rate assumed": "storage.writeBytesPerSecond, else the default",
        "grace period `rlt plan` prints": (
            "the sum of the above, the decoding at least the earlier bound (a stop may arrive at any phase)"
        ),
        "one step": (
            "rollout + scoring + passes + update (one step off: the longer of decoding and the rest, + sync; partial "
            "rollouts: the decoding at full slots + KV recompute)"
        ),
        "goodput": "the algorithm's work over held GPU-seconds (docs/goodput.md); largest loss",
    }
    for name in STOP_COST_EXAMPLES:
        spec = load_valid_run(Path(examples_dir) / name).spec
        plan = plan_for_run(spec, build=False)
        t = next(x for x in trainer_step_times(spec, plan.shapes) if x.stage == "rl")
        g = goodput(t)
        values = {
            "rollout": minutes(t.rollout),
            "scoring": minutes(t.scoring),
            "reference pass": f"{minutes(t.passes)} ({t.passes_name})" if t.passes else "-",
            "one micro-batch": minutes(t.longest_micro),
            "save": minutes(t.save),
            "write rate assumed": f"{write_rate(spec)[0] / 1e6:.0f} MB/s",
            "grace period `rlt plan` prints": f"{trainer_grace_period(spec)[0]} s",
            "one step": minutes(t.step),
            "goodput": f"{g.share:.0%} ({g.losses[0][0]} {g.losses[0][1]:.0%})",
        }
        for key, value in values.items():
            cells.setdefault(key, []).append(value)
    rows += [f"| {key} | {bounds[key]} | " + " | ".join(cells[key]) + " |" for key in bounds]
    return "\n".join(rows)
