"""DQN family: a Rainbow-style value learner for the trading environment.

Papers, and the piece each contributes:

* Mnih et al. 2015, "Human-level control through deep reinforcement learning": Q-learning
  with a replay buffer and a target network, Huber loss.
* van Hasselt, Guez & Silver 2016, "Deep Reinforcement Learning with Double Q-learning":
  the online network picks the next action, the target network values it.
* Wang et al. 2016, "Dueling Network Architectures for Deep RL": Q = V + A - mean_a A.
* Schaul et al. 2016, "Prioritized Experience Replay": proportional priorities, annealed
  importance-sampling weights (``models.replay.PrioritizedReplay``).
* Sutton 1988 / Hessel et al. 2018 ("Rainbow"): n-step returns
  (``models.replay.NStepAccumulator``).
* Bellemare, Dabney & Munos 2017, "A Distributional Perspective on RL" (C51), optional:
  a categorical return distribution on a fixed support, trained by cross-entropy against
  the projected target distribution.

Observation: the ``(N, L, F)`` window of one asset (through :class:`WindowEncoder`) and
the current position ``(N,)``. Actions index ``n_actions`` positions evenly spaced over
[-1, 1] (:func:`models.base.action_to_position`), so the greedy action is the position.

Stays f32 under ``bf16``: the C51 atom support (``keep_f32``), the categorical projection,
every (log-)softmax over atoms and the TD targets (rewards and discounts stored f32), so
the loss is f32; the networks run in the parameter dtype. Why: docs/models.md#dqn
"""

from __future__ import annotations

import copy
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from models.base import DataShape, Obs, TradingEnvLike, greedy_position
from models.dqn import DQNConfig
from models.ops import F32, f32
from models.replay import NStepAccumulator, PrioritizedReplay, ReplaySample

__all__ = [
    "MARGIN_EPS",
    "DQNLearner",
    "QNetwork",
    "WindowEncoder",
    "build",
    "categorical_projection",
]


MARGIN_EPS = 1e-12  # confidence: action values this close count as a tie (confidence 0)


# --------------------------------------------------------------------------------------
# Network


class WindowEncoder(nn.Module):
    """(B, L, F) window -> (B, H) features: ``relu(sum_l lag[h, l] * (W x_l)[h] + b[h])``.

    A rank-factorized version of one linear layer over the flattened window: the feature
    map ``W`` (F -> H) is shared by every bar and each channel h learns its own weighting
    ``lag[h]`` of the L bars, so it has H * (F + L) weights instead of H * L * F (1.5k
    instead of 8k at L=16, F=8, H=64). The lag weights start at the decision bar (1 on the
    last bar, 0 elsewhere): the network starts as a function of the newest bar and learns
    how much older bars matter, the recency prior of exponentially weighted features.

    Why not the flat layer (still available as ``encoder="flat"``): the environment replays
    one fixed price history, so the reward of (window, action) is deterministic and a
    flat layer over ~L*F inputs has the capacity to memorize the realized next return of
    each of the few thousand training windows. On the synthetic data that is exactly what
    it did (training-window Sharpe 10-17, validation ~0), while this encoder tracks the
    planted signal (validation Sharpe ~3, training ~3).
    """

    def __init__(self, lookback: int, n_features: int, hidden: int) -> None:
        super().__init__()
        self.bar = nn.Linear(n_features, hidden, bias=False)
        lag = torch.zeros(hidden, lookback)
        lag[:, -1] = 1.0
        self.lag = nn.Parameter(lag)
        self.bias = nn.Parameter(torch.zeros(hidden))

    def forward(self, window: torch.Tensor) -> torch.Tensor:
        per_bar = self.bar(window)  # (B, L, H)
        return torch.relu(torch.einsum("blh,hl->bh", per_bar, self.lag) + self.bias)


