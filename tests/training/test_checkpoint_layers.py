"""Selective gradient checkpointing in the trainer (issue 51, rlt.stages.checkpoint_layers): the last N decoder
layers keep their activations, so one backward recomputes only the others, and the gradients are those of full
checkpointing and of none; the Trainer's own step runs it (the layer's flag set after Trainer.train turns
checkpointing on); a value the model cannot take errors naming the field. A tiny real Qwen2 built here."""

from __future__ import annotations

import copy
from functools import partial

import pytest
import torch
from suite_helpers import TINY

from rlt.stages.checkpoint_layers import decoder_layers, keep_activations

LAYERS = 4


def _model():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=97,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        attn_implementation="sdpa",
    )
    return Qwen2ForCausalLM(config).train()


def _counted(model):
    """Calls of each decoder layer's MLP: a module inside the checkpointed forward, so its hooks fire again when
    the backward pass recomputes the layer (the layer's own hooks stay outside the checkpoint). Pre-hooks: torch's
    non-reentrant checkpoint stops the recompute once it has what the backward needs, before the MLP returns."""
    calls = [0] * LAYERS
    for i, layer in enumerate(decoder_layers(model)):
        layer.mlp.register_forward_pre_hook(lambda *_, i=i: calls.__setitem__(i, calls[i] + 1))
    return calls


def _step(model):
    """(MLP calls per layer in the forward, in the backward; the gradients) of one loss on a fixed batch."""
    calls = _counted(model)
    ids = torch.randint(0, 97, (2, 12), generator=torch.Generator().manual_seed(1))
    loss = model(input_ids=ids, labels=ids).loss
    forward = list(calls)
    loss.backward()
    backward = [c - f for c, f in zip(calls, forward, strict=True)]
    return forward, backward, {n: p.grad.clone() for n, p in model.named_parameters()}


def test_kept_layers_are_not_recomputed_and_the_gradients_are_those_of_full_and_no_checkpointing():
    base = _model()
    full, none, part = copy.deepcopy(base), copy.deepcopy(base), copy.deepcopy(base)
    for m in (full, part):
        m.activation_checkpointing_enable()  # what Trainer.train calls with gradient_checkpointing on
    kept = keep_activations(part, 2, "sft")
    assert kept == decoder_layers(part)[2:]  # the last two

    fwd, bwd, grads = _step(part)
    assert fwd == [1] * LAYERS
    assert bwd == [1, 1, 0, 0], "only the checkpointed layers (the first two) run again in the backward pass"
    _, full_bwd, full_grads = _step(full)
    _, none_bwd, none_grads = _step(none)
    assert full_bwd == [1] * LAYERS and none_bwd == [0] * LAYERS  # the two references do what they say
    for name, g in grads.items():
        assert torch.allclose(g, full_grads[name], atol=1e-6), name
        assert torch.allclose(g, none_grads[name], atol=1e-6), name


def test_more_layers_than_the_model_has_is_refused_naming_the_field():
    model = _model()
    model.activation_checkpointing_enable()
    with pytest.raises(ValueError, match=r"stages\.sft\.uncheckpointedLayers: 5 is more than the 4 decoder layers"):
        keep_activations(model, 5, "sft")
    assert all(layer.gradient_checkpointing for layer in decoder_layers(model))  # nothing half-applied


@pytest.mark.slow
def test_the_trainer_keeps_the_last_layers_activations_in_its_own_step(tmp_path, formatter, capsys):
    """One SFT step of the tiny run through TrainerRun with uncheckpointedLayers 1: the Trainer turns checkpointing
    on at train(), the callback after it keeps the last layer; in the step the first layer runs twice (forward and
    recompute), the last once; the line says the choice."""
    trainer, calls = _tiny_sft_step(tmp_path, formatter, uncheckpointedLayers=1)
    layers = decoder_layers(trainer.model)
    trainer.train()
    assert len(layers) == 2 and calls == [2, 1], calls
    assert [layer.gradient_checkpointing for layer in layers] == [True, False]
    assert (
        "sft: gradient checkpointing on 1 of 2 decoder layers, the last keeps its activations"
        in capsys.readouterr().out
    )


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_plans_bytes_per_token_are_what_autograd_saves_for_a_decoder_layer(dtype):
    """rlt.checks.plan_terms.layer_bytes_per_token against the tensors a Qwen2 decoder layer (SDPA attention) saves
    for its backward pass, counted by storage: the layer's input counts where the layer saves it (fp32: the first
    norm's upcast is the input itself), the weights and the rotary tables (one per model) do not."""
    from rlt.checks.plan_terms import layer_bytes_per_token
    from rlt.checks.shapes import shape_of_config

    config, tokens, x, forward = _qwen2_layer(dtype)
    layer, rotary = forward.func, forward.keywords["position_embeddings"]
    saved: dict[int, int] = {}

    def pack(t):
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        forward(x)
    not_activations = {t.untyped_storage().data_ptr() for t in (*layer.parameters(), *rotary)}
    kept = sum(n for ptr, n in saved.items() if ptr not in not_activations)
    b = torch.finfo(dtype).bits // 8
    assert kept == tokens * layer_bytes_per_token(shape_of_config(config, "test"), b)


