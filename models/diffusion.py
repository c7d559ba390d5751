"""Conditional denoising diffusion over the next standardized return path: the settings,
search space and record (no torch: the spec and a sweep's driver read them). Its network:
:mod:`models.nets.diffusion`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from models.family import (
    Choice,
    Family,
    Float,
    Int,
    Network,
    SearchSpace,
    check_choices,
    check_int,
    check_positive,
    is_integer,
)

__all__ = [
    "ENCODERS",
    "FAMILY",
    "SCHEDULES",
    "SEARCH_SPACE",
    "DiffusionConfig",
]

SCHEDULES = ("cosine", "linear")
ENCODERS = ("gru", "mlp")


@dataclass(frozen=True)
class DiffusionConfig:
    """Size, noise process, sampler and output mapping of one conditional diffusion model.

    Defaults: 13,602 parameters at F=8 (any L and A with the GRU encoder).
    """

    hidden: int = 32
    """Width of the history encoder's state (the condition c), the time embedding and the
    denoiser's residual blocks."""

    encoder: Literal["gru", "mlp"] = "gru"
    """History encoder: "gru" (last state of a GRU over the L bars; any window length) or
    "mlp" (two layers over the flattened (L, F) window; needs L = the data's lookback)."""

    denoiser_layers: int = 2
    """Residual blocks of the denoiser MLP."""

    diffusion_steps: int = 100
    """T, diffusion steps of the forward process used in training (DDPM: 1000; TimeGrad:
    100; CSDI: 50). Sampling cost does not depend on it (see ``sampling_steps``)."""

    schedule: Literal["cosine", "linear"] = "cosine"
    """Noise schedule: "cosine" (Nichol & Dhariwal 2021, betas clipped at 0.999) or
    "linear" (Ho et al. 2020, beta from 1e-4 to 0.02 at T = 1000, both scaled by 1000/T
    so that any T ends at the same near-pure noise)."""

    noise_draws: int = 16
    """K, (timestep, noise) pairs drawn per window in each training step; the encoder runs
    once per window and the loss averages over the K draws (less gradient noise)."""

    sampling_steps: int = 10
    """DDIM steps at inference (evenly spaced over the T training steps, the noisiest and
    the cleanest included); at most ``diffusion_steps``."""

    n_samples: int = 16
    """S, sample paths drawn per window for the position; even (antithetic pairs)."""

    position_scale: float = 4.0
    """Position = tanh(position_scale * mean / std) of the sampled next return: the
    forecast in units of the predicted spread, squashed into [-1, 1]."""

    sampler_seed: int = 0
    """Seed of the generator the S initial noises are drawn from, re-seeded on every call
    so validation positions are reproducible."""

    def __post_init__(self) -> None:
        for name, low in (
            ("hidden", 2),
            ("denoiser_layers", 1),
            ("diffusion_steps", 2),
            ("noise_draws", 1),
        ):
            check_int(name, getattr(self, name), low=low)
        if self.hidden % 2:
            raise ValueError(
                f"hidden must be even (sin/cos halves of the time embedding), got {self.hidden}"
            )
        check_choices("encoder", self.encoder, ENCODERS)
        check_choices("schedule", self.schedule, SCHEDULES)
        check_int(
            "sampling_steps",
            self.sampling_steps,
            high=self.diffusion_steps,
            why="at most diffusion_steps",
        )
        if not is_integer(self.n_samples) or self.n_samples < 2 or self.n_samples % 2:
            raise ValueError(
                f"n_samples must be an even integer >= 2 (antithetic pairs), got {self.n_samples!r}"
            )
        check_positive("position_scale", self.position_scale)
        if not is_integer(self.sampler_seed):
            raise ValueError(f"sampler_seed must be an integer, got {self.sampler_seed!r}")


# Ranges from the literature: T = 1000 in DDPM and improved DDPM, 100 in TimeGrad, 50 in
# CSDI (and 50-200 in most time-series diffusion follow-ups); linear (DDPM, TimeGrad) or
# cosine (improved DDPM) schedules; denoiser widths 32-128 with 2-4 residual blocks
# (TimeGrad's 8 blocks are for multivariate targets); DDIM reaches full-T sample quality
# in 10-50 steps (Song et al. 2021, Table 1). S is a cost/precision trade-off for the
# mean/std estimate; position_scale as for the TFT. noise_draws is a compute knob (more
# draws, less gradient noise), left at its default. lr, batch size and weight decay
# belong to the trainer's space.
SEARCH_SPACE: SearchSpace = {
    "diffusion_steps": Int(50, 1000, log=True),
    "schedule": Choice(SCHEDULES),
    "hidden": Choice((16, 32, 64, 128)),
    "encoder": Choice(ENCODERS),
    "denoiser_layers": Int(1, 4),
    "sampling_steps": Int(5, 50, log=True),
    "n_samples": Choice((8, 16, 32, 64)),
    "position_scale": Float(0.5, 32.0, log=True),
}


FAMILY = Family(
    name="diffusion",
    confidence="the samples' mean next return relative to their std: erf(|mean| / (sqrt(2) std))",
    kind="forecast",
    config_cls=DiffusionConfig,
    build=Network("models.nets.diffusion:build"),
    search_space=SEARCH_SPACE,
    paper=(
        "Ho, Jain & Abbeel (2020), Denoising Diffusion Probabilistic Models, NeurIPS; "
        "conditioning as in TimeGrad (Rasul et al. 2021, ICML) and CSDI (Tashiro et al. "
        "2021, NeurIPS); DDIM sampling (Song, Meng & Ermon 2021, ICLR)"
    ),
    tiny={"hidden": 16, "n_samples": 8, "sampling_steps": 5},
    # Read by positions and sampling only; the schedule is buffers, stacked per slot.
    per_trial_settings=frozenset({"position_scale", "n_samples", "schedule"}),
    shape_settings=frozenset(
        {"hidden", "encoder", "denoiser_layers", "diffusion_steps", "sampling_steps"}
    ),
    keeps_f32=(
        "the noise schedule (betas, alphas_cumprod and their square roots, from float64), "
        "timesteps and their sinusoidal embedding, q_sample, the Gaussian term of the noise "
        "prediction, the noise MSE and every DDIM update (alpha_bar near 1 rounds to 1 in "
        "bf16; x0_hat divides by sqrt(alpha_bar) ~ 5e-4), and the mean/std position mapping"
    ),
    summary=(
        "GRU/MLP history encoder -> condition; epsilon prediction = Gaussian-prior term "
        "with a learned conditional mean + residual MLP (sinusoidal timestep embedding) "
        "over the next-return path; DDIM (eta=0) samples from fixed antithetic noises; "
        "position = tanh(scale * mean / std)"
    ),
)
