"""The capacity plan (rlt plan): the examples fit what they ask for, misfits name the field, shapes are counted on
real models; and the defects it exposed (retention, cuda-ness, timeouts, probes) stay fixed."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from suite_helpers import EXAMPLES

from rlt.checks.capacity import gib, plan_for_run, render
from rlt.checks.model_shape import KNOWN_CONFIGS, known_shape
from rlt.checks.plan_terms import DS_MAX_LIVE_PARAMETERS
from rlt.cli import main
from rlt.spec.budgets import DEFAULT_COLLECTIVE_TIMEOUT_S, collective_timeout_seconds, rollout_seconds
from rlt.spec.loading import parse_run

SIZED = ["rltrun-paper-7b.yaml", "rltrun-multinode.yaml", "rltrun-small-2gpu.yaml", "rltrun-lora-tracked.yaml"]


def _doc(name="rltrun-paper-7b.yaml"):
    return yaml.safe_load((EXAMPLES / name).read_text())


@pytest.mark.parametrize("name", SIZED)
def test_examples_fit_the_gpus_and_volume_they_ask_for(name):
    plan = plan_for_run(parse_run(_doc(name)).spec)
    assert plan.checks and not plan.notes, plan.notes  # every shape was read, nothing left unplanned
    assert plan.failures == [], plan.errors()


def test_unbounded_checkpoints_fill_the_paper_volume_naming_the_field():
    doc = _doc()
    doc["spec"]["stages"]["sft"]["saveTotalLimit"] = None
    errors = plan_for_run(parse_run(doc).spec).errors()
    assert len(errors) == 1 and "stages.sft.saveTotalLimit" in errors[0] and "volume" in errors[0], errors


def test_a_70b_teacher_does_not_fit_and_the_plan_names_the_resources():
    doc = _doc()
    doc["spec"]["teacher"]["model"] = "Qwen/Qwen2.5-72B-Instruct"
    errors = "\n".join(plan_for_run(parse_run(doc).spec).errors())
    assert "sft: GPU memory per trainer process" in errors and "resources.trainer.gpus" in errors
    assert "vLLM generator GPU" in errors and "resources.generator.tensorParallelSize" in errors


def test_cli_exit_code_and_validate_run_the_plan(tmp_path, capsys):
    assert main(["plan", str(EXAMPLES / "rltrun-paper-7b.yaml")]) == 0
    out = capsys.readouterr().out
    assert "rl       GPU memory per trainer process" in out and "reward student" in out
    doc = _doc()
    doc["spec"]["storage"]["size"] = "200Gi"
    bad = tmp_path / "small-volume.yaml"
    bad.write_text(yaml.safe_dump(doc))
    assert main(["plan", str(bad)]) == 1
    assert "change storage.size" in capsys.readouterr().err
    assert main(["validate", "--no-data", str(bad)]) == 1
    assert "capacity: all: run volume" in capsys.readouterr().err


def test_plan_json_carries_the_texts_figures_and_exit_code(tmp_path, capsys):
    """`rlt plan -o json`: one document on stdout; each run's goodput share per stage is the text's percentage, its
    checks' bytes are the table's, its errors the lines on stderr, and the exit code the text's."""
    import json
    import re

    paper = str(EXAMPLES / "rltrun-paper-7b.yaml")
    assert main(["plan", paper]) == 0
    text = capsys.readouterr().out
    assert main(["plan", "-o", "json", paper]) == 0
    (plan,) = json.loads(capsys.readouterr().out)["plans"]
    assert plan["fits"] and plan["errors"] == [] and plan["run"] == "rlt-qwen7b-paper"
    for stage, g in plan["goodput"].items():
        said = re.search(rf"goodput: {stage}: (\d+)% of the (\d+) GPUs' held GPU-seconds .*?; (\d+)% counting", text)
        assert said and (round(g["share"] * 100), g["gpus"], round(g["strict"] * 100)) == tuple(
            int(x) for x in said.groups()
        ), (stage, g, said)
        assert 0 < g["share"] <= 1 and g["losses"] == sorted(g["losses"], key=lambda x: -x["share"])
    assert set(plan["goodput"]) == {"sft", "rl"}
    first = plan["checks"][0]
    row = f"{first['stage']:<9}{first['resource']:<78}{gib(first['needBytes']):>11}{gib(first['hasBytes']):>11}  ok"
    assert row in text, row
    doc = _doc()
    doc["spec"]["storage"]["size"] = "200Gi"
    bad = tmp_path / "small-volume.yaml"
    bad.write_text(yaml.safe_dump(doc))
    assert main(["plan", "-o", "json", str(bad)]) == 1
    out = capsys.readouterr()
    (plan,) = json.loads(out.out)["plans"]
    assert not plan["fits"] and plan["errors"] and all(f"{bad}: {e}" in out.err for e in plan["errors"])
    assert any(not c["fits"] and c["change"].startswith("storage.size") for c in plan["checks"])


