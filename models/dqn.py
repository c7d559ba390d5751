"""DQN family: a Rainbow-style value learner for the trading environment: the settings,
search space and record (no torch: the spec and a sweep's driver read them). Its network:
:mod:`models.nets.dqn`."""

from __future__ import annotations

from dataclasses import dataclass

from models.family import Choice, Family, Float, Int, Network, SearchSpace, check_int

__all__ = [
    "ENCODERS",
    "FAMILY",
    "SEARCH_SPACE",
    "DQNConfig",
]

# --------------------------------------------------------------------------------------
# Config


ENCODERS = ("factorized", "flat")


@dataclass(frozen=True)
class DQNConfig:
    """DQN algorithm and network settings. The trainer owns lr, weight decay, grad clipping."""

    hidden: int = 64
    """Width of the window encoder and of every torso layer."""
    encoder: str = "factorized"
    """Window encoder: ``factorized`` (a per-bar linear map shared across the L bars, then a
    learned per-channel weighting of the bars, starting at the decision bar) or ``flat``
    (one linear layer over the flattened L x F window). See :class:`WindowEncoder`."""
    n_layers: int = 1
    """Hidden layers of the torso over [encoded window, position] (>= 1)."""
    gamma: float = 0.5
    """Discount per bar. Low on purpose: in this environment an action moves the future only
    through the next trade's cost (the position is part of the state; returns do not depend
    on it), so the value of a position is mostly its next-bar reward, and a long horizon
    only adds the noise of many future returns to every target. Trading DQNs use 0.3
    (Zhang, Zohren & Roberts 2020, "Deep RL for Trading") and 0.4 (Théate & Ernst 2021,
    "An application of deep RL to algorithmic trading"); 0.99 is the Atari value."""
    n_step: int = 1
    """Steps in the n-step return (1 = one-step Q-learning). One step by default: the reward
    of an action arrives on the next bar, and the later rewards of an uncorrected n-step
    return belong to later (exploratory) actions, so they add variance, not signal."""
    buffer_capacity: int = 50_000
    """Replay capacity in transitions (stored on the device in the data dtype)."""
    replay_batch_size: int = 64
    """Transitions per gradient step, sampled from the replay (>= 2)."""
    learning_starts: int = 1_000
    """Transitions stored before the first gradient step."""
    train_every: int = 4
    """Vectorized environment steps per ``collect`` call (each adds num_envs transitions)."""
    gradient_steps: int = 1
    """Gradient steps per ``collect`` call once learning has started."""
    target_update_period: int = 100
    """Gradient steps between target-network updates. With gamma 0.5 the bootstrap term is
    a small part of each target, so a short period costs little stability and lets short
    trials (a few hundred gradient steps, as under ASHA) bootstrap from a trained net."""
    tau: float = 1.0
    """Target update rate: 1.0 copies the online net (hard update), < 1 is Polyak averaging.
    Under bf16 prefer 1.0: a soft step smaller than bf16's rounding is lost."""
    eps_start: float = 1.0
    """Exploration rate at the start of training."""
    eps_end: float = 0.05
    """Exploration rate after the decay."""
    eps_decay: float = 0.3
    """Share of training (progress in [0, 1]) over which epsilon decays linearly."""
    per_alpha: float = 0.5
    """Priority exponent; 0 is uniform replay (Rainbow uses 0.5)."""
    per_beta0: float = 0.4
    """Initial importance-sampling exponent, annealed linearly to 1 over training."""
    per_eps: float = 1e-6
    """Added to |TD error| so no transition's priority is zero."""
    distributional: bool = False
    """C51 categorical value distribution instead of a scalar Q value."""
    n_atoms: int = 51
    """Atoms of the C51 support (distributional only)."""
    v_min: float = -10.0
    """Lowest atom of the C51 support, in reward units (rewards are scaled returns)."""
    v_max: float = 10.0
    """Highest atom of the C51 support."""
    num_envs: int = 16
    """Environments stepped in parallel by ``collect``."""
    episode_len: int = 128
    """Bars per training episode."""

    def __post_init__(self) -> None:
        positive = (
            "hidden",
            "n_layers",
            "n_step",
            "buffer_capacity",
            "learning_starts",
            "train_every",
            "gradient_steps",
            "target_update_period",
            "num_envs",
            "episode_len",
            "replay_batch_size",
            "n_atoms",
        )
        for name in positive:
            check_int(f"dqn.{name}", getattr(self, name))
        if self.encoder not in ENCODERS:
            raise ValueError(f"dqn.encoder must be one of {list(ENCODERS)}, got {self.encoder!r}")
        if self.replay_batch_size < 2:
            # One draw takes torch.multinomial's validating path, which syncs with the host.
            raise ValueError(f"dqn.replay_batch_size must be >= 2, got {self.replay_batch_size}")
        if self.buffer_capacity < max(self.num_envs, self.replay_batch_size):
            raise ValueError(
                f"dqn.buffer_capacity ({self.buffer_capacity}) must hold at least num_envs "
                f"({self.num_envs}) and replay_batch_size ({self.replay_batch_size}) transitions"
            )
        if not 0.0 < self.gamma < 1.0:
            raise ValueError(f"dqn.gamma must be in (0, 1), got {self.gamma}")
        if not 0.0 < self.tau <= 1.0:
            raise ValueError(f"dqn.tau must be in (0, 1], got {self.tau}")
        for name in ("eps_start", "eps_end", "per_beta0"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"dqn.{name} must be in [0, 1], got {getattr(self, name)}")
        if not 0.0 < self.eps_decay <= 1.0:
            raise ValueError(f"dqn.eps_decay must be in (0, 1], got {self.eps_decay}")
        if self.per_alpha < 0.0:
            raise ValueError(f"dqn.per_alpha must be >= 0, got {self.per_alpha}")
        if self.per_eps <= 0.0:
            raise ValueError(f"dqn.per_eps must be > 0, got {self.per_eps}")
        if self.n_atoms < 2:
            raise ValueError(f"dqn.n_atoms must be >= 2, got {self.n_atoms}")
        if not self.v_min < self.v_max:
            raise ValueError(f"dqn.v_min ({self.v_min}) must be below dqn.v_max ({self.v_max})")


