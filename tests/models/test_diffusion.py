"""Tests of the conditional diffusion family (models/diffusion.py, models/nets/diffusion.py).

Run: .venv/bin/python -m pytest tests/models/test_diffusion.py -q
"""

from __future__ import annotations

import math

import pytest
import torch

from models.base import Batch, DataShape, ForecastModel
from models.diffusion import FAMILY, DiffusionConfig
from models.nets.diffusion import (
    ConditionalDiffusion,
    NoiseSchedule,
    antithetic_noise,
    build,
    ddim_sample,
    ddim_timesteps,
    make_betas,
    samples_to_positions,
)
from trainables.precision import BF16, F32

SHAPE = DataShape(n_features=8, lookback=32, n_assets=4)
B, L = 6, 12  # short windows keep CPU bf16 fast; the GRU encoder takes any length


def _model(config: DiffusionConfig | None = None, seed: int = 0) -> ConditionalDiffusion:
    torch.manual_seed(seed)
    return build(config or DiffusionConfig(), SHAPE).eval()


def _trained_looking(seed: int = 0) -> ConditionalDiffusion:
    """A model whose zero-initialized output layers were moved off zero (as training does),
    so its positions depend on the window."""
    model = _model(seed=seed)
    g = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for layer, scale in ((model.denoiser.out, 0.05), (model.prior_mean, 0.2)):
            layer.weight.copy_(scale * torch.randn(layer.weight.shape, generator=g))
            layer.bias.zero_()
    return model


def _batch(seed: int = 1, b: int = B) -> Batch:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, SHAPE.n_assets, L, SHAPE.n_features, generator=g)
    y = torch.randn(b, SHAPE.n_assets, generator=g)
    return Batch(x=x, y=y, gaps=torch.ones(b, L))


def _cosine_f(u: float, diffusion_steps: int, s: float = 0.008) -> float:
    return math.cos((u / diffusion_steps + s) / (1 + s) * math.pi / 2) ** 2


# --------------------------------------------------------------------------------------
# Noise schedule