def test_gpu_memory_comes_from_the_nodeselector_label_when_the_run_selects_by_it(tmp_path, capsys):
    """nvidia.com/gpu.memory (MiB, NVIDIA GPU feature discovery) in spec.scheduling.nodeSelector is the GPU the plan
    assumes: the paper run on 40 GB A100s does not fit; with no label the plan assumes 80Gi; --gpu-memory wins."""
    from rlt.checks.capacity import DEFAULT_GPU_MEMORY, GPU_MEMORY_LABEL, spec_gpu_memory

    doc = _doc()
    assert spec_gpu_memory(parse_run(doc).spec) == (DEFAULT_GPU_MEMORY, "the default 80.0 GiB")
    doc["spec"].setdefault("scheduling", {}).setdefault("nodeSelector", {})[GPU_MEMORY_LABEL] = "40960"
    spec = parse_run(doc).spec
    assert spec_gpu_memory(spec)[0] == 40 * 2**30
    a100_40 = tmp_path / "a100-40.yaml"
    a100_40.write_text(yaml.safe_dump(doc))
    assert main(["plan", str(a100_40)]) == 1
    out = capsys.readouterr()
    assert "capacity plan for 40.0 GiB GPUs" in out.out and "resources.trainer.gpus" in out.err
    assert main(["plan", "--gpu-memory", "80Gi", str(a100_40)]) == 0


def test_parameter_counts_are_the_real_models(tmp_path):
    """The shape counted on an empty model equals the parameters of the real built-in model, and a LoRA adapter's
    count equals PEFT's trainable parameters on it."""
    from peft import LoraConfig, get_peft_model

    from rlt.checks.shapes import read_shape
    from rlt.data.models import load_model
    from rlt.spec.inputs import ModelRef

    ref = ModelRef(model="builtin:tiny-qwen2")
    shape, why = read_shape(ref)
    assert shape is not None, why
    model = load_model(ref, "cpu")
    assert shape.params == sum(p.numel() for p in model.parameters())
    targets = ["q_proj", "v_proj", "down_proj"]
    peft = get_peft_model(model, LoraConfig(r=4, target_modules=targets, task_type="CAUSAL_LM"))
    assert shape.lora_params(4, targets) == sum(p.numel() for p in peft.parameters() if p.requires_grad)


def test_unknown_model_is_said_not_guessed():
    doc = _doc()
    doc["spec"]["student"]["model"] = "nobody/not-a-cached-model"
    plan = plan_for_run(parse_run(doc).spec)
    assert any("nobody/not-a-cached-model" in n and "config" in n for n in plan.notes)


def test_collective_timeouts_cover_the_rollout():
    spec = parse_run(_doc()).spec
    # 1024 completions of 16384 tokens over 4 vLLM data-parallel engines, plus the server wait
    assert rollout_seconds(spec, "rl") == 600 + 16384 // 10 + 1
    assert collective_timeout_seconds(spec, "rl") > DEFAULT_COLLECTIVE_TIMEOUT_S + 1800
    assert collective_timeout_seconds(spec, "sft") == DEFAULT_COLLECTIVE_TIMEOUT_S