def _matmuls_in_backward(model):
    """(aten mm/addmm calls the backward pass runs: the gradients' two per linear layer, plus the matmuls a
    recompute runs again; the gradients) of one loss on a fixed batch."""
    from torch.utils._python_dispatch import TorchDispatchMode

    calls = [0]

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            calls[0] += func in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default)
            return func(*args, **(kwargs or {}))

    ids = torch.randint(0, 97, (2, 12), generator=torch.Generator().manual_seed(1))
    loss = model(input_ids=ids, labels=ids).loss
    with Count():
        loss.backward()
    return calls[0], {n: p.grad.clone() for n, p in model.named_parameters()}


def test_selective_layers_recompute_no_matmul_and_the_gradients_are_those_of_full_and_no_checkpointing():
    """Layers [0 full | 1, 2 selective | 3 kept]: the backward runs the matmuls of no checkpointing plus one full
    layer's recompute (a quarter of full checkpointing's extra matmuls), and the gradients are unchanged."""
    from rlt.stages.checkpoint_layers import checkpoint_selectively

    base = _model()
    full, none, part, every = (copy.deepcopy(base) for _ in range(4))
    for m in (full, part, every):
        m.activation_checkpointing_enable()
    keep_activations(part, 1, "sft")
    assert checkpoint_selectively(part, 1, 2, "sft") == decoder_layers(part)[1:3]
    assert checkpoint_selectively(every, 0, LAYERS, "sft") == decoder_layers(every)

    n_none, g_none = _matmuls_in_backward(none)
    n_full, g_full = _matmuls_in_backward(full)
    n_part, g_part = _matmuls_in_backward(part)
    n_every, g_every = _matmuls_in_backward(every)
    one_layer = (n_full - n_none) / LAYERS
    assert one_layer >= 6, "a full recompute runs a layer's q, k, v, o, gate and up again"
    assert n_part - n_none == one_layer and n_every == n_none, (n_none, n_full, n_part, n_every)
    for name in g_none:
        for grads in (g_part, g_every, g_full):
            assert torch.allclose(grads[name], g_none[name], atol=1e-6), name


def test_selective_layers_are_exact_under_deepspeeds_zero3_linear_and_with_biases(monkeypatch):
    """DeepSpeed ZeRO-3 replaces torch's linear (memory_efficient_linear, its default: zero3_linear_wrap) with one
    that adds the bias in place to the matmul's output, which a selective layer keeps: the recompute must not add
    it twice. Qwen2's q/k/v biases are far from 0 once trained (random here, not the zero of a fresh model): the
    gradients of selective layers equal full checkpointing's and no checkpointing's, with either linear."""
    import torch.nn.functional as F
    from deepspeed.runtime.zero.linear import zero3_linear_wrap

    from rlt.stages.checkpoint_layers import checkpoint_selectively

    base = _model()
    with torch.no_grad():
        for name, p in base.named_parameters():
            if name.endswith("proj.bias"):
                p.normal_(0, 1.0, generator=torch.Generator().manual_seed(2))
    _, reference = _matmuls_in_backward(copy.deepcopy(base))
    for linear in (F.linear, zero3_linear_wrap):
        monkeypatch.setattr(F, "linear", linear)
        for selective in (0, LAYERS):
            model = copy.deepcopy(base)
            model.activation_checkpointing_enable()
            checkpoint_selectively(model, 0, selective, "sft")
            _, grads = _matmuls_in_backward(model)
            for name, g in grads.items():
                assert torch.allclose(g, reference[name], atol=1e-5), (linear.__name__, selective, name)