# Ranges from the literature: gamma from the trading DQNs' 0.3-0.4 (Zhang et al. 2020,
# Théate & Ernst 2021) to Rainbow's 0.99; n_step 1 to a little above Rainbow's 3; target
# period from 50 updates (short trials) over cleanrl's 500-1000 to Nature DQN's 10k frames
# (2.5k updates); PER alpha 0 (uniform) to Schaul's proportional 0.6-0.7, beta0 around
# Schaul's 0.4-0.5; exploration decay over 10-50% of training; both window encoders.
SEARCH_SPACE: SearchSpace = {
    "hidden": Choice((32, 64, 128, 256)),
    "n_layers": Int(1, 3),
    "encoder": Choice(ENCODERS),
    "gamma": Float(0.3, 0.99),
    "n_step": Int(1, 5),
    "target_update_period": Int(50, 5_000, log=True),
    "eps_end": Float(0.01, 0.1, log=True),
    "eps_decay": Float(0.1, 0.5),
    "per_alpha": Float(0.0, 0.8),
    "per_beta0": Float(0.3, 0.7),
    "distributional": Choice((False, True)),
}


FAMILY = Family(
    name="dqn",
    confidence="the margin of the best over the second-best action value relative to the spread of all: (Q_1 - Q_2) / (Q_1 - Q_min)",
    kind="rl",
    config_cls=DQNConfig,
    build=Network("models.nets.dqn:build"),
    search_space=SEARCH_SPACE,
    paper=(
        "Mnih et al. 2015 (DQN); van Hasselt et al. 2016 (double DQN); Wang et al. 2016 "
        "(dueling); Schaul et al. 2016 (prioritized replay); Sutton 1988 / Hessel et al. 2018 "
        "(n-step returns, Rainbow); Bellemare et al. 2017 (C51)"
    ),
    tiny={"hidden": 32, "learning_starts": 64, "num_envs": 8, "buffer_capacity": 2048},
    shape_settings=frozenset({"hidden", "encoder", "n_layers", "distributional", "n_atoms"}),
    keeps_f32=(
        "C51 atom support, categorical projection and (log-)softmax over atoms; TD targets, "
        "n-step returns, discounts and replay priorities (reward sums and priority ratios "
        "lose too much in bf16)"
    ),
    summary=(
        "Double DQN with a dueling head, n-step returns and prioritized replay on the device; "
        "optional C51 distributional head; a factorized (bar x lag) window encoder. Actions "
        "are evenly spaced positions in [-1, 1]."
    ),
)