class QNetwork(nn.Module):
    """Window encoder + position -> MLP torso -> dueling head, one output per atom.

    The output is ``(B, A, K)``: K = 1 scalar Q values, or C51 logits over K atoms. The
    dueling streams are combined per atom (as in Rainbow), so the mean over actions of the
    advantage is zero for every atom and ``V`` is identifiable.
    """

    keep_f32: tuple[str, ...] = ()
    support: torch.Tensor  # (K,) f32 atoms, registered only when distributional

    def __init__(self, config: DQNConfig, shape: DataShape) -> None:
        super().__init__()
        self.n_actions = shape.n_actions
        self.n_atoms = config.n_atoms if config.distributional else 1
        h = config.hidden
        self.encoder: nn.Module
        if config.encoder == "factorized":
            self.encoder = WindowEncoder(shape.lookback, shape.n_features, h)
        else:  # flat: every (bar, feature) pair gets its own weight; L*F inputs
            self.encoder = nn.Sequential(
                nn.Flatten(1), nn.Linear(shape.lookback * shape.n_features, h), nn.ReLU()
            )
        torso: list[nn.Module] = []
        width = h + 1  # + the current position, which sets the cost of every action
        for _ in range(config.n_layers):
            torso += [nn.Linear(width, h), nn.ReLU()]
            width = h
        self.torso = nn.Sequential(*torso)
        self.value = nn.Linear(h, self.n_atoms)
        self.advantage = nn.Linear(h, self.n_actions * self.n_atoms)
        if config.distributional:
            # Non-persistent: a function of the config, so checkpoints never carry (or cast) it.
            support = torch.linspace(config.v_min, config.v_max, config.n_atoms, dtype=F32)
            self.register_buffer("support", support, persistent=False)
            self.keep_f32 = ("support",)

    def streams(self, obs: Obs) -> tuple[torch.Tensor, torch.Tensor]:
        """Value (B, 1, K) and mean-centred advantage (B, A, K)."""
        window, position = obs  # (B, L, F), (B,)
        z = torch.cat([self.encoder(window), position.unsqueeze(-1)], dim=-1)  # (B, H+1)
        z = self.torso(z)  # (B, H)
        value = self.value(z).unsqueeze(1)  # (B, 1, K)
        adv = self.advantage(z).view(-1, self.n_actions, self.n_atoms)  # (B, A, K)
        return value, adv - adv.mean(dim=1, keepdim=True)

    def forward(self, obs: Obs) -> torch.Tensor:
        value, adv = self.streams(obs)
        return value + adv  # (B, A, K)


def categorical_projection(
    probs: torch.Tensor,  # (B, K) f32 next-state distribution on the support
    reward: torch.Tensor,  # (B,) f32 n-step return
    bootstrap: torch.Tensor,  # (B,) f32 gamma^k, 0 where the episode ended
    support: torch.Tensor,  # (K,) f32 evenly spaced atoms
) -> torch.Tensor:
    """Project the distribution of R + bootstrap * Z onto ``support`` (C51, Algorithm 1).

    Each shifted atom Tz_j (clamped to [v_min, v_max]) gives its mass to the two nearest
    atoms in proportion to closeness: atom i receives p_j * max(0, 1 - |Tz_j - z_i| / dz).
    Written as this "hat" kernel over all (j, i) pairs (B x K x K, ~2.6k per row at K=51)
    instead of the usual floor/ceil scatter: no scatter-add (deterministic on CUDA) and no
    special case when Tz_j lands exactly on an atom. All f32.
    """
    probs, reward, bootstrap, support = f32(probs), f32(reward), f32(bootstrap), f32(support)
    n_atoms = support.shape[0]
    v_min, v_max = support[0], support[-1]
    delta_z = (v_max - v_min) / (n_atoms - 1)
    tz = reward[:, None] + bootstrap[:, None] * support[None, :]  # (B, K)
    tz = torch.minimum(torch.maximum(tz, v_min), v_max)
    distance = (tz[:, :, None] - support[None, None, :]).abs() / delta_z  # (B, K_src, K_dst)
    share = (1.0 - distance).clamp(min=0.0)
    return (probs[:, :, None] * share).sum(dim=1)  # (B, K_dst)


