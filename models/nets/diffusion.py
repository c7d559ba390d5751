"""Conditional denoising diffusion over the next standardized return path.

Ho, Jain & Abbeel (2020), "Denoising Diffusion Probabilistic Models", NeurIPS; conditioned
on the past window in the manner of TimeGrad (Rasul, Seward, Schuster & Vollgraf 2021,
"Autoregressive denoising diffusion models for multivariate probabilistic time series
forecasting", ICML) and CSDI (Tashiro, Song, Song & Ermon 2021, NeurIPS); sampled with
DDIM (Song, Meng & Ermon 2021, "Denoising Diffusion Implicit Models", ICLR); cosine noise
schedule of Nichol & Dhariwal (2021, "Improved denoising diffusion probabilistic models").

Given one asset's window of ``L`` past bars (assets are folded into the batch), the model
learns the law of the path ``x0`` of the next ``H`` standardized returns; ``H = 1`` here
(``Batch.y`` holds the next bar's return only). Loss: DDPM's noise MSE in f32, averaged over
``noise_draws`` (timestep, noise) draws per window. Position: ``tanh(scale * mean / std)``
of the next return over S DDIM samples (eta = 0). Positions are deterministic for a given
model and window and do not depend on the other rows of the batch (every window uses the
same antithetic noises, seeded by ``sampler_seed``); an untrained model's positions are 0.

Stays f32 under ``bf16``: the noise schedule (buffers in ``keep_f32``, from float64), the
timestep and its sinusoidal embedding (``denoiser.time.freqs``), ``q_sample``, the Gaussian
term of the denoiser, the loss, every DDIM update (the sampler state is carried in f32)
and the position mapping; the encoder, time MLP, residual network and mean head run in the
policy's dtype. Equations and the reasons: docs/models.md#diffusion

Run ``.venv/bin/python -m pytest tests/models/test_diffusion.py -q`` to check this file.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from models.base import Batch, DataShape, ForecastSignal, check_choices, fold_assets, unfold_assets
from models.diffusion import SCHEDULES, DiffusionConfig
from models.ops import GRU, f32, like

__all__ = [
    "COSINE_OFFSET",
    "HORIZON",
    "MAX_BETA",
    "STD_EPS",
    "ConditionalDiffusion",
    "Denoiser",
    "DenoiserBlock",
    "HistoryEncoder",
    "NoiseSchedule",
    "SinusoidalTimeEmbedding",
    "antithetic_noise",
    "build",
    "ddim_sample",
    "ddim_timesteps",
    "make_betas",
    "samples_to_positions",
]


HORIZON = 1  # H: Batch.y is the next bar only (see the module docstring for H > 1)
COSINE_OFFSET = 0.008  # s in Nichol & Dhariwal's eq. 17: keeps beta_0 from being ~0
MAX_BETA = 0.999  # their clip: the last cosine beta is 1 otherwise (abar_{T-1} = 0)
STD_EPS = 1e-6  # added to the sample std: identical samples give a saturated, finite position


# --------------------------------------------------------------------------------------
# Noise schedule (f32 buffers computed in float64)


def make_betas(schedule: str, diffusion_steps: int) -> list[float]:
    """beta_0..beta_{T-1} in double precision (Python floats).

    cosine: abar_t = f(t + 1) / f(0), f(u) = cos((u/T + s) / (1 + s) * pi/2)^2, i.e.
    beta_t = 1 - f(t + 1) / f(t) (Nichol & Dhariwal 2021, eq. 17; f(T) = 0, so the last
    beta is the clip). linear: evenly spaced from 1e-4 to 0.02 at T = 1000, both scaled by
    1000 / T (as improved-diffusion does), so abar_{T-1} is ~4e-5 for every T. Both are
    clipped at 0.999, which the linear schedule reaches only for T < 21.
    """
    check_choices("schedule", schedule, SCHEDULES)
    if diffusion_steps < 2:
        raise ValueError(f"diffusion_steps must be >= 2, got {diffusion_steps}")
    if schedule == "linear":
        scale = 1000.0 / diffusion_steps
        low, high = 1e-4 * scale, 0.02 * scale
        return [
            min(low + (high - low) * i / (diffusion_steps - 1), MAX_BETA)
            for i in range(diffusion_steps)
        ]

    def f(i: int) -> float:
        return (
            math.cos((i / diffusion_steps + COSINE_OFFSET) / (1 + COSINE_OFFSET) * math.pi / 2) ** 2
        )

    return [min(1.0 - f(i + 1) / f(i), MAX_BETA) for i in range(diffusion_steps)]


class NoiseSchedule(nn.Module):
    """The forward process q(x_t | x0) of one schedule, as f32 buffers indexed by t.

    Derived from the config, so the buffers are not saved in checkpoints; they are named
    in ``keep_f32`` and never cast (see the module docstring).
    """

    keep_f32 = ("betas", "alphas_cumprod", "sqrt_alphas_cumprod", "sqrt_one_minus_alphas_cumprod")
    betas: torch.Tensor  # (T,)
    alphas_cumprod: torch.Tensor  # (T,) abar_t
    sqrt_alphas_cumprod: torch.Tensor  # (T,)
    sqrt_one_minus_alphas_cumprod: torch.Tensor  # (T,)

    def __init__(self, schedule: str, diffusion_steps: int) -> None:
        super().__init__()
        betas = make_betas(schedule, diffusion_steps)
        abar, prod = [], 1.0
        for beta in betas:  # float64 cumulative product: no f32 error accumulates over T
            prod *= 1.0 - beta
            abar.append(prod)
        tables = {
            "betas": betas,
            "alphas_cumprod": abar,
            "sqrt_alphas_cumprod": [math.sqrt(a) for a in abar],
            # From the betas' double-precision product, not from an f32 abar: 1 - abar at
            # t = 0 is ~1e-4 and would keep only ~3 correct digits if formed in f32.
            "sqrt_one_minus_alphas_cumprod": [math.sqrt(1.0 - a) for a in abar],
        }
        for name, values in tables.items():
            self.register_buffer(name, f32(torch.tensor(values)), persistent=False)

    @property
    def diffusion_steps(self) -> int:
        return int(self.betas.numel())

    def q_sample(self, x0: torch.Tensor, t: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """x_t = sqrt(abar_t) x0 + sqrt(1 - abar_t) noise, in f32.

        x0, noise (..., H); t (...) int64 -> (..., H) f32.
        """
        a = self.sqrt_alphas_cumprod[t].unsqueeze(-1)  # (..., 1)
        s = self.sqrt_one_minus_alphas_cumprod[t].unsqueeze(-1)
        return a * f32(x0) + s * f32(noise)


def ddim_timesteps(diffusion_steps: int, sampling_steps: int) -> torch.Tensor:
    """(K,) int64 timesteps from T-1 (noisiest) down to 0, evenly spaced, no repeats."""
    if not 1 <= sampling_steps <= diffusion_steps:
        raise ValueError(f"sampling_steps must be in [1, {diffusion_steps}], got {sampling_steps}")
    if sampling_steps == 1:
        return torch.tensor([diffusion_steps - 1])
    # Spacing (T-1)/(K-1) >= 1 and rounding half up (not Python's half-to-even): distinct.
    spacing = (diffusion_steps - 1) / (sampling_steps - 1)
    return torch.tensor(
        [math.floor((diffusion_steps - 1) - k * spacing + 0.5) for k in range(sampling_steps)]
    )


def ddim_sample(
    eps_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    schedule: NoiseSchedule,
    timesteps: torch.Tensor,
    x_init: torch.Tensor,
) -> torch.Tensor:
    """Deterministic DDIM (eta = 0) from ``x_init`` at ``timesteps[0]`` down to x0.

    ``eps_fn(x_t, t)`` gets the f32 state and a 0-d int64 timestep and returns the
    predicted noise (any dtype, upcast here). Each step (Song et al. 2021, eq. 12, sigma=0):

        x0_hat = (x_t - sqrt(1 - abar_t) eps) / sqrt(abar_t)
        x_prev = sqrt(abar_prev) x0_hat + sqrt(1 - abar_prev) eps

    with abar_prev = 1 after the last timestep, so the result is the last x0_hat. All of
    it in f32 (the division by sqrt(abar_t) ~ 5e-4 at the noisiest step amplifies error).
    """
    x = f32(x_init)
    steps = timesteps.tolist()
    for k, t in enumerate(steps):
        a, s = schedule.sqrt_alphas_cumprod[t], schedule.sqrt_one_minus_alphas_cumprod[t]
        eps = f32(eps_fn(x, timesteps[k]))
        x0_hat = (x - s * eps) / a
        if k + 1 == len(steps):
            return x0_hat
        t_prev = steps[k + 1]
        x = (
            schedule.sqrt_alphas_cumprod[t_prev] * x0_hat
            + schedule.sqrt_one_minus_alphas_cumprod[t_prev] * eps
        )
    return x  # no timesteps: the input unchanged


def antithetic_noise(
    n_samples: int, horizon: int, seed: int, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """(S, H) f32 standard normal draws in antithetic pairs (z, -z): mean exactly zero.

    Drawn from a generator seeded with ``seed`` on every call (reproducible positions).
    """
    if n_samples < 2 or n_samples % 2:
        raise ValueError(f"n_samples must be an even integer >= 2, got {n_samples}")
    generator = torch.Generator(device=device).manual_seed(seed)
    z = f32(torch.randn(n_samples // 2, horizon, generator=generator, device=device))
    return torch.cat([z, -z])


def samples_to_positions(samples: torch.Tensor, scale: float) -> torch.Tensor:
    """(..., S, H) sampled paths -> (...) f32 positions in [-1, 1].

    Mean over samples of the next return in units of its std across samples, squashed.
    """
    nxt = f32(samples[..., 0])  # (..., S)
    half = nxt.shape[-1] // 2
    # Pairwise sums first: the two halves are antithetic partners, and a sampler that is
    # odd in its initial noise (an untrained model) then has a mean of exactly 0, not a
    # rounding residue whose sign would trade as a constant long/short position.
    mean = (nxt[..., :half] + nxt[..., half:]).mean(dim=-1) / 2
    std = nxt.std(dim=-1)
    return torch.tanh(scale * mean / (std + STD_EPS))


# --------------------------------------------------------------------------------------
# Networks


class SinusoidalTimeEmbedding(nn.Module):
    """t -> [sin(t w_k), cos(t w_k)], w_k = 10000^(-k / (d/2)) (Vaswani et al.; DDPM),
    computed in f32 from the integer t, then a 2-layer MLP in the network dtype."""

    keep_f32 = ("freqs",)
    freqs: torch.Tensor  # (d/2,)

    def __init__(self, dim: int) -> None:
        super().__init__()
        half = dim // 2
        freqs = torch.exp(-math.log(10_000.0) * torch.arange(half) / half)
        self.register_buffer("freqs", f32(freqs), persistent=False)
        self.mlp = nn.Sequential(nn.Linear(dim, dim), nn.SiLU(), nn.Linear(dim, dim))

    def forward(self, t: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
        """t (...) int64 -> (..., d) in ``ref``'s dtype."""
        angles = f32(t).unsqueeze(-1) * self.freqs  # (..., d/2)
        emb = torch.cat([angles.sin(), angles.cos()], dim=-1)
        return self.mlp(like(emb, ref))


