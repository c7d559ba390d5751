"""Fused slots (trainables/stacked.py and the trainer's fused folds): each slot trains
exactly as it would alone, up to float rounding, whatever the others do.

* the optimizer over K stacked slots is K optimizers, bit for bit (per-slot lr,
  weight decay, skip mask, gradient scale, Kahan under bf16), and so are the guard's
  counters and the fp16 loss scales;
* a fused trial's fold k equals the unfused trial's fold k after 20 steps, for the eight
  forecast families under f32, bf16, bf16-mixed and fp16-mixed;
* a NaN in one slot skips that slot only;
* slots that differ in a dropout rate each drop at their own;
* checkpoints are per fold either way: a fused trial resumes bit-exactly, and fused and
  unfused checkpoints resume in the other mode;
* where folds cannot fuse, they train one after another and the trainer says why.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
from typing import Any

import pytest
import torch
from torch import nn
from torch.func import vmap
from torch.utils._pytree import tree_leaves, tree_map

import models.ops
from models import get_family
from models.base import Batch
from models.ops import GRU, LSTM, Dropout
from tests.devices import ON_CUDA
from tests.models.test_contract import PRECISIONS, TINY
from tests.trainables.helpers import tiny_config
from trainables import fusion
from trainables.config import DataConfig, TrainConfig
from trainables.fusion import fuse_plan
from trainables.optim import GuardedAdamW
from trainables.precision import BF16, F32, LossScaler, StepGuard, get_policy
from trainables.stacked import StackedFolds, StackedModules, epoch_schedule
from trainables.trainer import Trainer

CPU = torch.device("cpu")
FORECAST = ("tft", "mamba2", "tggn", "tlob", "liquid", "kan", "xlstm", "diffusion")
# Fused and unfused run different kernels (batched and unbatched matmuls and reductions),
# which round alike on some processors and not on others: torch promises no bit-equality
# between them (kan is bit-exact on one x86 CPU and differs in the last bits on another).
# Adam's normalization can magnify a last-bit gradient difference where a gradient is near
# zero (tlob's and xlstm's attention and gates), so f32 weights agree to 1e-5 for most and
# 1e-4 for those two after 20 steps; low-precision policies to a few bf16/fp16 ulps of drift.
F32_TOLERANCE = {"tlob": 1e-4, "xlstm": 1e-4}
# tft's LSTM and the diffusion's GRU run fused as one block-diagonal layer on a GPU and as
# a loop over bars on a CPU: the family checks run both (the GPU's by its device fact).
FUSED_CASES = (*FORECAST, "tft+block-diagonal", "diffusion+block-diagonal")
# (case, precision): a block-diagonal case under every precision but fp16-mixed, where the
# layers loop as in the family's own case.
FUSED_RUNS = [
    (case, precision)
    for case in FUSED_CASES
    for precision in PRECISIONS
    if not (case.endswith("+block-diagonal") and precision == "fp16-mixed")
]
LOW_PRECISION_TOLERANCE = 3e-2


# --------------------------------------------------------------------------------------
# the optimizer, guard and scaler over slots


def _slots_and_singles(
    dtype: torch.dtype, k: int = 3, seed: int = 0
) -> tuple[list[nn.Parameter], list[list[nn.Parameter]]]:
    """Stacked parameters (K, ...) and, per slot, its own copies."""
    gen = torch.Generator().manual_seed(seed)
    shapes = [(4, 3), (5,), ()]
    stacked = [nn.Parameter(torch.randn((k, *s), generator=gen).to(dtype)) for s in shapes]
    singles = [[nn.Parameter(p.detach()[i].clone()) for p in stacked] for i in range(k)]
    return stacked, singles


@pytest.mark.parametrize("dtype", [F32, BF16])
def test_an_optimizer_over_slots_is_k_optimizers_bit_for_bit(dtype: torch.dtype) -> None:
    """Per-slot lr and weight decay, a skip mask and a gradient scale per slot, over
    several steps: every slot's weights, moments, step counts and (bf16) compensation
    equal those of its own optimizer exactly."""
    k = 3
    stacked, singles = _slots_and_singles(dtype, k)
    lrs, decays = [1e-2, 3e-3, 1e-3], [0.0, 0.1, 0.01]
    fused = GuardedAdamW(stacked, lr=lrs, weight_decay=decays, state_dtype=F32, n_slots=k)
    own = [
        GuardedAdamW(singles[i], lr=lrs[i], weight_decay=decays[i], state_dtype=F32)
        for i in range(k)
    ]
    gen = torch.Generator().manual_seed(1)
    masks = [[True, True, True], [True, False, True], [False, True, True], [True, True, False]]
    for mask in masks:
        scales = torch.rand(k, generator=gen) + 0.5
        for p, *own_params in zip(stacked, *singles, strict=True):
            p.grad = torch.randn(p.shape, generator=gen).to(dtype)
            for i, q in enumerate(own_params):
                q.grad = p.grad[i].clone()
        ok = torch.tensor(mask)
        assert fused.grad_norm().shape == (k,)
        fused.step(ok=ok, grad_scale=scales)
        for i in range(k):
            own[i].grad_norm()
            own[i].step(ok=ok[i], grad_scale=scales[i])
    for i in range(k):
        for p, q in zip(stacked, singles[i], strict=True):
            assert torch.equal(p.detach()[i], q.detach())
        mine = fused.slot_state(i, list(zip(stacked, singles[i], strict=True)))
        for q in singles[i]:
            for key, value in own[i].state[q].items():
                assert torch.equal(mine[q][key], value), key
    assert fused.state[stacked[0]]["step"].tolist() == [3.0, 3.0, 3.0]  # one skip each


def test_guard_and_scaler_count_each_slot_and_leave_idle_ones_alone() -> None:
    guard = StepGuard(CPU, n_slots=3)
    scaler = LossScaler(CPU, n_slots=3, growth_interval=2)
    steps = [  # (ok, active) per step
        ([True, False, True], [True, True, False]),
        ([True, False, False], [True, True, False]),
        ([True, True, False], [True, True, True]),
    ]
    for ok, active in steps:
        ok_t, active_t = torch.tensor(ok), torch.tensor(active)
        guard.record(ok_t, active_t)
        scaler.update(ok_t, active_t)
    # slot 0: three clean steps; 1: two skips, then clean; 2: idle, idle, skip.
    assert guard.skipped.tolist() == [0, 2, 1]
    assert guard.streak.tolist() == [0, 0, 1]
    assert guard.longest_streak.tolist() == [0, 2, 1]
    assert scaler.scale.tolist() == [2.0**17, 2.0**14, 2.0**15]  # grew once; halved twice; once
    slot = guard.slot(1)
    assert int(slot.skipped) == 2 and int(slot.longest_streak) == 2
    slot.load_state_dict({"skipped": torch.tensor(7)})  # a view: writes through
    assert guard.skipped.tolist() == [0, 7, 1]
    assert float(scaler.slot(2).scale) == 2.0**15


# --------------------------------------------------------------------------------------
# data, schedule and modules


def _trainer(family: str, precision: str = "f32", **overrides: Any) -> Trainer:
    config = _config(family, precision, **overrides)
    return Trainer(config)


def _config(family: str, precision: str = "f32", **overrides: Any) -> TrainConfig:
    model_config = {**TINY[family]}
    if "dropout" in get_family(family).config_fields():
        model_config["dropout"] = 0.0  # dropout draws differ between fused and unfused
    values: dict[str, Any] = {
        "epochs": 2,
        "n_folds": 2,
        "max_steps_per_epoch": 10,
        "model_config": model_config,
        "data": DataConfig(n_bars=800, n_assets=2),
    }
    values.update(overrides)
    return tiny_config(family, precision, **values)


def test_a_stacked_batch_is_every_folds_own_batch() -> None:
    trainer = _trainer("kan", fuse="off")
    folds = [run.data for run in trainer.folds]
    stacked, views = StackedFolds.stack(folds)
    t = torch.tensor([[40, 41, 90], [300, 17, 55]])
    batch = stacked.batch(t)
    for k, data in enumerate(folds):
        own = data.batch(t[k])
        assert torch.equal(batch.x[k], own.x) and torch.equal(batch.y[k], own.y)
        assert torch.equal(batch.gaps[k], own.gaps)
        assert torch.equal(views[k].batch(t[k]).x, own.x)  # the views read the same data


def test_the_epoch_schedule_aligns_the_slots_and_a_short_one_leaves_early() -> None:
    orders = [torch.arange(10), torch.arange(100, 106), torch.arange(200, 220)]
    times, counts = epoch_schedule(orders, batch_size=3, max_steps=None)
    assert counts == [3, 2, 6] and times.shape == (3, 6, 3)
    assert times[1, :2].tolist() == [[100, 101, 102], [103, 104, 105]]
    assert times[2, 5].tolist() == [215, 216, 217]  # a short tail (218, 219) is dropped
    assert times[1, 2:].eq(torch.tensor([100, 101, 102])).all()  # past its count: a filler
    _, counts = epoch_schedule(orders, batch_size=3, max_steps=2)
    assert counts == [2, 2, 2]


def test_the_slots_are_views_of_the_stacked_tensors() -> None:
    trainer = _trainer("liquid", fuse="off")
    modules = [run.model for run in trainer.folds]
    before = [m.state_dict()["head.weight"].clone() for m in modules]
    stacked = StackedModules(modules)
    name = "head.weight"
    index = stacked.names.index(name)
    for k, module in enumerate(modules):
        assert torch.equal(dict(module.named_parameters())[name], before[k])
    with torch.no_grad():
        stacked.stacked[index][1].add_(1.0)
    assert torch.equal(dict(modules[1].named_parameters())[name], before[1] + 1.0)
    own = dict(modules[1].named_parameters())[name]
    assert own.untyped_storage().data_ptr() == stacked.stacked[index].untyped_storage().data_ptr()
    stacked.release()
    own = dict(modules[1].named_parameters())[name]
    assert own.untyped_storage().data_ptr() != stacked.stacked[index].untyped_storage().data_ptr()
    with torch.no_grad():
        stacked.stacked[index][1].add_(1.0)  # released: the slot keeps its own values
    assert torch.equal(own, before[1] + 1.0)


def _block_diagonal_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The device fact that picks the recurrent layers' fused form: the GPU's, here."""
    most = models.ops.BLOCK_DIAGONAL_MAX_UNITS["cuda"]
    monkeypatch.setitem(models.ops.BLOCK_DIAGONAL_MAX_UNITS, "cpu", most)