def test_an_in_place_write_into_a_kept_output_that_was_read_first_is_refused_not_recomputed_wrong():
    """The recompute replays a kept matmul output as the forward left it (after any in-place write into it): right
    when nothing read it before the write (DeepSpeed's linear), wrong otherwise, so that order raises."""
    from torch.utils.checkpoint import checkpoint

    from rlt.stages.checkpoint_layers import selective_contexts

    w = torch.randn(4, 4, requires_grad=True)

    def write_after_read(x):
        y = x @ w
        before = y.exp()  # reads the kept output
        y.add_(1.0)
        return (before * y).sum()

    with pytest.raises(RuntimeError, match=r"aten\.add_\.Tensor writes in place into a kept output that "
                       r"aten\.exp\.default read first.*uncheckpointedLayers"):  # fmt: skip
        checkpoint(write_after_read, torch.randn(3, 4, requires_grad=True), use_reentrant=False,
                   context_fn=selective_contexts)  # fmt: skip


def _grads_checkpointed_and_not(fn, *inputs):
    """(gradients of `fn` under a selective checkpoint with rlt's contexts, gradients without checkpointing)."""
    from torch.utils.checkpoint import checkpoint

    from rlt.stages.checkpoint_layers import selective_contexts

    outs = []
    for checkpointed in (True, False):
        xs = [x.detach().clone().requires_grad_() for x in inputs]
        out = checkpoint(fn, *xs, use_reentrant=False, context_fn=selective_contexts) if checkpointed else fn(*xs)
        out.backward()
        outs.append([x.grad for x in xs])
    return outs


def test_an_in_place_op_that_reads_a_kept_output_and_writes_elsewhere_is_recomputed_right():
    """h.add_(y) with y a kept matmul output and h recomputed: kept, the recompute would hand back the sum without
    writing it into h, which the next op reads (a review reproduced a gradient off by 20 this way); recomputed, it
    writes into the recomputed h."""
    w = torch.randn(4, 4)

    def read_kept_write_other(x):
        y = x @ w  # kept
        h = x * 2.0  # recomputed
        h.add_(y)
        return (h * h).sum()

    selective, plain = _grads_checkpointed_and_not(read_kept_write_other, torch.randn(3, 4))
    assert torch.allclose(selective[0], plain[0], atol=1e-5)


def test_empty_tensors_are_not_taken_for_a_kept_output():
    """Every empty tensor's storage has address 0: a kept empty output (CUDA flash attention's debug mask is one)
    made any in-place op on any other empty tensor look like a write into it after a read."""
    w = torch.randn(4, 4)

    def with_empties(x):
        nothing = torch.mm(x[:0], w)  # a kept matmul output of no bytes
        nothing.sum()  # reads it
        torch.empty(0).zero_()  # another empty tensor, written in place
        return (x @ w).sum()

    selective, plain = _grads_checkpointed_and_not(with_empties, torch.randn(3, 4))
    assert torch.allclose(selective[0], plain[0])


def test_a_recompute_that_gathers_and_allocates_more_than_its_forward_runs_and_its_kept_ops_stay_paired():
    """Under DeepSpeed ZeRO-3 the gathers, allocations and slices a layer's parameter hooks run inside its checkpoint
    fall differently in the forward and the recompute (its prefetch): torch's cached mode raises on a recompute with
    one more op of a kind than the forward recorded. rlt's lenient copy runs such ops (of kinds never kept: stored
    as "recompute" anyway), and still raises for one more matmul, whose kept outputs must pair one to one."""
    from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

    from rlt.stages.checkpoint_layers import selective_contexts, selective_policy

    w = torch.randn(4, 4)
    calls = {"n": 0}

    def hooks_differ(x, extra_matmul=False):
        calls["n"] += 1
        if calls["n"] % 2 == 0:  # the recompute: a prefetch that falls inside this time
            torch.cat([w, w]).view(-1)
            torch.empty(8).fill_(1.0)  # an in-place write too, as a gather into its buffer
        b = torch.tanh(x @ w) @ w
        if extra_matmul and calls["n"] % 2 == 0:
            torch.mm(w, w)  # a third matmul the forward never ran: no kept output to pair it with
        return (b * b).sum()  # the product's backward reads b: the recompute runs past the extra matmul

    def torchs_own():
        return create_selective_checkpoint_contexts(selective_policy(), allow_cache_entry_mutation=True)

    x = torch.randn(3, 4, requires_grad=True)
    with pytest.raises(RuntimeError, match="not found in storage"):
        checkpoint(hooks_differ, x, use_reentrant=False, context_fn=torchs_own).backward()
    selective, plain = _grads_checkpointed_and_not(hooks_differ, x)
    assert torch.allclose(selective[0], plain[0], atol=1e-6)
    calls["n"] = 0  # the next call a forward, the one after it its recompute
    with pytest.raises(RuntimeError, match="aten.mm.default invocation index 2 .*not found in storage"):
        checkpoint(
            partial(hooks_differ, extra_matmul=True), x, use_reentrant=False, context_fn=selective_contexts
        ).backward()