@pytest.mark.parametrize("schedule", ["cosine", "linear"])
@pytest.mark.parametrize("diffusion_steps", [50, 100, 1000])
def test_schedule_is_f32_monotone_and_inside_the_unit_interval(
    schedule: str, diffusion_steps: int
) -> None:
    s = NoiseSchedule(schedule, diffusion_steps)
    for name in NoiseSchedule.keep_f32:
        assert getattr(s, name).dtype == F32 and getattr(s, name).shape == (diffusion_steps,), name
    betas, abar = s.betas, s.alphas_cumprod
    assert bool(((betas > 0) & (betas <= 0.999)).all())
    assert bool((betas.diff() > 0).all())  # noise added per step only grows
    assert bool(((abar > 0) & (abar < 1)).all())
    assert bool((abar.diff() < 0).all())  # strictly decreasing: no two timesteps alike
    assert float(abar[-1]) < 1e-4  # the last step is (near) pure noise
    torch.testing.assert_close(s.sqrt_alphas_cumprod**2, abar, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(s.sqrt_one_minus_alphas_cumprod**2, 1 - abar, atol=1e-6, rtol=1e-5)


def test_schedule_values_match_the_papers() -> None:
    # Cosine (Nichol & Dhariwal eq. 17): abar_t = f(t+1) / f(0) before the final clip.
    s = NoiseSchedule("cosine", 100)
    expected = torch.tensor([_cosine_f(t + 1, 100) / _cosine_f(0, 100) for t in range(99)])
    torch.testing.assert_close(s.alphas_cumprod[:99], expected.float(), atol=1e-7, rtol=1e-6)
    assert float(s.betas[-1]) == pytest.approx(0.999)
    # Linear (Ho et al.): 1e-4 -> 0.02 at T = 1000, scaled by 1000 / T.
    assert make_betas("linear", 1000)[0] == pytest.approx(1e-4)
    assert make_betas("linear", 1000)[-1] == pytest.approx(0.02)
    assert make_betas("linear", 100)[-1] == pytest.approx(0.2)
    # sqrt(1 - abar) comes from the float64 product: exact to f32 even where abar ~ 1.
    s = NoiseSchedule("linear", 1000)
    assert float(s.sqrt_one_minus_alphas_cumprod[0]) == pytest.approx(math.sqrt(1e-4), rel=1e-6)


def test_why_the_schedule_stays_f32() -> None:
    # What a bf16 cast would do to the cosine schedule at T = 1000 (the module docstring).
    s = NoiseSchedule("cosine", 1000)
    abar16 = s.alphas_cumprod.to(BF16)
    assert int((abar16 == 1).sum()) == 21  # 21 timesteps with noise variance exactly 0
    assert torch.unique(abar16).numel() == 593  # of 1000 distinct noise levels
    assert torch.tensor(999.0).to(BF16).item() == 1000.0  # and timestep 999 is not 999


def test_q_sample_matches_the_closed_form() -> None:
    s = NoiseSchedule("cosine", 100)
    g = torch.Generator().manual_seed(0)
    x0 = torch.randn(7, 3, 1, generator=g)
    noise = torch.randn(7, 3, 1, generator=g)
    t = torch.randint(0, 100, (7, 3), generator=g)
    betas = make_betas("cosine", 100)
    abar = torch.tensor([math.prod(1 - b for b in betas[: int(k) + 1]) for k in t.flatten()])
    abar = abar.reshape(7, 3, 1).double()
    expected = abar.sqrt() * x0.double() + (1 - abar).sqrt() * noise.double()
    x_t = s.q_sample(x0, t, noise)
    assert x_t.dtype == F32
    torch.testing.assert_close(x_t.double(), expected, atol=1e-6, rtol=1e-6)
    # bf16 inputs still give the f32 closed form of their (exact) values.
    x_t16 = s.q_sample(x0.to(BF16), t, noise)
    assert x_t16.dtype == F32


# --------------------------------------------------------------------------------------
# DDIM sampler


def test_ddim_timesteps_run_from_noisiest_to_cleanest() -> None:
    assert ddim_timesteps(100, 10).tolist() == [99, 88, 77, 66, 55, 44, 33, 22, 11, 0]
    assert ddim_timesteps(100, 100).tolist() == list(range(99, -1, -1))
    assert ddim_timesteps(50, 1).tolist() == [49]
    for diffusion_steps in (50, 100, 1000):
        for k in range(2, diffusion_steps + 1):
            steps = ddim_timesteps(diffusion_steps, k)
            assert steps[0] == diffusion_steps - 1 and steps[-1] == 0, (diffusion_steps, k)
            assert bool((steps.diff() < 0).all()), (diffusion_steps, k)  # no timestep twice
    with pytest.raises(ValueError, match="sampling_steps"):
        ddim_timesteps(10, 11)


@pytest.mark.parametrize("schedule", ["cosine", "linear"])
@pytest.mark.parametrize("steps", [1, 3, 10, 100])
def test_ddim_with_a_perfect_epsilon_oracle_recovers_x0(schedule: str, steps: int) -> None:
    s = NoiseSchedule(schedule, 100)
    g = torch.Generator().manual_seed(0)
    x0 = 3 * torch.randn(5, 4, 1, generator=g)  # (N, S, H)

    def oracle(x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        # The noise that makes x_t out of this x0: exact for a point-mass target.
        return (x_t - s.sqrt_alphas_cumprod[t] * x0) / s.sqrt_one_minus_alphas_cumprod[t]

    x_init = torch.randn(5, 4, 1, generator=g)
    out = ddim_sample(oracle, s, ddim_timesteps(100, steps), x_init)
    assert out.dtype == F32
    # The noisiest cosine step divides by sqrt(abar) = 4.9e-4: the f32 rounding of x_t and
    # eps (~6e-8) comes back ~2000x larger (measured 1.1e-4 for one step).
    torch.testing.assert_close(out, x0, atol=3e-4, rtol=0)


def test_the_ddim_update_in_bf16_would_lose_x0() -> None:
    # The same first step with the state and the noise rounded to bf16 (as a bf16 sampler
    # would hold them): x0_hat = (x_t - sqrt(1-abar) eps) / sqrt(abar) at t = T-1.
    s = NoiseSchedule("cosine", 100)
    x0 = torch.linspace(-2, 2, 9)
    eps = torch.randn(9, generator=torch.Generator().manual_seed(0))
    a, b = s.sqrt_alphas_cumprod[-1], s.sqrt_one_minus_alphas_cumprod[-1]
    x_t = a * x0 + b * eps
    exact = (x_t - b * eps) / a
    rounded = (x_t.to(BF16).float() - b * eps.to(BF16).float()) / a
    assert float((exact - x0).abs().max()) < 3e-4
    assert float((rounded - x0).abs().max()) > 1.0  # bf16 keeps nothing of x0 here


def test_ddim_with_the_gaussian_oracle_samples_the_gaussian() -> None:
    # x0 ~ N(mu, sd^2): E[eps | x_t] = sqrt(1-abar) (x_t - sqrt(abar) mu) / (abar sd^2 + 1 - abar).
    s = NoiseSchedule("cosine", 100)
    mu, sd = 0.3, 0.5

    def oracle(x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        abar = s.alphas_cumprod[t]
        var = abar * sd**2 + 1 - abar
        return s.sqrt_one_minus_alphas_cumprod[t] * (x_t - s.sqrt_alphas_cumprod[t] * mu) / var

    z = antithetic_noise(4096, 1, seed=0)
    full = ddim_sample(oracle, s, ddim_timesteps(100, 100), z)
    assert float(full.mean()) == pytest.approx(mu, abs=1e-3)  # measured 0.29993
    assert float(full.std()) == pytest.approx(sd, rel=0.02)  # measured 0.5016
    few = ddim_sample(oracle, s, ddim_timesteps(100, 10), z)
    assert float(few.mean()) == pytest.approx(mu, abs=1e-3)
    # 10 DDIM steps under-disperse a little (measured 0.433 = 0.87 sd), never over.
    assert 0.8 * sd < float(few.std()) < sd


def test_antithetic_noise_is_seeded_and_mean_zero() -> None:
    z = antithetic_noise(16, 1, seed=3)
    assert z.shape == (16, 1) and z.dtype == F32
    assert torch.equal(z, antithetic_noise(16, 1, seed=3))
    assert not torch.equal(z, antithetic_noise(16, 1, seed=4))
    assert torch.equal(z[:8], -z[8:])
    with pytest.raises(ValueError, match="even"):
        antithetic_noise(15, 1, seed=0)


# --------------------------------------------------------------------------------------
# The model


def test_untrained_model_is_the_standard_normal_prior() -> None:
    model = _model()
    assert isinstance(model, ForecastModel)
    batch = _batch()
    samples = model.sample(batch.x)
    assert samples.shape == (B, SHAPE.n_assets, 16, 1) and samples.dtype == F32
    # Every window gets the same DDIM image of the same antithetic noises: no opinion.
    assert torch.equal(samples, samples[:1, :1].expand_as(samples))
    assert torch.equal(model.positions(batch), torch.zeros(B, SHAPE.n_assets))
    # Its expected noise MSE is E_t[abar_t] (the Gaussian term leaves abar of the variance).
    torch.manual_seed(0)
    big = _batch(seed=2, b=256)
    loss = model.loss(big)
    assert loss.dtype == F32 and loss.shape == ()
    expected = float(model.schedule.alphas_cumprod.mean())  # 0.494
    assert loss.item() == pytest.approx(expected * float(big.y.pow(2).mean()), rel=0.05)


def test_prior_mean_head_shifts_the_samples_exactly() -> None:
    # With F = 0 the model is the Gaussian N(mu(c), 1): the sample mean is mu.
    model = _model()
    with torch.no_grad():
        model.prior_mean.bias.fill_(0.3)
    samples = model.sample(_batch().x)[..., 0]
    torch.testing.assert_close(
        samples.mean(-1), torch.full((B, SHAPE.n_assets), 0.3), atol=2e-3, rtol=0
    )
    pos = model.positions(_batch())
    std = samples.std(-1)
    torch.testing.assert_close(pos, torch.tanh(4.0 * samples.mean(-1) / std), atol=1e-6, rtol=0)
    assert bool((pos > 0.5).all())


def test_loss_is_the_noise_mse_of_the_drawn_timesteps() -> None:
    model = _trained_looking().train()
    batch = _batch()
    torch.manual_seed(5)
    loss = model.loss(batch)
    torch.manual_seed(5)  # replay the draws: t then noise, (N, K) and (N, K, 1)
    n, k = B * SHAPE.n_assets, model.config.noise_draws
    t = torch.randint(0, 100, (n, k))
    noise = torch.randn(n, k, 1)
    c = model.condition(batch.x).unsqueeze(1)
    x_t = model.schedule.q_sample(batch.y.reshape(n, 1, 1).expand(n, k, 1), t, noise)
    eps = model.epsilon(x_t, t, c, model.prior_mean(c))
    assert loss.dtype == F32
    torch.testing.assert_close(loss, ((eps - noise) ** 2).mean())


def test_positions_are_deterministic_bounded_and_per_window() -> None:
    model = _trained_looking()
    batch = _batch()
    pos = model.positions(batch)
    assert pos.shape == (B, SHAPE.n_assets) and pos.dtype == F32
    assert not pos.requires_grad
    assert torch.equal(pos, model.positions(batch))  # two calls, same numbers
    assert bool((pos.abs() <= 1).all())
    assert 0 < int((pos > 0).sum()) < pos.numel()  # both signs exercised
    assert float(pos.std()) > 0.05
    # Common random numbers: a window's position does not depend on its batch-mates.
    part = Batch(x=batch.x[2:4], y=batch.y[2:4], gaps=batch.gaps[2:4])
    torch.testing.assert_close(model.positions(part), pos[2:4], atol=1e-6, rtol=0)
    # Another sampler seed gives other (but again reproducible) noises.
    other = _trained_looking()
    other.config = DiffusionConfig(sampler_seed=1)
    assert not torch.equal(other.positions(batch), pos)


def test_samples_to_positions_is_mean_over_std() -> None:
    samples = torch.tensor([[1.0, 2.0, 3.0, 2.0], [-1.0, -1.0, -1.0, -1.0]]).unsqueeze(-1)
    pos = samples_to_positions(samples, scale=0.5)
    std = samples[0, :, 0].std().item()
    assert pos[0].item() == pytest.approx(math.tanh(0.5 * 2.0 / std), abs=1e-6)
    assert pos[1].item() == pytest.approx(-1.0)  # zero spread: saturated, finite


def test_schedule_buffers_are_not_checkpointed() -> None:
    state = _model().state_dict()
    assert not any(name.startswith("schedule.") for name in state)
    assert "sampling_timesteps" not in state


def test_coupled_extremes_of_the_search_space_are_valid_configs() -> None:
    FAMILY.make_config({"diffusion_steps": 50, "sampling_steps": 50, "n_samples": 8, "hidden": 16})
    FAMILY.make_config({"diffusion_steps": 1000, "schedule": "linear", "denoiser_layers": 4})


def test_mlp_encoder_reads_exactly_the_lookback() -> None:
    mlp = _model(DiffusionConfig(encoder="mlp"))
    x = torch.randn(2, SHAPE.n_assets, SHAPE.lookback, SHAPE.n_features)
    assert mlp.sample(x).shape == (2, SHAPE.n_assets, 16, 1)
    with pytest.raises(ValueError, match="L=32"):
        mlp.positions(_batch())
