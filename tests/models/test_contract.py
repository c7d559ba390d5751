"""One contract over every model family x every precision policy (in the spirit of
optuna's BasicSamplerTestCase and Lightning's test_all): the invariants every family
promises, checked the same way for all ten.

Per (family, policy), on tiny shapes:
* parameter dtypes are the policy's (bf16 weights under bf16, except the family's
  documented ``keep_f32`` tensors; f32 master weights under every other policy);
* outputs have the contract's shapes: forecast positions (B, A) in [-1, 1], rl actions (N,)
  in [0, n_actions);
* a short run is finite: no NaN/inf metric, no skipped step;
* a checkpoint round trip is bit-exact, and training resumed from it gives the same
  numbers as an uninterrupted run (so: same seed, same numbers).
Learning the planted signal is asserted for each family in f32 and bf16 by
``test_learns_the_planted_signal`` below, with each family's measured budget.

Tables below check, per family and without the trainer: the family record and its search
space, config validation (every error names the field), shape refusals, parameter counts,
and for the forecast families the module under bf16 (kept-f32 tensors, closeness to f32,
a guarded step) and the loss under each policy. The per-family test files keep what is
particular to a paper (segsum, DDIM, GAE, ...).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from models import family_names, get_family
from models.base import (
    Batch,
    Choice,
    DataShape,
    Dim,
    Int,
    count_parameters,
)
from tests.models.learning import LEARNING
from trainables.contract import PRECISIONS, check_learning, check_precision
from trainables.precision import (
    BF16,
    F32,
    StepGuard,
    floating_dtypes,
    get_policy,
    keep_f32_names,
)
from trainables.stacked import setting_buffers

# Small configurations of every family (a few thousand parameters), fast on one CPU thread.
TINY: dict[str, dict[str, Any]] = {name: dict(get_family(name).tiny) for name in family_names()}


def test_every_family_is_registered_and_covered() -> None:
    assert set(family_names()) == set(TINY) == set(LEARNING)
    assert len(family_names()) == 10


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("model", family_names())
def test_family_contract(model: str, precision: str, tmp_path: Path) -> None:
    """The contract `hpo check-family` runs (trainables/contract.py), per precision: dtypes,
    output shapes and positions in [-1, 1], a finite short run that skips nothing, a
    bit-exact checkpoint round trip and resume."""
    check_precision(model, precision, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["f32", "bf16"])
@pytest.mark.parametrize("model", family_names())
def test_learns_the_planted_signal(model: str, precision: str) -> None:
    check_learning(model, LEARNING[model], precision)


# --------------------------------------------------------------------------------------
# The family records and their configs (no training)

TRAINER_KEYS = {"lr", "batch_size", "weight_decay"}  # the trainer's space, never a family's


def _choice_grid(space: Mapping[str, Dim]) -> list[dict[str, Any]]:
    choices = {k: d.options for k, d in space.items() if isinstance(d, Choice)}
    return [
        dict(zip(choices, combo, strict=True)) for combo in itertools.product(*choices.values())
    ]


@pytest.mark.parametrize("model", family_names())
def test_family_record_and_search_space(model: str) -> None:
    family = get_family(model)
    assert family.name == model and family.kind in ("forecast", "rl")
    assert family.paper and family.keeps_f32 and family.summary
    space = family.search_space
    assert set(space) <= set(family.config_fields())
    assert not TRAINER_KEYS & set(space)
    default = family.default_config()
    for name, dim in space.items():
        assert dim.contains(getattr(default, name)), name
    # Every combination of the categorical settings the searcher can draw is a valid
    # config (d_model x n_heads for the attention families, d_model x head_dim for
    # Mamba-2), and so is each end of every numeric range with the rest at its default.
    for values in _choice_grid(space):
        family.make_config(values)
    for name, dim in space.items():
        if not isinstance(dim, Choice):
            family.make_config({name: dim.low})
            family.make_config({name: dim.high})


@pytest.mark.parametrize("model", family_names())
def test_integer_settings_accept_numpy_integers_and_refuse_bools(model: str) -> None:
    # Searchers may hand over numpy integers; a bool is an int to Python, never a size.
    family = get_family(model)
    default = family.default_config()
    ints = [
        f.name
        for f in dataclasses.fields(default)
        if type(getattr(default, f.name)) is int and getattr(default, f.name) >= 1
    ]
    assert ints, model
    for name in ints:
        value = getattr(default, name)
        assert getattr(family.make_config({name: np.int64(value)}), name) == value
        with pytest.raises(ValueError, match=name):
            family.make_config({name: True})


@pytest.mark.parametrize("model", family_names())
def test_a_setting_the_family_lacks_is_refused_naming_those_it_has(model: str) -> None:
    family = get_family(model)
    with pytest.raises(
        ValueError, match=r"has no setting\(s\) \['not_a_setting'\]; known: \["
    ) as err:
        family.make_config({"not_a_setting": 1})
    assert all(repr(name) in str(err.value) for name in family.config_fields())


# (model, settings, what the error must name)
BAD_CONFIGS: list[tuple[str, dict[str, Any], str]] = [
    ("dqn", {"gamma": 1.0}, "dqn.gamma must be in"),
    ("dqn", {"n_step": 0}, "dqn.n_step must be an integer >= 1"),
    ("dqn", {"replay_batch_size": 1}, "dqn.replay_batch_size must be >= 2"),
    ("dqn", {"tau": 0.0}, "dqn.tau must be in"),
    ("dqn", {"v_min": 20.0}, "dqn.v_min"),
    ("dqn", {"buffer_capacity": 8}, "dqn.buffer_capacity"),
    ("dqn", {"encoder": "lstm"}, "dqn.encoder must be one of"),
    ("ppo", {"gamma": 1.0}, "ppo.gamma must be in"),
    ("ppo", {"gae_lambda": 1.5}, "ppo.gae_lambda must be in"),
    ("ppo", {"clip_coef": 0.0}, "ppo.clip_coef must be in"),
    ("ppo", {"ent_coef": -0.1}, "ppo.ent_coef must be >= 0"),
    ("ppo", {"ppo_epochs": 0}, "ppo.ppo_epochs must be an integer >= 1"),
    ("ppo", {"recurrent": True, "bptt": 5}, r"ppo.bptt \(5\) must divide ppo.n_steps \(16\)"),
    ("ppo", {"recurrent": True, "num_envs": 2, "minibatches": 8}, r"ppo.minibatches \(8\) exceeds"),
    ("ppo", {"num_envs": 2, "n_steps": 2, "minibatches": 3}, "fewer than 2 transitions"),
    ("tft", {"d_model": 30, "n_heads": 4}, "n_heads"),
    ("tft", {"quantiles": (0.1, 0.9)}, "quantiles"),
    ("tft", {"quantiles": (0.5, 0.9)}, "quantiles"),
    ("tft", {"dropout": 1.0}, "dropout"),
    ("tft", {"position_scale": 0.0}, "position_scale"),
    ("mamba2", {"d_model": 20, "head_dim": 16}, "head_dim"),
    ("mamba2", {"dt_min": 0.2, "dt_max": 0.1}, "dt_min"),
    ("mamba2", {"chunk_size": 0}, "chunk_size"),
    ("mamba2", {"loss": "mae"}, "loss"),
    ("mamba2", {"dropout": 1.0}, "dropout"),
    ("mamba2", {"position_scale": 0.0}, "position_scale"),
    ("tggn", {"channels": 0}, "channels"),
    ("tggn", {"top_k": 0}, "top_k"),
    ("tggn", {"temporal": "lstm"}, "temporal"),
    ("tggn", {"propagation": "gat"}, "propagation"),
    ("tggn", {"n_layers": 0}, "n_layers"),
    ("tggn", {"kernel_size": 1}, "kernel_size"),
    ("tggn", {"hops": 0}, "hops"),
    ("tggn", {"beta": 1.0}, "beta"),
    ("tggn", {"dropout": 1.0}, "dropout"),
    ("tggn", {"loss": "l1"}, "loss"),
    ("tggn", {"huber_delta": 0.0}, "huber_delta"),
    ("tggn", {"position_scale": math.inf}, "position_scale"),
    ("tlob", {"hidden_dim": 7}, "hidden_dim"),
    ("tlob", {"n_layers": 0}, "n_layers"),
    ("tlob", {"n_heads": 0}, "n_heads"),
    ("tlob", {"dropout": 1.0}, "dropout"),
    ("tlob", {"loss": "l1"}, "loss"),
    ("tlob", {"huber_delta": -1.0}, "huber_delta"),
    ("tlob", {"position_scale": 0.0}, "position_scale"),
    ("liquid", {"mode": "pure"}, "mode"),
    ("liquid", {"backbone_activation": "swish"}, "backbone_activation"),
    ("liquid", {"hidden": 0}, "hidden"),
    ("liquid", {"backbone_dropout": 1.0}, "backbone_dropout"),
    ("liquid", {"position_scale": 0.0}, "position_scale"),
    ("kan", {"grid_size": 0}, "grid_size"),
    ("kan", {"spline_order": 0}, "spline_order"),
    ("kan", {"grid_eps": 1.5}, "grid_eps"),
    ("kan", {"reg_lambda": -1e-3}, "reg_lambda"),
    ("xlstm", {"blocks": "mx"}, "blocks"),
    ("xlstm", {"blocks": ""}, "blocks"),
    ("xlstm", {"d_model": 30, "n_heads": 4}, "n_heads"),
    ("xlstm", {"d_model": 33, "n_heads": 2, "qkv_block_size": 4, "blocks": "m"}, "qkv_block_size"),
    ("xlstm", {"proj_factor": 0.5}, "proj_factor"),
    ("xlstm", {"loss": "mae"}, "loss"),
    ("xlstm", {"dropout": 1.0}, "dropout"),
    ("diffusion", {"schedule": "quadratic"}, "schedule"),
    ("diffusion", {"encoder": "lstm"}, "encoder"),
    ("diffusion", {"diffusion_steps": 50, "sampling_steps": 51}, "sampling_steps"),
    ("diffusion", {"n_samples": 15}, "n_samples"),
    ("diffusion", {"hidden": 15}, "hidden"),
    ("diffusion", {"noise_draws": 0}, "noise_draws"),
    ("diffusion", {"diffusion_steps": 1, "sampling_steps": 1}, "diffusion_steps"),
    ("diffusion", {"position_scale": math.inf}, "position_scale"),
    ("diffusion", {"n_samples": True}, "n_samples"),
]


@pytest.mark.parametrize(
    ("model", "values", "message"),
    BAD_CONFIGS,
    ids=[f"{m}-{'-'.join(v)}" for m, v, _ in BAD_CONFIGS],
)
def test_config_validation_names_the_field(
    model: str, values: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        get_family(model).make_config(values)


def test_every_family_has_config_validation_cases() -> None:
    assert {m for m, _, _ in BAD_CONFIGS} == set(family_names())


# SHAPE is the families' default test shape: F = 8 features, L = 32 bars, A = 4 assets.
SHAPE = DataShape(n_features=8, lookback=32, n_assets=4)
SMALL = DataShape(n_features=8, lookback=16, n_assets=2)  # TLOB's CPU-fast shape

# (model, settings, shape built for, what the error must name)
BAD_SHAPES: list[tuple[str, dict[str, Any], DataShape, str]] = [
    ("tlob", {}, DataShape(n_features=8, lookback=7, n_assets=1), "lookback"),
    ("tlob", {}, DataShape(n_features=1, lookback=8, n_assets=1), "features"),
    ("kan", {"window": 33}, SHAPE, "window must be <= the lookback L=32"),
]


@pytest.mark.parametrize(("model", "values", "shape", "message"), BAD_SHAPES)
def test_build_refuses_a_data_shape_it_cannot_read(
    model: str, values: dict[str, Any], shape: DataShape, message: str
) -> None:
    family = get_family(model)
    with pytest.raises(ValueError, match=message):
        family.build(family.make_config(values), shape)


FORECAST = [m for m in family_names() if get_family(m).kind == "forecast"]

# (model, shape built for, window fed (B, A, L, F), gaps length, what the error must name)
BAD_INPUTS: list[tuple[str, DataShape, tuple[int, int, int, int], int, str]] = [
    *[(m, SHAPE, (1, 3, 12, 8), 12, "built for A=4") for m in FORECAST if m != "tlob"],
    ("tlob", SMALL, (1, 2, 12, 8), 12, "L=16 bars"),
    ("liquid", SHAPE, (1, 4, 12, 8), 13, "gaps"),
]


@pytest.mark.parametrize(("model", "shape", "window", "gaps", "message"), BAD_INPUTS)
def test_module_refuses_a_window_of_another_shape(
    model: str, shape: DataShape, window: tuple[int, int, int, int], gaps: int, message: str
) -> None:
    family = get_family(model)
    module = family.build(family.default_config(), shape)
    batch = Batch(torch.zeros(window), torch.zeros(window[:2]), torch.ones(window[0], gaps))
    with pytest.raises(ValueError, match=message):
        module.positions(batch)


# (model, settings, shape, parameters): the default size first, at SHAPE unless noted;
# rl families count the optimizer's parameters (DQN's target network is not trained).
PARAMETER_COUNTS: list[tuple[str, dict[str, Any], DataShape, int]] = [
    # encoder 8*64 + 64*32 + 64, torso 65*64+64, value 64+1, advantage 3*64+3 (one asset)
    ("dqn", {}, DataShape(8, 32, 1), 2624 + 4224 + 65 + 195),
    ("dqn", {"encoder": "flat"}, DataShape(8, 32, 1), 16448 + 4224 + 65 + 195),
    # encoder 256*64+64, torso 65*64+64, policy 64*3+3, value 64+1
    ("ppo", {}, DataShape(8, 32, 1), 16448 + 4224 + 195 + 65),
    # + LSTMCell(64, 64): 4*64*(64+64) weights + 2*4*64 biases
    ("ppo", {"recurrent": True}, DataShape(8, 32, 1), 20932 + 32768 + 512),
    ("tft", {}, SHAPE, 92_339),
    # Without the asset embedding: no static encoder and no context inputs (2 x 32*32).
    ("tft", {"static_embedding": False}, SHAPE, 92_339 - 17_280 - 2 * 32 * 32),
    # Per block: in_proj 32 x (64 + 64 + 32 + 4), depthwise conv 96 x (4 + 1), dt_bias,
    # A_log, D (4 each), gated-norm gain 64, out_proj 64 x 32, block norm 32; plus the
    # embedding 8*32+32, final norm 32 and head 33.
    ("mamba2", {}, SHAPE, (8 * 32 + 32) + 2 * (32 * 164 + 96 * 5 + 3 * 4 + 64 + 64 * 32 + 32) + 65),
    ("tggn", {}, SHAPE, 9_089),
    ("tggn", {"temporal": "gru"}, SHAPE, 17_537),
    (
        "tggn",
        {"channels": 8, "skip_channels": 16, "end_channels": 16, "node_dim": 4, "n_layers": 1},
        SHAPE,
        1_169,
    ),
    # Only the node embeddings depend on A: 2 x (A x node_dim).
    ("tggn", {}, DataShape(8, 32, 10), 9_089 + 2 * 6 * 8),
    ("tlob", {}, SHAPE, 44_963),
    # A learned positional embedding adds L x d = 32 x 32.
    ("tlob", {"sinusoidal": False}, SHAPE, 44_963 + 1_024),
    ("tlob", {"hidden_dim": 16, "n_layers": 1}, SMALL, 5_163),
    # Order-book input: only BiN's per-feature weights and the embedding grow with F.
    ("tlob", {}, DataShape(40, 32, 1), 44_963 + 32 * 2 + 32 * 32),
    # Linear(F+H, U) split in two, the 4 fused heads, the head: F=8, H=32, U=64.
    ("liquid", {}, SHAPE, (8 * 64 + 64) + 32 * 64 + (64 * 4 * 32 + 4 * 32) + 33),
    ("liquid", {"backbone_layers": 2}, SHAPE, 10_977 + 64 * 64 + 64),
    # Per edge G + k = 8 coefficients, w_b and w_s; a bias per node: [32, 8, 1] at window 4.
    ("kan", {}, SHAPE, (8 * 32 * 10 + 8) + (1 * 8 * 10 + 1)),
    ("kan", {"n_layers": 2}, SHAPE, 2_649 + (8 * 8 * 10 + 8)),
    ("kan", {"window": 1, "n_layers": 0}, SHAPE, 1 * 8 * 10 + 1),
    # mLSTM block 8,936 and sLSTM block 7,040 between the embedding and the head.
    ("xlstm", {}, SHAPE, (8 * 32 + 32) + 8_936 + 7_040 + 32 + 33),
    ("diffusion", {}, SHAPE, 13_602),
    # GRU 3 * (8*32 + 32*32 + 2*32) = 4032 -> MLP (32*8)*32 + 32 + 32*32 + 32 = 9280.
    ("diffusion", {"encoder": "mlp"}, SHAPE, 13_602 - 4_032 + 9_280),
]


@pytest.mark.parametrize(("model", "values", "shape", "expected"), PARAMETER_COUNTS)
def test_parameter_counts(
    model: str, values: dict[str, Any], shape: DataShape, expected: int
) -> None:
    family = get_family(model)
    module = family.build(family.make_config(values), shape)
    count = (
        count_parameters(module)
        if family.kind == "forecast"
        else sum(p.numel() for p in module.trainable_parameters())
    )
    assert count == expected


def test_default_parameter_counts_are_the_documented_ones() -> None:
    # The config docstrings and models/README.md quote the default size.
    defaults = {
        m: n for m, v, s, n in PARAMETER_COUNTS if not v and s in (SHAPE, DataShape(8, 32, 1))
    }
    assert set(defaults) == set(family_names())
    assert defaults == {
        "dqn": 7_108,
        "ppo": 20_932,
        "tft": 92_339,
        "mamba2": 16_121,
        "tggn": 9_089,
        "tlob": 44_963,
        "liquid": 10_977,
        "kan": 2_649,
        "xlstm": 16_329,
        "diffusion": 13_602,
    }


# --------------------------------------------------------------------------------------
# Forecast families under the precision policies, module level (no trainer)


@dataclass(frozen=True)
class Case:
    """How the module-level policy checks build and feed one forecast family."""

    model: str
    config: dict[str, Any] = field(default_factory=dict)
    shape: DataShape = SHAPE
    length: int = 12  # bars per window: short keeps CPU bf16 fast where no weight needs L
    batch: int = 4
    keep_f32: frozenset[str] = frozenset()  # floating tensors that stay f32 under bf16
    bf16_tol: float = 0.05  # max |bf16 output - f32 output|
    moves: tuple[str, ...] = ()  # parameters the first guarded bf16 step must change
    loss_tol: Mapping[str, float] = field(default_factory=dict)  # precision -> max |loss - f32|
    sampled: bool = False  # the output is f32 samples (diffusion), not a bf16 forecast


DIFFUSION_SCHEDULE = (
    "betas",
    "alphas_cumprod",
    "sqrt_alphas_cumprod",
    "sqrt_one_minus_alphas_cumprod",
)

# Tolerances are from the families' measurements (in the comments), with a margin.
CASES: dict[str, Case] = {
    "tft": Case(
        "tft",
        keep_f32=frozenset({"quantile_levels"}),
        bf16_tol=0.05,  # measured 0.007
        moves=("head.proj.weight",),
        loss_tol={"bf16-mixed": 2e-3},  # measured 2e-4
    ),
    "mamba2": Case(
        "mamba2",
        length=32,
        keep_f32=frozenset(
            f"blocks.{i}.mixer.{p}" for i in range(2) for p in ("A_log", "D", "dt_bias")
        ),
        bf16_tol=0.05,  # measured 0.011
        moves=("blocks.0.mixer.A_log", "blocks.0.mixer.in_proj.weight"),
        loss_tol=dict.fromkeys(PRECISIONS, 0.02),  # measured <= 0.002 (bf16-mixed)
    ),
    "tggn": Case(
        "tggn",
        bf16_tol=0.02,  # measured 0.002
        moves=("graph.source",),  # the graph itself is learned
        loss_tol={"bf16-mixed": 5e-3},  # measured 4e-4
    ),
    "tggn-gru": Case(
        "tggn",
        {"temporal": "gru", "propagation": "diffusion"},
        bf16_tol=0.02,  # measured 0.001
    ),
    "tlob": Case(
        "tlob",
        shape=SMALL,
        length=SMALL.lookback,  # BiN and the feature attention have weights per bar
        bf16_tol=0.06,  # measured 0.020
        moves=("bin.mix",),
        loss_tol={"bf16-mixed": 3e-2},  # measured 0.011 (loss 1.48)
    ),
    "liquid": Case(
        "liquid",
        bf16_tol=0.03,  # measured <= 0.0035 (5 seeds)
        loss_tol={"bf16-mixed": 4e-3},  # measured <= 4e-4 (5 seeds)
    ),
    "kan": Case(
        "kan",
        batch=64,
        keep_f32=frozenset({"layers.0.grid", "layers.1.grid"}),
        bf16_tol=0.02,  # measured <= 0.0027 (5 seeds)
        loss_tol={"bf16-mixed": 1e-3},  # measured <= 5e-6: the loss averages ~1e-3 moves
    ),
    "xlstm": Case(
        "xlstm",
        keep_f32=frozenset({"blocks.0.gate_bias", "blocks.1.gate_bias"}),
        bf16_tol=0.05,  # measured 0.007
        moves=("blocks.1.recurrent",),  # R learns from its zero init
        loss_tol=dict.fromkeys(PRECISIONS, 0.02),  # measured <= 2e-4
    ),
    "diffusion": Case(
        "diffusion",
        batch=6,
        keep_f32=frozenset({*(f"schedule.{n}" for n in DIFFUSION_SCHEDULE), "denoiser.time.freqs"}),
        bf16_tol=0.03,  # samples, measured 0.003
        moves=("prior_mean.weight",),  # the zero init moves
        loss_tol={"bf16-mixed": 2e-3},  # measured 1.2e-4
        sampled=True,
    ),
}


def _module(case: Case) -> Any:  # a forecast module (family-specific attributes)
    torch.manual_seed(0)
    family = get_family(case.model)
    module = family.build(family.make_config(case.config), case.shape).eval()
    if case.sampled:
        # Move the zero-initialized output layers off zero (as training does), so that
        # samples depend on the window.
        g = torch.Generator().manual_seed(100)
        with torch.no_grad():
            for layer, scale in ((module.denoiser.out, 0.05), (module.prior_mean, 0.2)):
                layer.weight.copy_(scale * torch.randn(layer.weight.shape, generator=g))
                layer.bias.zero_()
    return module


def _batch(case: Case) -> Batch:
    g = torch.Generator().manual_seed(1)
    b, a, f = case.batch, case.shape.n_assets, case.shape.n_features
    x = torch.randn(b, a, case.length, f, generator=g)
    y = torch.randn(b, a, generator=g)
    gaps = torch.rand(b, case.length, generator=g) * 3 + 0.5  # CfC reads them; others don't
    return Batch(x=x, y=y, gaps=gaps)


def _output(case: Case, module: Any, batch: Batch) -> torch.Tensor:
    if case.sampled:
        return module.sample(batch.x)
    if case.model == "liquid":
        return module(batch.x, batch.gaps)
    return module(batch.x)


def test_every_forecast_family_has_a_policy_case() -> None:
    assert {c.model for c in CASES.values()} == set(FORECAST)


@pytest.mark.parametrize("case", CASES)
def test_bf16_cast_module_keeps_its_f32_tensors_and_is_close_to_f32(case: str) -> None:
    spec = CASES[case]
    batch = _batch(spec)
    with torch.no_grad():
        reference = _output(spec, _module(spec), batch)
    policy = get_policy("bf16")
    module = policy.convert_module(_module(spec))
    dtypes = floating_dtypes(module)
    settings = setting_buffers(module)  # dropout rates: probabilities, kept f32
    assert {name for name, dt in dtypes.items() if dt == F32} - settings == spec.keep_f32
    assert all(dtypes[name] == F32 for name in settings)
    assert set(dtypes.values()) <= {F32, BF16}
    bf_batch = Batch(x=policy.convert_input(batch.x), y=batch.y, gaps=batch.gaps)
    with torch.no_grad():
        out = _output(spec, module, bf_batch)
    assert out.dtype == (F32 if spec.sampled else BF16)
    assert bool(torch.isfinite(out).all())
    assert float((out.float() - reference).abs().max()) < spec.bf16_tol
    positions = module.positions(bf_batch)
    assert positions.dtype == F32 and bool((positions.abs() <= 1).all())
    module.train()
    loss = module.loss(bf_batch)
    assert loss.dtype == F32 and math.isfinite(loss.item())
    loss.backward()
    for name, param in module.named_parameters():
        assert param.grad is not None and param.grad.dtype == param.dtype, name
        assert bool(torch.isfinite(param.grad).all()), name


@pytest.mark.parametrize("case", [c for c in CASES if c != "tggn-gru"])
def test_bf16_guarded_step_moves_the_weights_and_keeps_their_dtypes(case: str) -> None:
    spec = CASES[case]
    policy = get_policy("bf16")
    module = policy.convert_module(_module(spec)).train()
    batch = _batch(spec)
    bf_batch = Batch(x=policy.convert_input(batch.x), y=batch.y, gaps=batch.gaps)
    dtypes = floating_dtypes(module)
    params = dict(module.named_parameters())
    before = {name: params[name].detach().clone() for name in spec.moves}
    result = policy.backward_and_step(
        module.loss(bf_batch),
        policy.make_optimizer(module.parameters(), lr=1e-3),
        StepGuard(policy.device),
        max_grad_norm=1.0,
    )
    assert bool(result.ok) and math.isfinite(result.grad_norm.item())
    for name, value in before.items():
        assert not torch.equal(params[name], value), name
    assert floating_dtypes(module) == dtypes


LOSS_CASES = [(c, p) for c, spec in CASES.items() for p in spec.loss_tol]


@pytest.mark.parametrize(("case", "policy_name"), LOSS_CASES)
def test_policy_loss_is_finite_and_close_to_f32(case: str, policy_name: str) -> None:
    spec = CASES[case]
    batch = _batch(spec)
    f32_module = _module(spec)
    torch.manual_seed(1)  # the diffusion loss draws timesteps and noise
    reference = f32_module.loss(batch).item()
    policy = get_policy(policy_name)
    module = policy.convert_module(_module(spec))
    run_batch = Batch(x=policy.convert_input(batch.x), y=batch.y, gaps=batch.gaps)
    torch.manual_seed(1)
    with policy.autocast():
        loss = module.loss(run_batch)
    assert loss.dtype == F32
    assert abs(loss.item() - reference) < spec.loss_tol[policy_name]
    loss.backward()
    for name, param in module.named_parameters():
        assert param.grad is not None and bool(torch.isfinite(param.grad).all()), name


# --------------------------------------------------------------------------------------
# shape settings: what fused slots must share


def _structure(module: torch.nn.Module) -> list[tuple[str, str, tuple[int, ...], str]]:
    """Every submodule's class, and every parameter's and buffer's shape and dtype."""
    tensors = [
        (name, "tensor", tuple(t.shape), str(t.dtype))
        for name, t in (*module.named_parameters(), *module.named_buffers())
    ]
    return [(name, type(sub).__name__, (), "") for name, sub in module.named_modules()] + tensors