@pytest.mark.parametrize("form", ["block-diagonal", "loop"])
@pytest.mark.parametrize("rnn", [LSTM, GRU])
def test_fused_recurrent_layers_compute_torchs_layers(
    rnn: type, form: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under vmap (where aten::lstm / aten::gru have no batching rule) slot k's output,
    last state and gradients are torch's layer's with slot k's weights and state. On a
    GPU narrow slots run as one torch layer per layer (block-diagonal weights), on a CPU
    as a loop over bars."""
    if form == "block-diagonal":
        _block_diagonal_on_cpu(monkeypatch)
    else:  # what a CPU runs; a GPU too where slots are wide
        assert "cpu" not in models.ops.BLOCK_DIAGONAL_MAX_UNITS
    torch_layers = _fused_layers_against_torchs(rnn, torch.device("cpu"))
    assert torch_layers == (2 if form == "block-diagonal" else 0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("rnn", [LSTM, GRU])
def test_on_cuda_fused_recurrent_layers_are_one_cudnn_layer_each(rnn: type) -> None:
    """The CPU tests' block-diagonal cases, on a GPU as it runs them: cuDNN's layer,
    forward and backward (TF32 off, so both sides round alike)."""
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        assert _fused_layers_against_torchs(rnn, torch.device("cuda"), rtol=1e-5) == 2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("family", ["tft", "diffusion"])
@pytest.mark.parametrize("precision", ["f32", "bf16", "bf16-mixed"])
def test_on_cuda_tft_and_diffusion_fuse_and_train(
    family: str, precision: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fused try-out step (forward and backward, block-diagonal layers included)
    passes on a GPU, so auto fuses these families there, and an epoch trains fused with
    finite losses, the recurrent layers block-diagonal (under bf16-mixed too: they compute
    in bf16 with autocast off)."""
    ran: list[int] = []
    layer = models.ops._block_diagonal_layer

    def counted(*args: Any) -> Any:
        ran.append(1)
        return layer(*args)

    monkeypatch.setattr(models.ops, "_block_diagonal_layer", counted)
    trainer = _trainer(family, precision, fuse="auto", device="cuda")
    assert trainer.fused is not None, trainer.unfused_reason
    metrics = trainer.train_epoch()
    assert metrics["fused_folds"] == 2 and math.isfinite(metrics["train_loss"])
    assert ran


def _fused_layers_against_torchs(rnn: type, device: torch.device, rtol: float = 1e-6) -> int:
    """Two slots of a two-layer ``rnn`` under vmap, a state given, against torch's layer
    per slot: outputs, last states and gradients; returns how many torch layers ran."""
    torch.manual_seed(0)
    layers = [rnn(3, 4, num_layers=2, batch_first=True).to(device) for _ in range(2)]
    stacked = StackedModules(layers)
    x = torch.randn(2, 5, 7, 3, device=device)  # (K, N, L, F)
    h0 = torch.randn(2, 2, 5, 4, device=device)  # (K, layers, N, H)
    state = (h0, torch.randn_like(h0)) if rnn is LSTM else h0
    stacked_params = zip(stacked.names, stacked.stacked, strict=True)
    params = {n: p.detach().requires_grad_() for n, p in stacked_params}

    def run(p: dict[str, torch.Tensor], xs: torch.Tensor, hx: Any) -> Any:
        return torch.func.functional_call(layers[0], p, (xs, hx))

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fused, fused_last = vmap(run)(params, x, state)
    torch.autograd.backward([fused.square().sum()])
    for k, layer in enumerate(layers):
        slot_state = (state[0][k], state[1][k]) if rnn is LSTM else state[k]
        alone, alone_last = layer(x[k], slot_state)
        alone.square().sum().backward()
        torch.testing.assert_close(fused[k], alone, rtol=rtol, atol=rtol / 10)
        for mine, torchs in zip(tree_leaves(fused_last), tree_leaves(alone_last), strict=True):
            torch.testing.assert_close(mine[k], torchs, rtol=rtol, atol=rtol / 10)
        for name, param in layer.named_parameters():
            assert param.grad is not None
            grad = params[name].grad
            assert grad is not None
            torch.testing.assert_close(grad[k], param.grad, rtol=10 * rtol, atol=rtol)
    kind = "aten::lstm" if rnn is LSTM else "aten::gru"
    return sum(e.name == kind for e in prof.events())


@pytest.mark.parametrize("device", ["cpu", ON_CUDA])
@pytest.mark.parametrize("state", ["zeros", "given"])
@pytest.mark.parametrize("mode", ["unfused", "fused"])
@pytest.mark.parametrize("rnn", [LSTM, GRU])
def test_under_autocast_a_recurrent_layer_computes_in_autocasts_dtype(
    rnn: type, mode: str, state: str, device: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under autocast(bf16) torch's layer runs with autocast off on bf16 inputs, state and
    weights (torch's CUDA autocast would run cuDNN's layer in fp16, without a loss scale,
    and fused slots could not use the block-diagonal form): outputs and the last state
    are the bf16 layer's (unfused on a CPU bit for bit: the same kernel), the f32 weights
    get f32 gradients, and on a GPU the unfused layer is cuDNN's."""
    _block_diagonal_on_cpu(monkeypatch)  # fused: one torch layer, as on a GPU
    name = "lstm" if rnn is LSTM else "gru"
    calls: list[tuple[bool, set[torch.dtype]]] = []
    layer_fn = getattr(torch._VF, name)

    def recording(x: torch.Tensor, hx: Any, params: list[torch.Tensor], *flags: Any) -> Any:
        dtypes = {t.dtype for t in (x, *tree_leaves(hx), *params)}
        calls.append((torch.is_autocast_enabled(device), dtypes))
        return layer_fn(x, hx, params, *flags)

    monkeypatch.setattr(torch._VF, name, recording)
    torch.manual_seed(0)
    layers = [rnn(3, 4, num_layers=2, batch_first=True).to(device) for _ in range(2)]
    x = torch.randn(2, 5, 7, 3, device=device)  # (K, N, L, F)
    h0 = torch.randn(2, 2, 5, 4, device=device)  # (K, layers, N, H): f32, as tft passes it
    hx = None if state == "zeros" else ((h0, torch.randn_like(h0)) if rnn is LSTM else h0)
    slot_hx = [None if hx is None else tree_map(lambda t, k=k: t[k], hx) for k in range(2)]
    with (
        torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof,
        torch.autocast(device, dtype=BF16),
    ):
        if mode == "unfused":
            outs = [layer(x[k], slot_hx[k]) for k, layer in enumerate(layers)]
        else:
            stacked = StackedModules(layers)
            params = dict(zip(stacked.names, stacked.stacked, strict=True))

            def run(p: dict[str, torch.Tensor], xs: torch.Tensor, h: Any) -> Any:
                return torch.func.functional_call(layers[0], p, (xs, h))

            fused = vmap(run, in_dims=(0, 0, None if hx is None else 0))(params, x, hx)
            outs = [tree_map(lambda t, k=k: t[k], fused) for k in range(2)]
    assert calls and all(call == (False, {BF16}) for call in calls), calls
    for k, layer in enumerate(layers):
        reference = copy.deepcopy(layer).to(BF16)
        bf16_hx = None if hx is None else tree_map(lambda t: t.to(BF16), slot_hx[k])
        expected = tree_leaves(reference(x[k].to(BF16), bf16_hx))
        for mine, bf16s in zip(tree_leaves(outs[k]), expected, strict=True):
            assert mine.dtype == BF16
            if device == "cpu" and mode == "unfused":
                assert torch.equal(mine, bf16s)
            else:  # the joined layer's wider sums, or another cuDNN algorithm: bf16 ulps
                torch.testing.assert_close(mine, bf16s, rtol=2e-2, atol=2e-2)
    tree_leaves(outs)[0].float().sum().backward()
    grad = layers[0].weight_ih_l0.grad if mode == "unfused" else params["weight_ih_l0"].grad
    assert grad is not None and grad.dtype == F32 and grad.abs().sum() > 0
    if device == "cuda" and mode == "unfused":  # bf16 reaches cuDNN, not per-bar cells
        ran = sorted({e.name for e in prof.events()})
        assert "aten::_cudnn_rnn" in ran, (torch.backends.cudnn.version(), ran)


UNCOVERED_LAYERS = {  # what models.ops's own path leaves to torch: (layer kwargs, input)
    "unbatched": ({"batch_first": True}, (7, 3)),
    "bidirectional": ({"batch_first": True, "bidirectional": True}, (5, 7, 3)),
    "not batch_first": ({"batch_first": False}, (7, 5, 3)),
}


@pytest.mark.parametrize("case", list(UNCOVERED_LAYERS))
@pytest.mark.parametrize("rnn", [LSTM, GRU])
def test_a_layer_models_ops_does_not_cover_keeps_torchs_forward(rnn: type, case: str) -> None:
    """Under autocast, outside vmap, such a layer is torch's (autocast's own casts, bit for
    bit: the same kernels run), failing as torch's fails where torch cannot run it (a bf16
    LSTM on a CPU without AVX-512: oneDNN has no primitive for it); under vmap it refuses
    with the reason (the fused try-out step then unfuses)."""
    kwargs, shape = UNCOVERED_LAYERS[case]
    torch.manual_seed(0)
    layer = rnn(3, 4, **kwargs)
    torchs = (nn.LSTM if rnn is LSTM else nn.GRU)(3, 4, **kwargs)
    torchs.load_state_dict(layer.state_dict())
    x = torch.randn(shape)
    with torch.autocast("cpu", dtype=BF16):
        try:
            expected = tree_leaves(torchs(x))
        except RuntimeError as refused:  # this processor: torch's own layer cannot run it
            with pytest.raises(RuntimeError) as ours:
                layer(x)
            assert str(ours.value) == str(refused)
        else:
            for mine, theirs in zip(tree_leaves(layer(x)), expected, strict=True):
                assert mine.dtype == theirs.dtype and torch.equal(mine, theirs)
    params = {n: p.detach().unsqueeze(0).expand(2, *p.shape) for n, p in layer.named_parameters()}
    with pytest.raises(NotImplementedError, match="batch_first, unidirectional"):
        vmap(lambda p, xs: torch.func.functional_call(layer, p, (xs,)))(params, torch.stack([x, x]))


def test_a_block_diagonal_layer_runs_in_cudnns_training_mode_where_autograd_records(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """cuDNN keeps what its backward needs only in training mode ("train"; on a CPU the
    flag only gates dropout, 0 here): the flag follows whether autograd records, so a
    training step can run backward on a GPU and evaluation under no_grad keeps nothing."""
    _block_diagonal_on_cpu(monkeypatch)
    trains: list[bool] = []
    lstm = torch._VF.lstm

    def recording(*args: Any) -> Any:
        trains.append(args[6])  # input, hx, params, bias, layers, dropout, train, ...
        return lstm(*args)

    monkeypatch.setattr(torch._VF, "lstm", recording)
    layers = [LSTM(3, 4, batch_first=True) for _ in range(2)]
    stacked = StackedModules(layers)
    params = {n: p for n, p in zip(stacked.names, stacked.stacked, strict=True)}

    def run(p: dict[str, torch.Tensor], xs: torch.Tensor) -> torch.Tensor:
        return torch.func.functional_call(layers[0], p, (xs,))[0]

    vmap(run)(params, torch.randn(2, 5, 7, 3)).sum().backward()
    with torch.no_grad():
        vmap(run)(params, torch.randn(2, 5, 7, 3))
    assert trains == [True, False]


@pytest.mark.parametrize("rnn", [LSTM, GRU])
def test_a_non_finite_slot_leaves_the_others_of_a_block_diagonal_layer_alone(
    rnn: type, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The zero blocks put every slot's values into the others' sums (0 * inf = nan).
    A slot with an inf input or a NaN weight leaves the layer NaN, and one whose
    outgoing gradient is NaN gets NaN gradients; the other slot's output and gradients
    are exactly what they are beside a finite slot (two layers, a state given)."""
    _block_diagonal_on_cpu(monkeypatch)
    torch.manual_seed(0)
    layers = [rnn(3, 4, num_layers=2, batch_first=True) for _ in range(2)]
    stacked = StackedModules(layers)
    x = torch.randn(2, 5, 7, 3)
    h0 = torch.randn(2, 2, 5, 4)  # (K, layers, N, H)
    state = (h0, torch.randn_like(h0)) if rnn is LSTM else h0
    weight = "weight_hh_l0"

    def fused_run(
        xs: torch.Tensor, outgoing: torch.Tensor, bad_weight: bool = False
    ) -> dict[str, torch.Tensor]:
        stacked_params = zip(stacked.names, stacked.stacked, strict=True)
        params = {n: p.detach().clone() for n, p in stacked_params}
        if bad_weight:
            params[weight][1, 0, 0] = math.nan
        params = {n: p.requires_grad_() for n, p in params.items()}

        def run(p: dict[str, torch.Tensor], slot_x: torch.Tensor, hx: Any) -> torch.Tensor:
            return torch.func.functional_call(layers[0], p, (slot_x, hx))[0]

        out = vmap(run)(params, xs, state)
        (out.nan_to_num() * outgoing).sum().backward()
        return {"out": out, **{n: p.grad for n, p in params.items()}}

    ones = torch.ones(2, 5, 7, 4)
    clean = fused_run(x, ones)
    bad_input = x.clone()
    bad_input[1, 2, 3, 0] = math.inf
    bad_grad = ones.clone()
    bad_grad[1, 0, 6, 1] = math.nan
    runs = {
        "inf input": fused_run(bad_input, ones),
        "nan weight": fused_run(x, ones, bad_weight=True),
        "nan gradient": fused_run(x, bad_grad),
    }
    for case, result in runs.items():
        for name, value in result.items():
            assert torch.equal(value[0], clean[name][0]), (case, name)
    assert runs["inf input"]["out"][1].isnan().all()
    assert runs["nan weight"]["out"][1].isnan().all()
    assert all(runs["nan gradient"][name][1].isnan().all() for name in stacked.names)


class _Dropping(nn.Module):
    """A slot whose ``loss`` is its dropout's output (the step's view of the rate)."""

    def __init__(self, rate: float) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(()))
        self.drop = Dropout(rate)

    def loss(self, batch: Batch) -> torch.Tensor:
        return self.drop(batch.x * self.scale)


@pytest.mark.parametrize("dtype", [F32, BF16])
def test_slots_that_differ_in_a_dropout_rate_each_drop_at_their_own(
    dtype: torch.dtype,
) -> None:
    """The rates reach the vmap per slot: slot k zeroes a fraction ``rate_k`` of its
    units and scales the rest by 1 / (1 - rate_k) (rounded once to the dtype); a slot at
    0 keeps its input exactly. Slots at one rate read it unbatched (nn.Dropout's own
    path). The policy keeps the rates f32."""
    torch.manual_seed(0)
    rates = [0.5, 0.0, 0.3]
    policy = get_policy("bf16" if dtype == BF16 else "f32")
    modules = [policy.convert_module(_Dropping(rate)) for rate in rates]
    assert all(m.drop.rate.dtype == F32 and m.scale.dtype == dtype for m in modules)
    stacked = StackedModules(modules).train()
    assert stacked.shared_settings == set()
    x = torch.ones(3, 20_000, dtype=dtype)
    out = stacked.loss(Batch(x=x, y=x, gaps=x))
    assert out.dtype == dtype
    for slot, rate in zip(out, rates, strict=True):
        dropped = float((slot == 0).float().mean())
        assert dropped == pytest.approx(rate, abs=0.015)
        scale = torch.tensor(1 / (1 - rate), dtype=F32).to(dtype).item()
        assert slot[slot != 0].unique().tolist() == [scale]
    same = StackedModules([_Dropping(0.3), _Dropping(0.3)]).train()
    assert same.shared_settings == {"drop.rate"}
    out = same.loss(Batch(x=x[:2].float(), y=x[:2], gaps=x[:2]))
    assert [float((m == 0).float().mean()) for m in out] == [pytest.approx(0.3, abs=0.015)] * 2
    assert not torch.equal(out[0], out[1])  # each slot its own mask


@pytest.mark.parametrize(
    ("family", "settings"),
    [
        (
            "kan",
            [{"reg_lambda": 1e-5, "reg_entropy": 0.0}, {"reg_lambda": 1e-2, "reg_entropy": 2.0}],
        ),
        ("tggn", [{"beta": 0.0, "dropout": 0.0}, {"beta": 0.5, "dropout": 0.0}]),
    ],
)
def test_slots_that_differ_in_a_loss_weight_each_compute_their_own_loss(
    family: str, settings: list[dict[str, Any]]
) -> None:
    """KAN's regularization weights and tggn's beta reach the fused step per slot: each
    slot's fused loss is its module's loss alone (same weights, own settings)."""
    spec = get_family(family)
    trainer = _trainer(family, fuse="off")
    shape = trainer.folds[0].model
    modules = []
    for values in settings:
        module = spec.build(spec.make_config({**TINY[family], **values}), trainer.shape)
        module.load_state_dict(shape.state_dict())
        modules.append(module)
    stacked = StackedModules(modules)
    assert all(n.endswith(".rate") for n in stacked.shared_settings)  # dropout, equal
    batch = trainer.folds[0].data.batch(torch.arange(16))
    stacked_batch = Batch(*(torch.stack([t, t]) for t in (batch.x, batch.y, batch.gaps)))
    fused = stacked.loss(stacked_batch)
    alone = torch.stack([m.loss(batch) for m in modules])
    torch.testing.assert_close(fused, alone, rtol=1e-6, atol=0)
    assert not torch.equal(alone[0], alone[1])  # the settings matter to the loss


def test_a_recurrent_layer_drops_between_layers_at_each_slots_rate() -> None:
    """A fused LSTM's between-layer dropout is a slot's: a slot at 0 gives
    torch's layer's output, one at 0.5 does not."""
    torch.manual_seed(0)
    layers = [LSTM(3, 4, num_layers=2, batch_first=True, dropout=r) for r in (0.5, 0.0)]
    layers[1].load_state_dict(layers[0].state_dict())
    stacked = StackedModules(layers)
    assert stacked.shared_settings == set()
    x = torch.randn(5, 7, 3).expand(2, 5, 7, 3)
    params = {n: p for n, p in zip(stacked.names, stacked.stacked, strict=True)}
    buffers = dict(zip(stacked.buffer_names, stacked.stacked_buffers(), strict=True))

    def run(p: dict[str, torch.Tensor], b: dict[str, torch.Tensor], xs: torch.Tensor) -> Any:
        return torch.func.functional_call(layers[0], (p, b), (xs,))[0]

    fused = vmap(run, randomness="different")(params, buffers, x)
    layers[1].eval()  # no dropout: torch's layer, deterministic
    torch.testing.assert_close(fused[1], layers[1](x[1])[0], rtol=1e-5, atol=1e-6)
    assert (fused[0] - fused[1]).abs().max() > 1e-2


# --------------------------------------------------------------------------------------
# a fused trial against the unfused one


def _deterministic_noise(monkeypatch: pytest.MonkeyPatch) -> None:
    """The diffusion's loss draws timesteps and noise: under vmap each slot draws its
    own, unfused each fold draws from the trial's stream, so the draws differ by design.
    Fixed draws (the same function of the shape) make the two runs comparable."""

    def randint(low: int, high: int | None = None, size: Any = None, **kw: Any) -> Any:
        low, high = (0, low) if high is None else (low, high)
        n = int(torch.Size(size).numel())
        return (torch.arange(n, device=kw.get("device")) % (high - low) + low).view(*size)

    def randn_like(x: torch.Tensor, **kw: Any) -> torch.Tensor:
        angles = torch.arange(x.numel(), device=x.device, dtype=F32).view(x.shape)
        return torch.sin(0.7 * angles).to(x.dtype)

    monkeypatch.setattr(torch, "randint", randint)
    monkeypatch.setattr(torch, "randn_like", randn_like)


def _family_in_its_form(case: str, monkeypatch: pytest.MonkeyPatch) -> tuple[str, list[int]]:
    """A case's family, with the device fact set that picks its recurrent layers' fused
    form, and a list that counts the block-diagonal layers run (a test checks it: a case
    that never ran its form would test nothing new)."""
    family, _, form = case.partition("+")
    ran: list[int] = []
    if form == "block-diagonal":
        _block_diagonal_on_cpu(monkeypatch)
        layer = models.ops._block_diagonal_layer

        def counted(*args: Any) -> Any:
            ran.append(1)
            return layer(*args)

        monkeypatch.setattr(models.ops, "_block_diagonal_layer", counted)
    return family, ran


def _weights(trainer: Trainer, k: int) -> torch.Tensor:
    return torch.cat([p.detach().float().flatten() for p in trainer.folds[k].model.parameters()])


@pytest.mark.slow
@pytest.mark.parametrize(("case", "precision"), FUSED_RUNS)
def test_a_fused_fold_trains_as_the_unfused_fold(
    case: str, precision: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    family, block_diagonal_layers = _family_in_its_form(case, monkeypatch)
    if family == "diffusion":
        _deterministic_noise(monkeypatch)
    runs = {}
    for fuse in ("off", "on"):  # "on": also the families auto leaves unfused on a CPU
        # Two epochs of five steps: moments, step counts and the epoch boundary all carry
        # over, at half the bf16 steps (emulated on a CPU) of the helper's default ten.
        trainer = _trainer(family, precision, fuse=fuse, max_steps_per_epoch=5)
        assert (trainer.fused is not None) == (fuse == "on"), trainer.unfused_reason
        history = trainer.fit()
        runs[fuse] = (trainer, history)
    (alone, alone_history), (fused, fused_history) = runs["off"], runs["on"]
    assert fused.global_step == alone.global_step == 20  # 2 folds x 5 steps x 2 epochs
    assert [m["fused_folds"] for m in fused_history] == [2, 2]
    tolerance = F32_TOLERANCE.get(family, 1e-5) if precision == "f32" else LOW_PRECISION_TOLERANCE
    for k in range(2):
        a, b = _weights(alone, k), _weights(fused, k)
        assert float((a - b).norm() / a.norm()) < tolerance, k
        if precision == "f32":  # a low-precision weight drift moves a short window's Sharpe
            key = f"val_sharpe_fold{k}"
            assert fused_history[-1][key] == pytest.approx(alone_history[-1][key], abs=0.01)
    assert fused_history[-1]["skipped_steps"] == alone_history[-1]["skipped_steps"]
    assert bool(block_diagonal_layers) == case.endswith("+block-diagonal")


def test_folds_of_different_lengths_step_as_often_as_unfused() -> None:
    """A full pass over each fold (no step cap): fold 0 has fewer batches than fold 1 and
    leaves the fused step when they run out; both folds end as they would unfused."""
    runs = {}
    for fuse in ("off", "auto"):
        trainer = _trainer("kan", fuse=fuse, max_steps_per_epoch=None, epochs=1)
        trainer.fit()
        runs[fuse] = trainer
    alone, fused = runs["off"], runs["auto"]
    assert fused.fused is not None and fused.global_step == alone.global_step
    counts = [len(run.data.decision_times(run.data.train)) // 32 for run in fused.folds]
    assert counts[0] < counts[1]
    steps = fused.fused.optimizer.state[next(fused.fused.model.parameters())]["step"]
    assert steps.tolist() == counts
    for k in range(2):
        a, b = _weights(alone, k), _weights(fused, k)
        assert float((a - b).norm() / a.norm()) < 1e-5


@pytest.mark.parametrize(("case", "precision"), FUSED_RUNS)
def test_a_nan_in_one_slot_skips_only_that_slot(
    case: str, precision: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fold 1's minibatch carries a NaN target: its step is skipped (weights, moments
    and step count untouched, one skip counted); fold 0 steps as it would alone."""
    family, block_diagonal_layers = _family_in_its_form(case, monkeypatch)
    if family == "diffusion":
        _deterministic_noise(monkeypatch)
    trainer = _trainer(family, precision, fuse="on")
    fused = trainer.fused
    alone = _trainer(family, precision, fuse="off")
    assert fused is not None
    before = [p.detach().clone() for p in fused.model.parameters()]
    times = torch.tensor([[300, 301, 302, 303], [400, 401, 402, 403]])
    fused.data.targets[1, 401, 0] = float("nan")
    result = trainer.fusion.fused_step(fused, times)
    assert result.ok.tolist() == [True, False]
    moved = [
        not torch.equal(p.detach()[0], old[0])
        for p, old in zip(fused.model.parameters(), before, strict=True)
    ]
    assert any(moved)  # slot 0 stepped
    for p, old in zip(fused.model.parameters(), before, strict=True):
        assert torch.equal(p.detach()[1], old[1])  # slot 1 untouched
    assert fused.guard.skipped.tolist() == [0, 1]
    assert fused.optimizer.state[next(iter(fused.model.parameters()))]["step"].tolist() == [1, 0]
    run = alone.folds[0]
    alone.forecast_step(run, run.data.batch(times[0]))
    a = torch.cat([p.detach().float().flatten() for p in run.model.parameters()])
    b = torch.cat([p.detach().float().flatten() for p in fused.model.slot_modules[0].parameters()])
    tolerance = F32_TOLERANCE.get(family, 1e-5) if precision == "f32" else LOW_PRECISION_TOLERANCE
    assert float((a - b).norm() / a.norm()) < tolerance
    assert bool(block_diagonal_layers) == case.endswith("+block-diagonal")


# --------------------------------------------------------------------------------------
# checkpoints and resume


@pytest.mark.slow
@pytest.mark.parametrize(("case", "precision"), FUSED_RUNS)
def test_a_fused_trial_round_trips_and_resumes_bit_exactly(
    case: str, precision: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The contract's checkpoint check, fused: saved and restored bit for bit, and a
    resumed trial ends exactly where an uninterrupted one does."""
    family, block_diagonal_layers = _family_in_its_form(case, monkeypatch)
    from trainables.checkpoint import load_checkpoint

    def config() -> TrainConfig:
        # A full pass (no step cap): fold 0 runs out of batches first (5 batches to
        # fold 1's 7 at 400 bars), so the epoch ends with steps of fold 1 alone.
        return _config(
            family,
            precision,
            fuse="on",
            max_steps_per_epoch=None,
            data=DataConfig(n_bars=400, n_assets=2),
        )

    straight = Trainer(config())
    straight.fit()
    first = Trainer(config())
    first.train_epoch()
    first.save(tmp_path / "ckpt")
    resumed = Trainer(config(), checkpoint=load_checkpoint(tmp_path / "ckpt"))
    assert resumed.fused is not None and resumed.epoch == 1
    batches = [len(run.data.decision_times(run.data.train)) // 32 for run in resumed.folds]
    assert batches[0] < batches[1]
    for k in range(2):
        assert torch.equal(_weights(first, k), _weights(resumed, k))
    resumed.fit()
    for k in range(2):
        assert torch.equal(_weights(straight, k), _weights(resumed, k))
    assert straight.history[-1]["val_sharpe"] == resumed.history[-1]["val_sharpe"]
    assert bool(block_diagonal_layers) == case.endswith("+block-diagonal")


def test_fused_and_unfused_checkpoints_resume_in_the_other_mode(tmp_path: Any) -> None:
    """The checkpoint layout is per fold either way: weights, moments, step counts,
    guards and generators come back exactly, and training goes on as in the saved mode."""
    from trainables.checkpoint import load_checkpoint

    for saved_mode, resumed_mode in (("auto", "off"), ("off", "auto")):
        source = _trainer("kan", "bf16", fuse=saved_mode, epochs=2)
        source.train_epoch()
        path = source.save(tmp_path / f"{saved_mode}-ckpt")
        resumed = Trainer(
            source.config.replace(fuse=resumed_mode), checkpoint=load_checkpoint(path)
        )
        assert (resumed.fused is None) == (resumed_mode == "off")
        for k in range(2):
            assert torch.equal(_weights(source, k), _weights(resumed, k))
            a, b = source.folds[k], resumed.folds[k]
            names_a = {id(p): n for n, p in a.model.named_parameters()}
            names_b = {id(p): n for n, p in b.model.named_parameters()}
            state_a = {names_a[id(p)]: v for p, v in a.optimizer.state.items()}
            state_b = {names_b[id(p)]: v for p, v in b.optimizer.state.items()}
            assert state_a.keys() == state_b.keys() == set(names_a.values())
            for name, values in state_a.items():
                assert values.keys() == state_b[name].keys(), name
                for key in values:
                    assert torch.equal(values[key], state_b[name][key]), (name, key)
            assert a.guard.state_dict() == b.guard.state_dict()
            assert torch.equal(a.generator.get_state(), b.generator.get_state())
        source.fit()
        resumed.fit()
        for k in range(2):
            a, b = _weights(source, k), _weights(resumed, k)
            assert float((a - b).norm() / a.norm()) < LOW_PRECISION_TOLERANCE


# --------------------------------------------------------------------------------------
# when folds do not fuse


@pytest.mark.parametrize(
    ("family", "overrides", "device", "reason"),
    [
        ("kan", {"fuse": "off"}, "cpu", "trainer.fuse is off"),
        (
            "dqn",
            {},
            "cpu",
            "dqn does not fuse: its environments and replay have no slot dimension",
        ),
        ("kan", {"n_folds": 1}, "cpu", "one fold: nothing to fuse"),
        (
            "kan",
            {"batch_size": 400},
            "cpu",
            "fold(s) [0] have fewer training windows than batch_size 400",
        ),
    ],
)
def test_fuse_plan_says_why_folds_train_one_after_another(
    family: str, overrides: dict[str, Any], device: str, reason: str
) -> None:
    config = _config(family, **overrides)
    folds = Trainer(config.replace(fuse="off")).folds
    assert fuse_plan(config, torch.device(device), get_family(family), folds) == (False, reason)
    assert fuse_plan(_config("kan"), CPU, get_family("kan"), _trainer("kan", fuse="off").folds) == (
        True,
        "",
    )


def test_a_family_slower_fused_on_a_cpu_fuses_only_on_a_gpu() -> None:
    family = dataclasses.replace(get_family("kan"), fuse_on_cpu=False)
    folds = _trainer("kan", fuse="off").folds
    config = _config("kan")
    assert fuse_plan(config, CPU, family, folds) == (
        False,
        "kan steps slower fused on a CPU (Family.fuse_on_cpu)",
    )
    assert fuse_plan(config, torch.device("cuda"), family, folds) == (True, "")


def test_a_module_vmap_cannot_batch_trains_unfused_and_says_why(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def refuse(self: StackedModules, batch: Batch, slots: Any = None) -> torch.Tensor:
        raise RuntimeError("Batching rule not implemented for aten::example")

    monkeypatch.setattr(StackedModules, "loss", refuse)
    with caplog.at_level(logging.WARNING, logger=fusion.log.name):
        trainer = _trainer("kan")
    assert trainer.fused is None
    assert trainer.unfused_reason == (
        "a fused step failed: RuntimeError: Batching rule not implemented for aten::example"
    )
    assert any("folds train one after another" in r.message for r in caplog.records)
    metrics = trainer.train_epoch()  # and trains, unfused
    assert metrics["fused_folds"] == 0 and metrics["step"] == 20
    for run in trainer.folds:  # the slots got their own storage back
        assert all(p.is_contiguous() for p in run.model.parameters())


@pytest.mark.parametrize("device", ["cpu", ON_CUDA])
def test_the_fused_try_out_step_takes_two_windows_per_slot_off_cuda_the_batch_on_it(
    device: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Off CUDA the try-out only asks whether vmap batches the module: two windows a
    slot (fusion.TRIED_WINDOWS), whatever the batch size. On CUDA it takes the trial's
    batch (kernels are chosen by shape there). The real steps take full batches."""
    original = StackedModules.loss
    windows: list[tuple[int, int]] = []

    def recorded(self: StackedModules, batch: Batch, slots: Any = None) -> torch.Tensor:
        windows.append(tuple(batch.y.shape[:2]))
        return original(self, batch, slots)

    monkeypatch.setattr(StackedModules, "loss", recorded)
    trainer = _trainer("kan", batch_size=16, max_steps_per_epoch=2, device=device)
    assert trainer.fused is not None, trainer.unfused_reason
    tried = 16 if device == "cuda" else 2  # 2 slots (folds) of that many windows
    assert windows == [(2, tried)]
    trainer.train_epoch()
    assert windows[1:] and set(windows[1:]) == {(2, 16)}
    assert fusion.tried_windows(torch.device("cpu"), 1) == 1  # never more than the batch


def test_a_fused_bf16_trial_falls_back_to_f32_and_fuses_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    trainer = _trainer("liquid", "bf16", fallback_after=3, log_every=4)
    fused = trainer.fused
    assert fused is not None
    original = StackedModules.loss
    calls = []

    def poisoned(self: StackedModules, batch: Batch, slots: Any = None) -> torch.Tensor:
        calls.append(1)
        value = original(self, batch, slots)
        return value * float("nan") if 2 <= len(calls) <= 5 else value

    monkeypatch.setattr(StackedModules, "loss", poisoned)
    metrics = trainer.train_epoch()
    assert metrics["fell_back_to_f32"] == 1
    assert trainer.fused is not None and trainer.fused is not fused  # fused again, in f32
    # Fused steps 2-4 skipped (a streak of 3 at the check after step 4); fusing again
    # tries one step first (loss call 5), then the epoch goes on in the new f32 model:
    # each fold's step count is its 1 step before the fallback and steps 5-10 after, all
    # in the model the folds now use.
    assert metrics["skipped_steps"] == 6 and metrics["step"] == 20
    steps = trainer.fused.optimizer.state[next(trainer.fused.model.parameters())]["step"]
    assert steps.tolist() == [7.0, 7.0]
    assert {p.dtype for p in trainer.fused.model.parameters()} == {F32}
    assert {p.dtype for run in trainer.folds for p in run.model.parameters()} == {F32}
    assert metrics["fused_folds"] == 2