def test_trainer_options_carry_the_spec_timeout_and_retention(tmp_path, monkeypatch):
    from suite_helpers import tiny_doc

    from rlt.contract.layout import RunLayout
    from rlt.stages.context import StageContext
    from rlt.stages.trainer import trainer_options

    monkeypatch.setenv("WORLD_SIZE", "1")
    run = parse_run(tiny_doc())
    opts = trainer_options(StageContext(run, RunLayout(tmp_path), device="cpu"), "rl", "cpu")
    assert opts["ddp_timeout"] == collective_timeout_seconds(run.spec, "rl") > DEFAULT_COLLECTIVE_TIMEOUT_S
    assert opts["save_total_limit"] is None  # rlt rotates once a new checkpoint is complete (checkpoints.rotate)
    for stage in ("sft", "rl", "student"):
        assert getattr(run.spec.stages, stage).save_total_limit == 2


@pytest.mark.parametrize("device,cuda", [("cuda:0", True), ("cuda", True), ("cuda:3", True), ("cpu", False)])
def test_one_helper_decides_cuda_and_auto_dtype_follows_it(device, cuda):
    import torch

    from rlt.data.models import is_cuda, torch_dtype
    from rlt.spec.inputs import ModelRef

    assert is_cuda(device) is cuda
    # "cuda:N" is what every launched rank gets (rank_device): auto must mean bf16 there, not fp32
    assert torch_dtype(ModelRef(model="x"), device) == (torch.bfloat16 if cuda else torch.float32)


def test_process_group_gets_the_spec_timeout(monkeypatch):
    """join_process_group passes its timeout to torch (spied: the call is recorded, then made for real in a world
    of one over loopback)."""
    from datetime import timedelta

    import torch.distributed as dist
    from suite_helpers import free_port

    from rlt.stages.ranks import join_process_group

    seen = {}
    real = dist.init_process_group

    def spy(**kw):  # hand-written spy around the real call
        seen.update(kw)
        real(
            backend=kw["backend"],
            timeout=kw["timeout"],
            init_method=f"tcp://127.0.0.1:{free_port()}",
            rank=0,
            world_size=1,
        )

    monkeypatch.setattr(dist, "init_process_group", spy)
    monkeypatch.setenv("WORLD_SIZE", "2")  # join only when launched
    try:
        join_process_group("cpu", 7200)
        assert seen["timeout"] == timedelta(seconds=7200) and seen["backend"] == "gloo"
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_gpu_cluster_doc_sizing_is_the_plan_of_each_example():
    from suite_helpers import ROOT, hack_module

    sizing_table = hack_module("gen_docs").sizing_table

    table = sizing_table(EXAMPLES)
    assert "rltrun-paper-7b.yaml` | rl | GPU memory per trainer process" in table
    assert table in (ROOT / "docs" / "gpu-cluster.md").read_text(), "docs/gpu-cluster.md is stale: run make generate"