# --------------------------------------------------------------------------------------
# Learner


class DQNLearner(nn.Module):
    """The ``RLLearner`` of the DQN family (see :class:`models.base.RLLearner`).

    Owns the online and target networks (both submodules, so checkpoints and the precision
    policy see both; the target's parameters have ``requires_grad=False`` and are not in
    :meth:`trainable_parameters`), the n-step accumulator and the prioritized replay. The
    replay, accumulator and exploration generator are built on the first ``collect`` (or
    ``load_buffer_state``) on the environment's device in its data dtype, once.

    Randomness: a seed is drawn from torch's global generator at construction (the trainer
    seeds it per trial), then exploration and replay sampling use their own device
    generators, saved in :meth:`buffer_state`.
    """

    def __init__(self, config: DQNConfig, shape: DataShape) -> None:
        super().__init__()
        if shape.n_actions < 2:
            raise ValueError(f"dqn needs n_actions >= 2, got {shape.n_actions}")
        self.config = config
        self.shape = shape
        self.n_actions = shape.n_actions
        self.online = QNetwork(config, shape)
        self.target = copy.deepcopy(self.online)
        self.target.requires_grad_(False)
        self.seed = int(torch.randint(0, 2**62, ()).item())
        self.replay: PrioritizedReplay | None = None
        self.nstep: NStepAccumulator | None = None
        self.generator: torch.Generator | None = None
        self.env_steps = 0  # vectorized environment steps taken by collect
        self.grad_steps = 0  # after_step calls (optimizer steps)
        self.progress = 0.0
        self._pending: tuple[torch.Tensor, torch.Tensor] | None = None  # (indices, |TD|)

    # -- storage ---------------------------------------------------------------------------
    def _ensure_storage(self, dtype: torch.dtype, device: torch.device) -> None:
        if self.replay is not None:
            return
        cfg = self.config
        window_shape = (self.shape.lookback, self.shape.n_features)
        self.replay = PrioritizedReplay(
            cfg.buffer_capacity,
            window_shape,
            dtype,
            device,
            alpha=cfg.per_alpha,
            eps=cfg.per_eps,
            seed=self.seed + 1,
        )
        self.nstep = NStepAccumulator(
            cfg.n_step, cfg.gamma, cfg.num_envs, window_shape, dtype, device
        )
        self.generator = torch.Generator(device=device).manual_seed(self.seed)

    # -- value heads -----------------------------------------------------------------------
    def _q(self, out: torch.Tensor) -> torch.Tensor:
        """(B, A) Q values from a network output (B, A, K); C51: E[Z] in f32."""
        if not self.config.distributional:
            return out[..., 0]
        probs = F.softmax(f32(out), dim=-1)
        return (probs * self.online.support).sum(-1)

    def q_values(self, obs: Obs) -> torch.Tensor:
        return self._q(self.online(obs))

    @torch.no_grad()
    def td_target(
        self, reward: torch.Tensor, bootstrap: torch.Tensor, next_obs: Obs
    ) -> torch.Tensor:
        """(B,) f32 double-DQN target R + bootstrap * Q_target(s', argmax_a Q_online(s', a))."""
        best = self.q_values(next_obs).argmax(-1, keepdim=True)  # (B, 1)
        q_next = self._q(self.target(next_obs)).gather(1, best).squeeze(1)
        return f32(reward) + f32(bootstrap) * f32(q_next)

    @torch.no_grad()
    def distribution_target(
        self, reward: torch.Tensor, bootstrap: torch.Tensor, next_obs: Obs
    ) -> torch.Tensor:
        """(B, K) f32 projected C51 target, with the double-DQN choice of next action."""
        best = self.q_values(next_obs).argmax(-1)  # (B,)
        logits = self.target(next_obs)  # (B, A, K)
        chosen = logits.gather(1, best[:, None, None].expand(-1, 1, logits.shape[-1])).squeeze(1)
        probs = F.softmax(f32(chosen), dim=-1)
        return categorical_projection(probs, reward, bootstrap, self.target.support)

    def loss(self, batch: ReplaySample) -> tuple[torch.Tensor, torch.Tensor]:
        """IS-weighted loss (f32 scalar) and each item's new priority signal (B,), detached."""
        out = self.online(batch.obs)  # (B, A, K)
        if self.config.distributional:
            index = batch.action[:, None, None].expand(-1, 1, out.shape[-1])
            log_p = F.log_softmax(f32(out.gather(1, index).squeeze(1)), dim=-1)  # (B, K)
            target = self.distribution_target(batch.reward, batch.bootstrap, batch.next_obs)
            per_item = -(target * log_p).sum(-1)  # cross-entropy, the C51/Rainbow priority
            signal = per_item.detach()
        else:
            q_taken = f32(out[..., 0].gather(1, batch.action[:, None]).squeeze(1))  # (B,)
            target = self.td_target(batch.reward, batch.bootstrap, batch.next_obs)
            per_item = F.huber_loss(q_taken, target, reduction="none", delta=1.0)
            signal = (target - q_taken).abs().detach()
        return (batch.weights * per_item).mean(), signal

    # -- RLLearner -------------------------------------------------------------------------
    def epsilon(self, progress: float) -> float:
        cfg = self.config
        frac = min(1.0, max(0.0, progress) / cfg.eps_decay)
        return cfg.eps_start + frac * (cfg.eps_end - cfg.eps_start)

    @torch.no_grad()
    def collect(self, env: TradingEnvLike, progress: float) -> None:
        """``train_every`` epsilon-greedy vectorized steps into the n-step accumulator and
        the replay. Exploration draws from this learner's device generator."""
        cfg = self.config
        if env.num_envs != cfg.num_envs or env.n_actions != self.n_actions:
            raise ValueError(
                f"environment has num_envs={env.num_envs}, n_actions={env.n_actions}; this dqn "
                f"was built for num_envs={cfg.num_envs}, n_actions={self.n_actions}"
            )
        self.progress = progress
        eps = self.epsilon(progress)
        obs = env.observe()
        window = obs[0]  # (N, L, F)
        self._ensure_storage(window.dtype, window.device)
        assert self.nstep is not None and self.replay is not None
        n, device = window.shape[0], window.device
        for _ in range(cfg.train_every):
            explore = torch.rand(n, generator=self.generator, device=device) < eps
            uniform = torch.randint(
                0, self.n_actions, (n,), generator=self.generator, device=device
            )
            transition = env.step(torch.where(explore, uniform, self.act(obs)))
            ready = self.nstep.push(transition)
            if ready is not None:
                self.replay.add(ready)
            self.env_steps += 1
            # Nothing else steps the env inside one collect: its next_obs is what observe()
            # would return, so reuse it instead of gathering the windows twice.
            obs = transition.next_obs

    def losses(self) -> Iterator[torch.Tensor]:
        """``gradient_steps`` losses once ``learning_starts`` transitions are stored. Each
        batch is sampled after the previous step's ``after_step`` (a generator)."""
        cfg = self.config
        if self.replay is None or self.replay.count < cfg.learning_starts:
            return
        beta = cfg.per_beta0 + (1.0 - cfg.per_beta0) * min(1.0, max(0.0, self.progress))
        for _ in range(cfg.gradient_steps):
            batch = self.replay.sample(cfg.replay_batch_size, beta)
            loss, signal = self.loss(batch)
            self._pending = (batch.indices, signal)
            yield loss

    def after_step(self) -> None:
        """New priorities from the last loss's TD errors; target update when due."""
        if self._pending is not None and self.replay is not None:
            indices, signal = self._pending
            self.replay.update_priorities(indices, signal)
        self._pending = None
        self.grad_steps += 1
        if self.grad_steps % self.config.target_update_period == 0:
            self.update_target()

    @torch.no_grad()
    def update_target(self) -> None:
        tau = self.config.tau
        for target, online in zip(self.target.parameters(), self.online.parameters(), strict=True):
            if tau >= 1.0:
                target.copy_(online)
            else:  # Polyak step in f32, rounded once into the target's dtype
                target.copy_(f32(target).lerp_(f32(online), tau))

    @torch.no_grad()
    def act(self, obs: Obs) -> torch.Tensor:
        """(N,) greedy action indices."""
        return self.q_values(obs).argmax(-1)

    @torch.no_grad()
    def positions(self, obs: Obs) -> torch.Tensor:
        """(N,) f32 greedy positions in [-1, 1]: the family's output-to-position mapping."""
        return greedy_position(self.q_values(obs))

    @torch.no_grad()
    def act_and_confidence(self, obs: Obs) -> tuple[torch.Tensor, torch.Tensor]:
        """Greedy actions and confidence (Q_1 - Q_2) / (Q_1 - Q_min): the margin of the best
        over the second-best action value relative to the spread of all of them (0 when
        all are equal)."""
        values = self.q_values(obs)  # (N, n_actions)
        action = values.argmax(-1)  # exactly act()
        top2 = f32(values).topk(2, dim=-1).values
        spread = top2[:, 0] - f32(values).min(dim=-1).values
        margin = top2[:, 0] - top2[:, 1]
        ok = spread > MARGIN_EPS
        return action, torch.where(ok, margin / spread.clamp_min(MARGIN_EPS), 0.0)

    def trainable_parameters(self) -> Iterator[nn.Parameter]:
        return self.online.parameters()

    # -- checkpointable state --------------------------------------------------------------
    def buffer_state(self) -> dict[str, torch.Tensor]:
        """Counters and seed; once collecting has begun also the replay (its filled part),
        the n-step ring and both generators' states. Keys are namespaced ``learner.``,
        ``replay.``, ``nstep.``. Training progress is not kept: every ``collect`` sets it."""
        state = {
            "learner.counters": torch.tensor([self.env_steps, self.grad_steps], dtype=torch.int64),
            "learner.seed": torch.tensor(self.seed, dtype=torch.int64),
        }
        if self.replay is not None and self.nstep is not None and self.generator is not None:
            state |= {f"replay.{k}": v for k, v in self.replay.state_dict().items()}
            state |= {f"nstep.{k}": v for k, v in self.nstep.state_dict().items()}
            state["learner.generator"] = self.generator.get_state()
        return state

    def load_buffer_state(self, state: dict[str, torch.Tensor]) -> None:
        """Restore :meth:`buffer_state`; storage is built in this run's parameter dtype and
        device (equal to the data dtype under every policy)."""
        self.env_steps, self.grad_steps = (int(v) for v in state["learner.counters"].tolist())
        self.seed = int(state["learner.seed"])
        self._pending = None
        if "replay.count" not in state:
            self.replay = self.nstep = self.generator = None
            return
        reference = next(self.online.parameters())
        self.replay = None
        self._ensure_storage(reference.dtype, reference.device)
        assert self.replay is not None and self.nstep is not None and self.generator is not None
        self.replay.load_state_dict(_section(state, "replay."))
        self.nstep.load_state_dict(_section(state, "nstep."))
        self.generator.set_state(state["learner.generator"].cpu())


def _section(state: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    return {k.removeprefix(prefix): v for k, v in state.items() if k.startswith(prefix)}


def build(config: DQNConfig, shape: DataShape) -> DQNLearner:
    return DQNLearner(config, shape)