def test_a_reentrant_checkpoint_is_refused_for_selective_layers_naming_the_way_out():
    from functools import partial

    from torch.utils.checkpoint import checkpoint

    from rlt.stages.checkpoint_layers import checkpoint_selectively

    model = _model()
    model.activation_checkpointing_enable({"use_reentrant": True})  # what TRL sets for PEFT under ZeRO-3
    with pytest.raises(ValueError, match=r"non-reentrant checkpoint.*stages\.rl\.uncheckpointedLayers"):
        checkpoint_selectively(model, 0, 2, "rl")
    assert all(
        layer._gradient_checkpointing_func.keywords == {"use_reentrant": True} for layer in decoder_layers(model)
    )
    assert isinstance(decoder_layers(model)[0]._gradient_checkpointing_func, partial)
    assert decoder_layers(model)[0]._gradient_checkpointing_func.func is checkpoint


def _qwen2_layer(dtype):
    from transformers import Qwen2Config
    from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer, Qwen2RotaryEmbedding

    torch.manual_seed(0)
    config = Qwen2Config(
        hidden_size=64, intermediate_size=160, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=1,
        vocab_size=100, attn_implementation="sdpa",
    )  # fmt: skip
    layer = Qwen2DecoderLayer(config, 0).to(dtype).train()
    tokens = 16
    x = torch.randn(1, tokens, 64, dtype=dtype, requires_grad=True)
    positions = torch.arange(tokens)[None]
    rotary = Qwen2RotaryEmbedding(config)(x, positions)
    forward = partial(layer, attention_mask=None, position_ids=positions, position_embeddings=rotary)
    return config, tokens, x, forward


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_plans_selective_bytes_are_what_torch_caches_and_its_recompute_traffic_what_the_ops_move(dtype):
    """rlt.checks.plan_terms.selective_bytes_per_token against a Qwen2 decoder layer under torch's selective
    checkpoint with rlt's policy: the outputs its caching mode stores (read from the mode's storage, a private
    attribute) and the layer's input the checkpoint keeps; selective_recompute_bytes_per_token within 2 % of the
    bytes every op the backward's recompute runs reads and writes (views left out), traced by a dispatch mode
    entered with the recompute's."""
    from contextlib import contextmanager

    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves
    from torch.utils.checkpoint import checkpoint

    from rlt.checks.plan_terms import selective_bytes_per_token, selective_recompute_bytes_per_token
    from rlt.checks.shapes import shape_of_config
    from rlt.stages.checkpoint_layers import selective_contexts

    config, tokens, x, forward = _qwen2_layer(dtype)
    moved, modes = [0], []

    def size(value):
        return sum(t.numel() * t.element_size() for t in tree_leaves(value) if isinstance(t, torch.Tensor))

    class Traffic(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if not func.is_view and func not in (torch.ops.aten.detach.default, torch.ops.aten._unsafe_view.default):
                moved[0] += size(args) + size(kwargs or {}) + size(out)
            return out

    @contextmanager
    def traced(cached):
        with Traffic(), cached:
            yield

    def contexts():
        caching, cached = selective_contexts()
        modes.append(caching)
        return caching, traced(cached)

    out = checkpoint(forward, x, use_reentrant=False, context_fn=contexts)
    cached = {}
    for entries in modes[0].storage.values():
        for entry in entries.values():
            for leaf in tree_leaves(entry):
                t = getattr(leaf, "val", None)
                if isinstance(t, torch.Tensor):
                    cached[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    b = torch.finfo(dtype).bits // 8
    shape = shape_of_config(config, "test")
    assert sum(cached.values()) + x.nbytes == tokens * selective_bytes_per_token(shape, b)
    out.sum().backward()
    assert moved[0] == pytest.approx(tokens * selective_recompute_bytes_per_token(shape, b), rel=0.02)


def test_the_trainer_on_a_gpu_makes_the_plans_choice_for_the_smaller_of_the_specs_memory_and_its_own(monkeypatch):
    """rlt.stages.checkpoint_layers.runtime_choice on `cuda:0` is TrainerTerms.layer_choice at the spec's GPU memory
    (paper-7b: the default 80 GiB), or at the device's when that is smaller. The device's memory is a stand-in
    (torch.cuda.get_device_properties replaced: this machine has no GPU); the choice is the plan's arithmetic."""
    import types

    import yaml
    from suite_helpers import EXAMPLES

    from rlt.checks.capacity import plan_for_run
    from rlt.checks.stage_terms.sft import TERMS
    from rlt.spec.loading import parse_run
    from rlt.stages.checkpoint_layers import runtime_choice

    spec = parse_run(yaml.safe_load((EXAMPLES / "rltrun-paper-7b.yaml").read_text())).spec
    gib = 2**30
    device = {"memory": 141 * gib}
    monkeypatch.setattr(
        torch.cuda, "get_device_properties", lambda _: types.SimpleNamespace(total_memory=device["memory"])
    )
    shapes = plan_for_run(spec).shapes
    on_80 = runtime_choice(spec, "sft", 28, "cuda:0")
    assert on_80 == TERMS.layer_choice(spec, shapes, True, 80 * gib) and 0 < on_80.kept < 28
    assert on_80.selective > 0  # paper-7b's sft is ZeRO-3: selective layers where they recompute less
    assert on_80.line() in plan_for_run(spec, 80 * gib).checkpointing  # what `rlt plan` printed
    device["memory"] = 48 * gib
    assert runtime_choice(spec, "sft", 28, "cuda:0").kept == 0
    assert runtime_choice(spec, "sft", 28, "cpu").kept == 0  # CPU: every layer checkpointed


def test_the_ranks_of_a_gang_keep_the_fewest_layers_any_of_them_chose():
    """Two gloo ranks whose own choices differ (GPUs of different memory) agree on the smaller: under ZeRO-3 a
    recompute gathers the layer's parameters in a collective, so ranks recomputing different layers would hang."""
    code = "from rlt.stages.checkpoint_layers import agreed\nprint(agreed(int(os.environ['OWN']), 'cpu'))\n"
    out = _two_ranks(code, "OWN", ("9", "4"))
    assert [o[-1] for o in out] == ["4", "4"], out


def test_each_micro_batch_keeps_the_layers_its_tokens_allow_and_the_gradients_do_not_change():
    """rlt.stages.checkpoint_layers.PerMicroBatch on the tiny model with a schedule (rlt.checks.checkpoint_layers
    .LayerSchedule, written here: every layer kept up to a quarter of the 48-token longest, 2 up to half, none
    above): each forward of the update recomputes only the layers its tokens leave checkpointed; a forward without
    gradients (the reference and old-policy passes) changes nothing; the gradients are those of no checkpointing."""
    from rlt.checks.checkpoint_layers import LayerSchedule
    from rlt.stages.checkpoint_layers import PerMicroBatch

    plan = LayerSchedule(LAYERS, 0, ((0.25, LAYERS), (0.5, 2)))
    base = _model()
    adaptive, none = copy.deepcopy(base), copy.deepcopy(base)
    adaptive.activation_checkpointing_enable()
    hook = PerMicroBatch(decoder_layers(adaptive), plan, 48, "cpu")
    adaptive.register_forward_pre_hook(hook, with_kwargs=True)
    calls = _counted(adaptive)
    seen = []
    for rows, length, recomputed in ((1, 12, [0] * 4), (2, 12, [1, 1, 0, 0]), (1, 40, [1] * 4), (2, 6, [0] * 4)):
        ids = torch.randint(0, 97, (rows, length), generator=torch.Generator().manual_seed(length))
        for model in (adaptive, none):
            model.zero_grad()
            model(input_ids=ids, labels=ids).loss.backward()
        before = list(calls)
        adaptive(input_ids=ids, labels=ids).loss.backward()  # counted once more: its forward and recompute
        seen.append([c - b - 1 for c, b in zip(calls, before, strict=True)])
        adaptive.zero_grad()
        adaptive(input_ids=ids, labels=ids).loss.backward()
        none.zero_grad()
        none(input_ids=ids, labels=ids).loss.backward()
        for (name, p), q in zip(adaptive.named_parameters(), none.parameters(), strict=True):
            assert torch.allclose(p.grad, q.grad, atol=1e-6), (rows, length, name)
        assert seen[-1] == recomputed, (rows, length, seen)
    flags = [layer.gradient_checkpointing for layer in decoder_layers(adaptive)]
    with torch.no_grad():
        adaptive(input_ids=torch.zeros(1, 40, dtype=torch.long))
    assert [layer.gradient_checkpointing for layer in decoder_layers(adaptive)] == flags == [False] * LAYERS
    assert hook.counts == {4: 6, 2: 3, 0: 3}
    assert (
        hook.line("sft")
        == "sft: micro-batches by decoder layers that kept their activations: 4 layers × 6, 2 layers × 3, 0 layers × 3"
    )


def test_ranks_holding_micro_batches_of_different_tokens_recompute_the_same_layers():
    """Two gloo ranks, one holding 10 tokens and one 40, under the same schedule: both keep the layers the longer
    one allows (the fewest any rank's schedule gives), since ZeRO-3 gathers a recomputed layer in a collective."""
    code = (
        "import types, torch\n"
        "from rlt.checks.checkpoint_layers import LayerSchedule\n"
        "from rlt.stages.checkpoint_layers import PerMicroBatch\n"
        "layers = [types.SimpleNamespace(gradient_checkpointing=True) for _ in range(4)]\n"
        "hook = PerMicroBatch(layers, LayerSchedule(4, 0, ((0.25, 4), (0.5, 2))), 48, 'cpu')\n"
        "hook(torch.nn.Linear(1, 1), (), {'input_ids': torch.zeros(1, int(os.environ['TOKENS']))})\n"
        "print(''.join('c' if x.gradient_checkpointing else 'k' for x in layers))\n"
    )
    out = _two_ranks(code, "TOKENS", ("10", "20"))
    assert [o[-1] for o in out] == ["cckk", "cckk"], out


@pytest.mark.slow
def test_the_trainer_sets_the_layers_per_micro_batch_where_the_plan_gives_a_schedule(
    tmp_path, formatter, capsys, monkeypatch
):
    """One SFT step of the tiny run through TrainerRun where the plan's choice (every layer checkpointed for the
    longest) comes with a schedule: the callback hooks the model, the step's micro-batch, far shorter than the
    longest, keeps both layers (no layer runs twice), and the counts are said at the end. The plan makes a schedule
    on a GPU only; here runtime_layers is replaced by one that returns a schedule written in the test."""
    import rlt.stages.checkpoint_layers as cl
    from rlt.checks.checkpoint_layers import LayerChoice, LayerSchedule

    monkeypatch.setattr(
        cl,
        "runtime_layers",
        lambda spec, stage, layers, device: (
            LayerChoice(stage, layers, 0, "test"),
            LayerSchedule(layers, 0, ((0.5, layers),)),
            10**6,
        ),
    )
    trainer, calls = _tiny_sft_step(tmp_path, formatter)
    layers = decoder_layers(trainer.model)
    trainer.train()
    out = capsys.readouterr().out
    assert len(layers) == 2 and calls == [1, 1], calls
    assert "sft: micro-batches by decoder layers that kept their activations: 2 layers × 1" in out, out
    assert "sft: per micro-batch, a shorter one keeps more decoder layers' activations" in out


@pytest.mark.slow
def test_the_trainer_makes_the_plans_selective_layers_selective_in_its_own_step(
    tmp_path, formatter, capsys, monkeypatch
):
    """One SFT step of the tiny run through TrainerRun, every layer checkpointed, with the plan's choice making the
    last one selective (the plan does so on a GPU under ZeRO-3 only; runtime_layers is replaced by one that returns
    it): the step runs fewer matmuls than with none selective, by at least the six of one layer's recompute, the
    gradients are the same (recorded as each is accumulated: the Trainer zeroes them after its step), and the line
    says the choice."""
    from torch.utils._python_dispatch import TorchDispatchMode

    import rlt.stages.checkpoint_layers as cl
    from rlt.checks.checkpoint_layers import LayerChoice

    class Count(TorchDispatchMode):
        calls = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.calls += func in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default)
            return func(*args, **(kwargs or {}))

    counts, weights = [], []  # weights: each run's gradients by name
    for selective in (0, 1):
        monkeypatch.setattr(
            cl, "runtime_layers",
            lambda spec, stage, layers, device, s=selective: (
                LayerChoice(stage, layers, 0, "test", selective=s, selective_cost=0.2), None, 0
            ),
        )  # fmt: skip
        trainer, _ = _tiny_sft_step(tmp_path / str(selective), formatter)
        Count.calls = 0
        torch.manual_seed(0)
        grads: dict[str, torch.Tensor] = {}
        for name, p in trainer.model.named_parameters():
            p.register_post_accumulate_grad_hook(lambda p, name=name, g=grads: g.__setitem__(name, p.grad.clone()))
        with Count():
            trainer.train()
        counts.append(Count.calls)
        weights.append(grads)
        layers = decoder_layers(trainer.model)
        contexts = [layer._gradient_checkpointing_func.keywords.get("context_fn") for layer in layers]
        assert contexts == [None] * (len(layers) - selective) + [cl.selective_contexts] * selective
    assert counts[0] - counts[1] >= 6, counts
    assert weights[0].keys() == weights[1].keys() and len(weights[0]) > 10
    for name, g in weights[0].items():
        assert torch.allclose(g, weights[1][name], atol=1e-6), name
    assert "sft: gradient checkpointing on 2 of 2 decoder layers, 1 of them selectively" in capsys.readouterr().out


GROUP = "import os, torch.distributed as dist\ndist.init_process_group('gloo')\n"


def _two_ranks(code: str, name: str, values: tuple[str, str]) -> list[list[str]]:
    """The printed words of `code` run by two gloo ranks (python -c, in a process group, `os` imported), rank r with
    environment `name` = values[r]."""
    import os
    import subprocess
    import sys

    from suite_helpers import free_port

    port = str(free_port())
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", f"{GROUP}{code}dist.destroy_process_group()\n"],
            env={
                **os.environ,
                "RANK": str(r),
                "WORLD_SIZE": "2",
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": port,
                name: value,
            },
            stdout=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for r, value in enumerate(values)
    ]
    return [p.communicate(timeout=120)[0].split() for p in ranks]


