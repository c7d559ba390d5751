"""PPO family: an on-policy actor-critic for the trading environment: the settings, search
space and record (no torch: the spec and a sweep's driver read them). Its network:
:mod:`models.nets.ppo`."""

from __future__ import annotations

from dataclasses import dataclass

from models.family import Choice, Family, Float, Int, Network, SearchSpace, check_int

__all__ = [
    "FAMILY",
    "SEARCH_SPACE",
    "PPOConfig",
]


# --------------------------------------------------------------------------------------
# Config


@dataclass(frozen=True)
class PPOConfig:
    """PPO algorithm and network settings. The trainer owns lr, weight decay, grad clipping."""

    hidden: int = 64
    """Width of the window encoder, of every torso layer and of the LSTM state."""
    n_layers: int = 1
    """Hidden layers of the torso over [encoded window, position] (>= 1)."""
    recurrent: bool = False
    """An LSTM core between the torso and the heads (state carried per environment)."""
    bptt: int = 8
    """Recurrent only: steps per training sequence (truncated BPTT); divides ``n_steps``."""
    gamma: float = 0.9
    """Discount per bar. An action moves later rewards only through the position it leaves
    (trading costs), so horizons shorter than the games' 0.99 learn faster here (measured
    on the synthetic data at the other defaults: val Sharpe ~2.5-3 at 0.9, ~1.5 at 0.99)."""
    gae_lambda: float = 0.95
    """GAE lambda: 0 is the one-step TD advantage, 1 the Monte-Carlo return minus V."""
    clip_coef: float = 0.2
    """Clip range eps of the probability ratio in the surrogate objective."""
    value_clip: float = 0.2
    """Clip range of the value update around the rollout's values, in reward units
    (PPO2's value clipping); 0 turns it off (plain squared error)."""
    vf_coef: float = 0.5
    """Weight of the value loss in the shared actor-critic loss."""
    ent_coef: float = 0.01
    """Weight of the entropy bonus."""
    norm_adv: bool = True
    """Normalize advantages to zero mean, unit std within each minibatch."""
    n_steps: int = 16
    """Vectorized environment steps per rollout (each ``collect``): num_envs * n_steps
    transitions per PPO update."""
    minibatches: int = 4
    """Minibatches each rollout is split into per PPO epoch (whole sequences if recurrent)."""
    ppo_epochs: int = 4
    """Passes over each rollout; ``losses()`` yields ppo_epochs * minibatches losses."""
    num_envs: int = 32
    """Environments stepped in parallel by ``collect``."""
    episode_len: int = 128
    """Bars per training episode (a time limit: the value bootstraps across it)."""

    def __post_init__(self) -> None:
        positive = (
            "hidden",
            "n_layers",
            "bptt",
            "n_steps",
            "minibatches",
            "ppo_epochs",
            "num_envs",
            "episode_len",
        )
        for name in positive:
            check_int(f"ppo.{name}", getattr(self, name))
        if not 0.0 < self.gamma < 1.0:
            raise ValueError(f"ppo.gamma must be in (0, 1), got {self.gamma}")
        if not 0.0 <= self.gae_lambda <= 1.0:
            raise ValueError(f"ppo.gae_lambda must be in [0, 1], got {self.gae_lambda}")
        if not 0.0 < self.clip_coef < 1.0:
            raise ValueError(f"ppo.clip_coef must be in (0, 1), got {self.clip_coef}")
        for name in ("value_clip", "vf_coef", "ent_coef"):
            if not getattr(self, name) >= 0.0:
                raise ValueError(f"ppo.{name} must be >= 0, got {getattr(self, name)}")
        if self.recurrent:
            if self.n_steps % self.bptt:
                raise ValueError(
                    f"ppo.bptt ({self.bptt}) must divide ppo.n_steps ({self.n_steps}) "
                    "when recurrent"
                )
            sequences = self.num_envs * (self.n_steps // self.bptt)
            if self.minibatches > sequences:
                raise ValueError(
                    f"ppo.minibatches ({self.minibatches}) exceeds the {sequences} sequences "
                    f"of a rollout (num_envs * n_steps / bptt)"
                )
        # Advantage normalization takes a std: every minibatch needs two samples.
        if self.num_envs * self.n_steps < 2 * self.minibatches:
            raise ValueError(
                f"ppo.minibatches ({self.minibatches}) leaves fewer than 2 transitions per "
                f"minibatch of a {self.num_envs} x {self.n_steps} rollout"
            )


# Ranges from the literature: clip 0.1-0.3 and lambda 0.9-0.99 (Schulman et al. 2017 and
# 2016; Andrychowicz et al. 2021, "What Matters in On-Policy RL"), entropy 1e-4-1e-1 (log;
# 0.01 for Atari), 1-10 epochs over 1-16 minibatches (cleanrl/baselines: 4 x 4 Atari, 10 x
# 32 MuJoCo), rollouts of 8-128 steps per environment (multiples of the default bptt).
# gamma reaches down to 0.5: per-bar P&L rewards need short horizons (see PPOConfig.gamma).
SEARCH_SPACE: SearchSpace = {
    "hidden": Choice((32, 64, 128, 256)),
    "n_layers": Int(1, 3),
    "recurrent": Choice((False, True)),
    "gamma": Float(0.5, 0.999),
    "gae_lambda": Float(0.9, 0.99),
    "clip_coef": Float(0.1, 0.3),
    "vf_coef": Float(0.25, 1.0),
    "ent_coef": Float(1e-4, 1e-1, log=True),
    "n_steps": Choice((8, 16, 32, 64, 128)),
    "minibatches": Choice((1, 2, 4, 8, 16)),
    "ppo_epochs": Int(1, 10),
}


FAMILY = Family(
    name="ppo",
    confidence="the policy's probability of the chosen (greedy) action",
    kind="rl",
    config_cls=PPOConfig,
    build=Network("models.nets.ppo:build"),
    search_space=SEARCH_SPACE,
    paper=(
        "Schulman et al. 2017 (PPO); Schulman et al. 2016 (GAE); Huang et al. 2022 (PPO "
        "implementation details: value clipping, advantage normalization); Pardo et al. 2018 "
        "(time limits); Hochreiter & Schmidhuber 1997 (LSTM)"
    ),
    tiny={"hidden": 32, "num_envs": 8, "n_steps": 8, "minibatches": 2, "ppo_epochs": 1},
    shape_settings=frozenset({"hidden", "n_layers", "recurrent"}),
    keeps_f32=(
        "log-softmax over actions, log-probabilities, probability ratios and the clipped "
        "surrogate, entropy; stored values, GAE advantages and lambda-returns, advantage "
        "normalization and the value loss (ratios of bf16 log-probs would be off by ~1%, "
        "as large as the clip range's effect)"
    ),
    summary=(
        "PPO-clip actor-critic with GAE(lambda), value clipping and an entropy bonus over a "
        "categorical policy of positions; optional LSTM core trained on truncated sequences "
        "from stored states."
    ),
)