@pytest.mark.parametrize("head_trains", [True, False])
def test_the_loss_term_is_what_trls_chunked_lm_head_allocates(head_trains):
    """TRL's fused LM head (the SFT and GRPO loss) on CPU, forward and backward over two vocabulary chunks: the peak
    of what it allocates (torch.profiler's memory timeline) is the plan's CPU loss term within 20 %."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    from torch.profiler._memory_profiler import MemoryProfileTimeline
    from trl.kernels.chunked_logprob import TOKEN_CHUNK_SIZE
    from trl.trainer.utils import _CHUNKED_LOGPROB_CHUNK_SIZE, _ChunkedLogProbFunction

    from rlt.checks.capacity import lm_head_loss_bytes, trl_constant
    from rlt.checks.model_shape import ModelShape

    # the plan reads TRL's tile sizes from its source (no import of all of TRL in the preflight): the same values
    assert trl_constant("trl.trainer.utils", "_CHUNKED_LOGPROB_CHUNK_SIZE") == _CHUNKED_LOGPROB_CHUNK_SIZE
    assert trl_constant("trl.kernels.chunked_logprob", "TOKEN_CHUNK_SIZE") == TOKEN_CHUNK_SIZE

    tokens, hidden, vocab = 300, 64, _CHUNKED_LOGPROB_CHUNK_SIZE + 4000
    shape = ModelShape(0, 0, hidden, 1, 1, 1, hidden, hidden, vocab, None)
    h = torch.randn(tokens, hidden, requires_grad=True)
    w = torch.randn(vocab, hidden, requires_grad=head_trains)
    targets = torch.randint(0, vocab, (tokens,))
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True) as prof:
        logps = _ChunkedLogProbFunction.apply(h, w, None, targets, 1.0, _CHUNKED_LOGPROB_CHUNK_SIZE, None, 1.0)[0]
        logps.sum().backward()
    _, sizes = MemoryProfileTimeline(prof._memory_profile())._coalesce_timeline("cpu")
    measured = max(sum(s) for s in sizes)
    planned = lm_head_loss_bytes(shape, tokens, 4, gpu=False, head_trainable=head_trains)
    assert 0.8 < measured / planned < 1.2, (measured, planned)


def test_capacity_benchmark_runs_the_command_the_operator_renders(tmp_path, monkeypatch):
    """benchmarks/capacity.py measures what pods run: the trainer container's command from the operator's builders
    (an argument added there shows up), $(VAR)s expanded for this machine, the volume at the run's root, and only
    the entry point (`-m rlt.cli`, or `rlt` alone for one process) swapped for the measuring script."""
    import runpy

    from suite_helpers import ROOT

    from rlt_operator.builders import trainer

    bench = runpy.run_path(str(ROOT / "benchmarks" / "capacity.py"))
    rendered = trainer.trainer_command
    monkeypatch.setattr(trainer, "trainer_command", lambda spec, stage: [*rendered(spec, stage), "--added-by-operator"])
    script = tmp_path / "measure.py"
    for world, zero in ((1, 0), (2, 3)):
        doc = yaml.safe_load((EXAMPLES / "rltrun-tiny.yaml").read_text())
        doc["spec"]["resources"]["trainer"]["gpus"] = world
        doc["spec"]["stages"]["sft"]["batchSize"] = doc["spec"]["stages"]["sft"]["perDeviceBatchSize"] * world
        doc["spec"]["stages"]["sft"]["deepspeedZeroStage"] = zero
        cmd, env = bench["pod_command"](doc, "sft", tmp_path, script)
        assert cmd[-1] == "--added-by-operator" and "rlt.cli" not in cmd, cmd
        assert not any("$(" in a or a.startswith("/data") for a in cmd), cmd
        assert ["stage", "sft", "--config", "env:RLT_RUN_YAML", "--root", str(tmp_path)] == cmd[-7:-1]
        assert yaml.safe_load(env["RLT_RUN_YAML"])["spec"]["resources"]["trainer"]["gpus"] == world
        if world == 1:
            assert cmd[1] == str(script), cmd
        else:
            assert cmd[1:4] == ["launch", "--", "accelerate"] and cmd[cmd.index("--zero_stage") + 1] == "3", cmd
            assert cmd[cmd.index("--main_process_ip") + 1] == env["MASTER_ADDR"] == "127.0.0.1"
            assert cmd[cmd.index("--main_process_port") + 1] == env["MASTER_PORT"]
            assert cmd[cmd.index(str(script)) + 1] == "stage"


def test_the_volume_counts_the_hub_models_the_pods_download():
    """HF_HOME is on the run's volume: the paper run's teacher and student (two 7.6 B hub models saved in bf16) are
    part of its fullest moment; built-in models are not downloaded."""
    from rlt.checks.capacity import hub_downloads

    plan = plan_for_run(parse_run(_doc()).spec)
    (volume,) = [c for c in plan.checks if c.resource.startswith("run volume")]
    terms = dict(volume.terms)
    download = terms["hub models downloaded to the run's cache (HF_HOME on the volume)"]
    assert download == 2 * plan.shapes.teacher.params * 2, terms
    assert volume.total == sum(terms.values())
    tiny = parse_run(yaml.safe_load((EXAMPLES / "rltrun-tiny.yaml").read_text())).spec
    assert hub_downloads(tiny, plan.shapes) == 0


def test_the_scoring_micro_batch_is_no_larger_than_its_rows():
    """A scoring micro-batch holds at most reward.batchSize rows of full length, whatever the token cap allows."""
    from rlt.checks.capacity import scoring_tokens

    spec = parse_run(yaml.safe_load((EXAMPLES / "rltrun-tiny.yaml").read_text())).spec
    rl = spec.stages.rl
    rows = rl.reward.batch_size * (rl.max_prompt_length + rl.max_completion_length)
    assert scoring_tokens(spec, 10**9) == rows and scoring_tokens(spec, 7) == 7


def test_the_rcl_student_is_planned_whole_on_every_rank():
    """Method rlt partitions its frozen student under ZeRO-3 (rlt.stages.rl.partition_frozen); method rcl also
    samples from it and keeps it whole on every rank, so its plan must not count 1/world."""

    def student_terms(method):
        doc = _doc()
        doc["spec"]["method"] = method
        doc["spec"]["stages"]["distill"] = {"enabled": False}  # rcl has none
        doc["spec"]["stages"]["rl"]["generation"]["overlap"] = "none"  # rcl samples its student: no rollout ahead
        spec = parse_run(doc).spec
        plan = plan_for_run(spec)
        (rl,) = [c for c in plan.checks if c.stage == "rl" and c.resource == "GPU memory per trainer process"]
        world = spec.resources.trainer.nodes * spec.resources.trainer.gpus
        return world, {name: value for name, value in rl.terms if "student, frozen" in name}

    world, rlt_terms = student_terms("rlt")
    ((name, part),) = rlt_terms.items()
    assert name == "reward student, frozen (ZeRO-3 partitioned)" and world > 1
    _, rcl_terms = student_terms("rcl")
    ((name, whole),) = rcl_terms.items()
    assert name == "rcl student, frozen, whole on every rank" and whole // world == part


def test_one_step_off_in_process_counts_a_whole_policy_copy_and_its_kv_cache_beside_the_update():
    """In-process one step off samples the next step's rows with a frozen copy of the policy during the update
    (rlt.stages.overlap.LocalBehaviour): the copy is whole on every rank even under ZeRO-3, and it and its KV cache
    are held beside the update, not as one of its phases."""

    def rl_check(overlap):
        doc = _doc()
        doc["spec"]["stages"]["rl"]["generation"] = {"mode": "inprocess", "overlap": overlap}
        spec = parse_run(doc).spec
        (rl,) = [
            c for c in plan_for_run(spec).checks if c.stage == "rl" and c.resource == "GPU memory per trainer process"
        ]
        return spec, rl

    spec, on_policy = rl_check("none")
    _, ahead = rl_check("oneStepOff")
    assert spec.stages.rl.deepspeed_zero_stage == 3 and spec.resources.trainer.gpus > 1
    kv = dict(on_policy.phases)[next(n for n, _ in on_policy.phases if n.startswith("in-process sampling KV cache"))]
    terms = dict(ahead.terms)
    copy = terms["one-step-off sampling copy of the policy, whole on every rank"]
    assert copy == 2 * known_shape(spec.teacher.model).params  # the teacher whole in bf16, not its 1/world share
    assert not any(n.startswith("in-process sampling") for n, _ in ahead.phases)
    assert any(n.startswith("in-process sampling KV cache") and v == kv for n, v in ahead.terms)  # beside it
    gathered = dict(ahead.phases)["policy gathered whole for sampling (beyond the live parameters)"]
    assert gathered == 2 * (known_shape(spec.teacher.model).params - DS_MAX_LIVE_PARAMETERS)  # ZeRO-3, 7B > 1e9
    lora_doc = _doc()
    lora_doc["spec"]["stages"]["rl"]["generation"] = {"mode": "inprocess", "overlap": "oneStepOff"}
    lora_doc["spec"]["teacher"]["lora"] = {"r": 16}
    lora = parse_run(lora_doc).spec
    (lora_rl,) = [
        c for c in plan_for_run(lora).checks if c.stage == "rl" and c.resource == "GPU memory per trainer process"
    ]
    adapters = known_shape(lora.teacher.model).lora_params(16, lora.teacher.lora.target_modules)
    assert dict(lora_rl.terms)["one-step-off sampling copy of the policy, whole on every rank"] == copy + 4 * adapters


@pytest.mark.parametrize("prompt", [1000, 4000, None])
def test_distill_keeps_as_many_sequences_in_flight_as_the_generators_kv_caches_hold(prompt):
    """Sequences per rank × ranks fills the generators' KV capacity for sequences of the prompt plus half of
    maxNewTokens (vLLM's max-num-seqs at most), and one more sequence per rank would not fit."""
    import math

    from rlt.checks.capacity import distill_sequences_in_flight, generator_kv_sequences
    from rlt.checks.shapes import read_shape
    from rlt.checks.step_time import MEAN_COMPLETION_SHARE
    from rlt.spec.budgets import VLLM_MAX_NUM_SEQS

    spec = parse_run(_doc()).spec
    shape, _ = read_shape(spec.teacher, build=False)
    d, res = spec.stages.distill, spec.resources
    k, why = distill_sequences_in_flight(spec, shape, 80 * 2**30, prompt)
    length = (prompt or spec.stages.rl.max_prompt_length) + math.ceil(d.max_new_tokens * MEAN_COMPLETION_SHARE)
    engines = res.generator.replicas * res.generator.data_parallel_size
    capacity = engines * min(VLLM_MAX_NUM_SEQS, generator_kv_sequences(spec, shape, 80 * 2**30, length))
    ranks = res.trainer.nodes * res.trainer.gpus
    assert k * ranks <= capacity or k == 1, why
    assert (k + 1) * ranks > capacity, why
    assert f"{k} sequence(s) in flight per rank" in why
    if prompt == 1000:
        # docs/gpu-cluster.md (Distillation fills every slot): 113 per rank, 452 in all; requests of 32 planned 384
        assert k == 113


def test_distill_sequences_in_flight_without_the_teachers_shape_are_bounded_by_max_num_seqs():
    from rlt.checks.capacity import distill_sequences_in_flight

    spec = parse_run(_doc()).spec
    k, why = distill_sequences_in_flight(spec, None, 80 * 2**30, 1000)
    assert k == 4 * 256 // 4 and "shape is unknown" in why


def _builtin_config(name: str) -> dict:
    import json

    from rlt.data.models import resolve_model_path

    return json.loads((Path(resolve_model_path(name)) / "config.json").read_text())


@pytest.mark.parametrize(
    "model", [*KNOWN_CONFIGS, "builtin:tiny-qwen2", "builtin:smollm2-135m-instruct"], ids=lambda m: m.split("/")[-1]
)
def test_shapes_written_out_without_torch_are_the_empty_models(model):
    """The operator sizes a run's grace period from shapes it writes out layer by layer (its image has no torch):
    each is the count on an empty model that transformers builds from the same config, field by field — the
    parameters, the largest tensor, every linear layer LoRA can adapt, the module names, the tied embedding. The
    built-ins add a Llama with tied embeddings to the Qwen2 of the published ones."""
    from transformers import AutoConfig

    from rlt.checks.model_shape import decoder_shape
    from rlt.checks.shapes import shape_of_config

    fields = dict(KNOWN_CONFIGS[model]) if model in KNOWN_CONFIGS else _builtin_config(model)
    config = AutoConfig.for_model(**fields)
    written, counted = decoder_shape(fields, model), shape_of_config(config, model)
    assert written == counted  # every field that compares: params, largest_param, sizes, tied, saved_bytes
    assert written.linears == counted.linears
    assert written.modules == counted.modules


def test_a_full_disk_is_one_line_and_exit_1_not_a_traceback(monkeypatch, capsys):
    """No space left (a full volume or quota) is the machine's state: `rlt` says so in one line with exit 1. The
    error here is the kernel's own: stdout is /dev/full, which answers every write with ENOSPC."""
    import contextlib
    import sys

    full = Path("/dev/full").open("w", buffering=1)  # noqa: SIM115 - line-buffered: each line reaches the device
    monkeypatch.setattr(sys, "stdout", full)
    assert main(["plan", str(EXAMPLES / "rltrun-tiny.yaml")]) == 1
    # (libraries that log to stdout meet the same device: logging reports its own failures above this line)
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == "rlt plan: no space left (No space left on device); free some space and run it again"
    monkeypatch.undo()
    with contextlib.suppress(OSError):  # the text left in the buffer meets the full device again; the file closes
        full.close()


def test_a_student_stage_with_its_own_model_is_planned_with_that_models_shape():
    """The paper distils into students larger than the reward's. With stages.student.model a 72B and the reward's
    student a 0.5B, the student stage is planned as the 72B: its memory, the download of its weights, its step time
    and so the grace period, not as the 0.5B."""
    from rlt.checks.step_time import trainer_grace_period

    doc = _doc("rltrun-small-2gpu.yaml")
    spec = doc["spec"]
    spec["stages"]["student"] = {**spec["stages"].get("student", {}), "enabled": True}
    small = plan_for_run(parse_run(doc).spec)
    spec["stages"]["student"]["model"] = {"model": "Qwen/Qwen2.5-72B-Instruct", "dtype": "bfloat16"}
    big = plan_for_run(parse_run(doc).spec)

    def need(plan, stage, resource):
        return next(c.total for c in plan.checks if c.stage == stage and c.resource == resource)

    gpu = "GPU memory per trainer process"
    assert need(big, "student", gpu) > 10 * need(small, "student", gpu)
    assert "stages.student.model: 72.7" in render(big, "r") and "72.7" not in render(small, "r")
    volume = next(c for c in big.checks if c.resource.startswith("run volume"))
    downloads = dict(volume.terms)["hub models downloaded to the run's cache (HF_HOME on the volume)"]
    assert downloads > 72e9 * 2  # the 72B's bf16 weights are among them
    # a 72B checkpoint with its optimizer (~1 TB) takes far longer to save than the 0.5B's: the operator's default
    grace, why = trainer_grace_period(parse_run(doc).spec)
    assert grace > 600 and "a stop of student" in why, why


def test_a_trainer_without_deepspeed_is_planned_in_fp32_as_it_trains():
    """One process (or ZeRO 0) trains the whole model in fp32 (rlt.stages.trainer.master_fp32: a bf16 weight cannot
    take the paper's 1e-6 updates): 16 bytes a parameter on the GPU, the fp32 model and two fp32 moments in a
    checkpoint. Planned in bf16, the checkpoint volume's sizeLimit was half the first save."""
    from rlt.checks.model_shape import checkpoint_bytes
    from rlt.checks.plan_terms import model_states

    shape = known_shape("Qwen/Qwen2.5-0.5B-Instruct")
    p = shape.params
    gpu, host, _ = model_states(shape, p, zero=3, nodes=1, gpus=1, b=2)
    assert (gpu, host) == (16 * p, 4 * p)
    assert checkpoint_bytes(shape, p, 3, 1, 2) == 4 * p + 8 * p
    # DeepSpeed keeps the fp32 master copy in its optimizer: the bf16 model, 12 bytes of optimizer a parameter
    assert checkpoint_bytes(shape, p, 3, 2, 2) == 2 * p + 12 * p
    # LoRA: the frozen base in its dtype, the adapter (and its moments) in fp32
    lora = p // 100
    assert model_states(shape, lora, zero=0, nodes=1, gpus=1, b=2)[0] == 2 * p + 16 * lora