def _tiny_sft_step(tmp_path, formatter, **sft):
    """(the SFTTrainer of one step of the tiny run through TrainerRun, its decoder layers' MLP calls as _counted)."""
    from trl import SFTTrainer

    from rlt.checks.validation import load_valid_run
    from rlt.contract.layout import RunLayout
    from rlt.data.dataset import load_data
    from rlt.data.models import load_tokenizer
    from rlt.stages.context import StageContext
    from rlt.stages.sft import sft_config, sft_rows
    from rlt.stages.trainer import TrainerRun

    run = load_valid_run(TINY)
    raw = run.model_dump(by_alias=True)
    raw["spec"]["stages"]["sft"].update(
        maxSteps=1, batchSize=2, perDeviceBatchSize=2, gradientCheckpointing=True, **sft
    )
    run = run.model_validate(raw)
    ctx = StageContext(run, RunLayout(tmp_path), device="cpu", show_progress=False)
    tok = load_tokenizer(run.spec.teacher, padding_side="right")
    rows = sft_rows(load_data(run.spec.dataset, formatter.fmt).train[:2], formatter, tok, "reject")
    trainer = TrainerRun(ctx, "sft", run.spec.teacher, tok, "cpu").trainer(SFTTrainer, sft_config(ctx, "cpu"), rows)
    layers = decoder_layers(trainer.model)
    calls = [0] * len(layers)
    for i, layer in enumerate(layers):
        layer.mlp.register_forward_pre_hook(lambda *_, i=i: calls.__setitem__(i, calls[i] + 1))  # as _counted
    return trainer, calls