def _values(dim: Any) -> list[Any]:
    if isinstance(dim, Choice):
        return list(dim.options)
    mid = (dim.low + dim.high) / 2
    return [dim.low, type(dim.low)(mid) if isinstance(dim, Int) else mid, dim.high]


@pytest.mark.parametrize("model", family_names())
def test_settings_that_change_a_modules_shape_are_declared(model: str) -> None:
    """Fused slots share one module's shapes: a search-space setting that changes a
    parameter's or buffer's shape or dtype, or a submodule, is in ``Family.shape_settings``
    (every other one may differ between slots). Each setting is tried at its range's
    ends and middle (every option of a choice) over the tiny configuration."""
    family = get_family(model)
    shape = DataShape(n_features=6, lookback=16, n_assets=2)
    undeclared = []
    for name, dim in family.search_space.items():
        seen = set()
        for value in _values(dim):
            try:
                config = family.make_config({**TINY[model], name: value})
                torch.manual_seed(0)
                seen.add(repr(_structure(family.build(config, shape))))
            except ValueError:
                continue  # a value this base configuration refuses (a head count, say)
        if len(seen) > 1 and name not in family.shape_settings:
            undeclared.append(name)
    assert not undeclared, f"{model}: {undeclared} change the module's shapes"
    assert family.shape_settings <= set(family.config_fields())


@pytest.mark.parametrize("model", [m for m in FORECAST if get_family(m).fuses])
def test_settings_fused_slots_read_per_slot_are_tensors_no_checkpoint_holds(
    model: str,
) -> None:
    """Slots may differ in a dropout rate only where every dropout is
    ``models.ops.Dropout`` (a plain ``nn.Dropout`` keeps its rate in Python, the first
    slot's for all). A setting buffer (``setting_buffers``) is 0-d, kept f32 and not
    saved: checkpoints stay what they were."""
    family = get_family(model)
    module = family.build(
        family.make_config(dict(TINY[model])), DataShape(n_features=6, lookback=16, n_assets=2)
    )
    plain = [n for n, m in module.named_modules() if type(m) is torch.nn.Dropout]
    assert not plain, f"{model}: plain nn.Dropout at {plain}"
    settings = setting_buffers(module)
    if any("dropout" in name for name in family.per_trial_settings):
        assert any(name.endswith(".rate") for name in settings)
    buffers = dict(module.named_buffers())
    kept = keep_f32_names(module)
    for name in settings:
        assert buffers[name].dim() == 0 and buffers[name].dtype == F32, name
        assert name in kept and name not in module.state_dict(), name