class HistoryEncoder(nn.Module):
    """(N, L, F) window -> (N, d) condition c."""

    def __init__(self, kind: str, n_features: int, lookback: int, hidden: int) -> None:
        super().__init__()
        self.kind = kind
        self.lookback = lookback
        if kind == "gru":
            self.gru = GRU(n_features, hidden, batch_first=True)
        else:
            self.mlp = nn.Sequential(
                nn.Flatten(),
                nn.Linear(lookback * n_features, hidden),
                nn.SiLU(),
                nn.Linear(hidden, hidden),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "gru":
            _, h = self.gru(x)  # h (1, N, d): the state after the decision bar
            return h[0]
        if x.shape[1] != self.lookback:
            raise ValueError(
                f"the mlp encoder was built for L={self.lookback} bars, got {x.shape[1]}"
            )
        return self.mlp(x)


class DenoiserBlock(nn.Module):
    """h + W2 SiLU(W1 h + U ctx): a residual MLP block shifted by the (t, c) context."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(hidden, hidden)
        self.ctx = nn.Linear(hidden, hidden, bias=False)
        self.fc2 = nn.Linear(hidden, hidden)

    def forward(self, h: torch.Tensor, ctx: torch.Tensor) -> torch.Tensor:
        return h + self.fc2(F.silu(self.fc1(h) + self.ctx(ctx)))


class Denoiser(nn.Module):
    """F(x_t, t, c): (..., H) noisy path -> (..., H) residual of the predicted noise
    beyond its Gaussian term (see :meth:`ConditionalDiffusion.epsilon`).

    ``t`` and ``c`` broadcast against x_t's leading dimensions, so the sampler passes one
    0-d timestep and the condition (N, 1, d) for (N, S, H) paths.
    """

    def __init__(self, horizon: int, hidden: int, layers: int) -> None:
        super().__init__()
        self.time = SinusoidalTimeEmbedding(hidden)
        self.inp = nn.Linear(horizon, hidden)
        self.cond = nn.Linear(hidden, hidden)
        self.blocks = nn.ModuleList(DenoiserBlock(hidden) for _ in range(layers))
        self.out = nn.Linear(hidden, horizon)
        # Zero output (as ADM's zero_module): F = 0 at init, so eps_theta starts as the
        # exact noise posterior mean of the Gaussian prior (module docstring).
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)

    def forward(self, x_t: torch.Tensor, t: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        ctx = F.silu(self.time(t, c) + self.cond(c))  # (..., d)
        h = self.inp(like(x_t, c))  # (..., d)
        for block in self.blocks:
            h = block(h, ctx)
        return self.out(F.silu(h))


# --------------------------------------------------------------------------------------
# The model


class ConditionalDiffusion(nn.Module):
    """DDPM over the next-return path, conditioned on each asset's window (assets folded)."""

    sampling_timesteps: torch.Tensor  # (K,) int64

    def __init__(self, config: DiffusionConfig, shape: DataShape) -> None:
        super().__init__()
        self.config = config
        self.n_assets = shape.n_assets
        self.n_features = shape.n_features
        self.horizon = HORIZON
        self.schedule = NoiseSchedule(config.schedule, config.diffusion_steps)
        self.encoder = HistoryEncoder(
            config.encoder, shape.n_features, shape.lookback, config.hidden
        )
        self.denoiser = Denoiser(self.horizon, config.hidden, config.denoiser_layers)
        # mu(c): zero at init, so an untrained model is the standard normal prior.
        self.prior_mean = nn.Linear(config.hidden, self.horizon)
        nn.init.zeros_(self.prior_mean.weight)
        nn.init.zeros_(self.prior_mean.bias)
        self.register_buffer(
            "sampling_timesteps",
            ddim_timesteps(config.diffusion_steps, config.sampling_steps),
            persistent=False,
        )

    def condition(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, A, L, F) -> c (B*A, d), row b*A + a for asset a of window b."""
        _, a, _, f = x.shape
        if a != self.n_assets or f != self.n_features:
            raise ValueError(
                f"diffusion model was built for A={self.n_assets} assets and "
                f"F={self.n_features} features, got x of shape {tuple(x.shape)}"
            )
        return self.encoder(fold_assets(x))

    def loss(self, batch: Batch) -> torch.Tensor:
        """f32 MSE between the true and the predicted noise at uniform random timesteps,
        over K = ``noise_draws`` (timestep, noise) draws per window."""
        k = self.config.noise_draws
        c = self.condition(batch.x).unsqueeze(1)  # (N, 1, d)
        x0 = f32(batch.y).reshape(-1, 1, self.horizon).expand(-1, k, -1)  # (N, K, H)
        t = torch.randint(
            0, self.schedule.diffusion_steps, x0.shape[:2], device=x0.device
        )  # (N, K)
        noise = torch.randn_like(x0)
        x_t = self.schedule.q_sample(x0, t, noise)  # (N, K, H) f32
        return F.mse_loss(self.epsilon(x_t, t, c, self.prior_mean(c)), noise)

    def epsilon(
        self, x_t: torch.Tensor, t: torch.Tensor, c: torch.Tensor, mu: torch.Tensor
    ) -> torch.Tensor:
        """f32 predicted noise: the exact noise posterior mean under the prior
        N(mu, I), plus sqrt(abar_t) times the network's residual F(x_t, t, c).

        x_t (..., H) f32, t (...) int64, c (..., d), mu (..., H) = prior_mean(c),
        broadcasting -> (..., H) f32.
        """
        sqrt_ab = self.schedule.sqrt_alphas_cumprod[t].unsqueeze(-1)  # (..., 1)
        sqrt_1m_ab = self.schedule.sqrt_one_minus_alphas_cumprod[t].unsqueeze(-1)
        prior_eps = sqrt_1m_ab * (f32(x_t) - sqrt_ab * f32(mu))
        return prior_eps + sqrt_ab * f32(self.denoiser(x_t, t, c))

    @torch.no_grad()
    def sample(
        self, x: torch.Tensor, n_samples: int | None = None, sampling_steps: int | None = None
    ) -> torch.Tensor:
        """(B, A, S, H) f32 DDIM sample paths for each window (deterministic)."""
        cfg = self.config
        s = n_samples or cfg.n_samples
        timesteps = (
            self.sampling_timesteps
            if sampling_steps is None
            else ddim_timesteps(cfg.diffusion_steps, sampling_steps).to(x.device)
        )
        c = self.condition(x).unsqueeze(1)  # (N, 1, d)
        z = antithetic_noise(s, self.horizon, cfg.sampler_seed, x.device)  # (S, H)
        x_init = z.expand(c.shape[0], s, self.horizon)  # same noises for every window
        mu = self.prior_mean(c)  # (N, 1, H)
        paths = ddim_sample(
            lambda x_t, t: self.epsilon(x_t, t, c, mu), self.schedule, timesteps, x_init
        )
        return unfold_assets(paths, self.n_assets)

    @torch.no_grad()
    def positions(self, batch: Batch) -> torch.Tensor:
        """(B, A) f32 positions tanh(scale * mean / std) of the sampled next return."""
        return samples_to_positions(self.sample(batch.x), self.config.position_scale)

    @torch.no_grad()
    def forecast_signal(self, batch: Batch) -> ForecastSignal:
        """Position, the samples' mean next return and their std: confidence = the mean
        relative to the spread of the samples."""
        samples = self.sample(batch.x)  # (B, A, S, H) f32
        positions = samples_to_positions(samples, self.config.position_scale)
        nxt = f32(samples[..., 0])  # (B, A, S)
        half = nxt.shape[-1] // 2
        mean = (nxt[..., :half] + nxt[..., half:]).mean(dim=-1) / 2  # as the position's
        return ForecastSignal(positions, mean, nxt.std(dim=-1))


def build(config: DiffusionConfig, shape: DataShape) -> ConditionalDiffusion:
    return ConditionalDiffusion(config, shape)
