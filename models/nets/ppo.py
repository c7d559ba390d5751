"""PPO family: an on-policy actor-critic for the trading environment.

Papers: Schulman et al. 2017, "Proximal Policy Optimization Algorithms" (clipped surrogate,
minibatch epochs over each rollout, entropy bonus, shared actor-critic loss); Schulman et
al. 2016, "High-Dimensional Continuous Control Using Generalized Advantage Estimation"
(GAE(lambda), lambda-returns); OpenAI baselines' PPO2 (Dhariwal et al. 2017) as catalogued
by Huang et al. 2022, "The 37 Implementation Details of PPO" (value clipping, per-minibatch
advantage normalization, orthogonal init, 0.01-gain policy head); Pardo et al. 2018, "Time
Limits in Reinforcement Learning" (GAE bootstraps from ``final_obs`` at a time-limit end);
optional (``recurrent``) LSTM core (Hochreiter & Schmidhuber 1997) trained from stored
states (R2D2's "stored state", Kapturowski et al. 2019).

Observation: one asset's ``(N, L, F)`` window and the current position ``(N,)``; actions
index ``n_actions`` positions evenly spaced over [-1, 1] (:func:`models.base.action_to_position`);
the greedy action is the validation position.
Recurrent: the rollout is cut into ``bptt``-step chunks per environment, each replayed from
its stored pre-step state (zeroed at episode starts); minibatches are whole chunks.
:meth:`PPOLearner.act` (once per bar, in time order) carries an eval-time state and resets
it to zero on every ``train()``/``eval()`` call, when the batch size or device changes,
and on :meth:`PPOLearner.reset_eval_state`. Why: docs/models.md#ppo

Stays f32 under ``bf16``: log-softmax and log-probabilities, the ratio and the clipped
surrogate, the entropy, stored values, GAE, returns, advantage normalization and the
value loss; the rollout keeps observations and LSTM states in the data dtype.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from models.base import DataShape, Obs, TradingEnvLike, greedy_position
from models.ops import F32, f32, like
from models.ppo import PPOConfig

__all__ = [
    "ActorCritic",
    "LSTMState",
    "PPOLearner",
    "Rollout",
    "build",
    "clipped_surrogate",
    "gae",
    "normalize",
    "value_loss",
]


# --------------------------------------------------------------------------------------
# Network


LSTMState = tuple[torch.Tensor, torch.Tensor]  # (h, c), each (B, H)


def _init(layer: nn.Linear, gain: float) -> nn.Linear:
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


class ActorCritic(nn.Module):
    """Window encoder + position -> tanh MLP torso -> [LSTM] -> policy logits and value.

    One torso feeds both heads (the Atari PPO layout): one encoder pass per step, and the
    value loss shapes the features the policy reads. Orthogonal init, gain sqrt(2) in the
    body, 0.01 on the policy head (a near-uniform initial policy), 1 on the value head.

    The LSTM is residual: the heads read ``z + h``, torso features plus LSTM output. The
    window already holds L bars, so the LSTM adds longer memory instead of being the only
    path from the inputs; through its gates alone the recurrent policy learned the planted
    signal far slower (measured at the test's budget: val Sharpe ~0.5 vs ~2.3 residual).
    """

    def __init__(self, config: PPOConfig, shape: DataShape) -> None:
        super().__init__()
        h, gain = config.hidden, math.sqrt(2.0)
        # A flattened window through one linear layer, as in dqn: L*F is 256 at the defaults.
        self.encoder = nn.Sequential(
            nn.Flatten(1), _init(nn.Linear(shape.lookback * shape.n_features, h), gain), nn.Tanh()
        )
        torso: list[nn.Module] = []
        width = h + 1  # + the current position, which sets the cost of every action
        for _ in range(config.n_layers):
            torso += [_init(nn.Linear(width, h), gain), nn.Tanh()]
            width = h
        self.torso = nn.Sequential(*torso)
        self.lstm = nn.LSTMCell(h, h) if config.recurrent else None
        self.policy = _init(nn.Linear(h, shape.n_actions), 0.01)
        self.value = _init(nn.Linear(h, 1), 1.0)

    def features(self, obs: Obs) -> torch.Tensor:
        """(B, H) torso output for a batch of observations (no recurrence)."""
        window, position = obs  # (B, L, F), (B,)
        z = torch.cat([self.encoder(window), position.unsqueeze(-1)], dim=-1)  # (B, H+1)
        return self.torso(z)

    def core(
        self, z: torch.Tensor, state: LSTMState | None
    ) -> tuple[torch.Tensor, LSTMState | None]:
        """One recurrent step on (B, H) features: ``z + h`` and the new state (identity
        when not recurrent)."""
        if self.lstm is None:
            return z, None
        assert state is not None
        h, c = self.lstm(z, state)
        return z + h, (h, c)

    def heads(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits (B, A) and value (B,) in the parameter dtype."""
        return self.policy(z), self.value(z).squeeze(-1)

    def zero_state(self, batch: int, like_tensor: torch.Tensor) -> LSTMState | None:
        if self.lstm is None:
            return None
        h = torch.zeros(
            batch, self.lstm.hidden_size, dtype=like_tensor.dtype, device=like_tensor.device
        )
        return h, torch.zeros_like(h)


# --------------------------------------------------------------------------------------
# The pieces of the objective (pure functions, all f32)


def gae(
    rewards: torch.Tensor,  # (T, N) f32
    values: torch.Tensor,  # (T, N) f32 V(s_t)
    dones: torch.Tensor,  # (T, N) bool: the episode ended after step t
    last_value: torch.Tensor,  # (N,) f32 V(s_T), the state after the rollout
    gamma: float,
    lam: float,
    final_values: torch.Tensor | None = None,  # (T, N) f32 V(state step t led to, pre-reset)
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE(lambda) advantages and lambda-returns (advantage + value), both (T, N) f32.

    delta_t = r_t + gamma * V_next_t - V(s_t), A_t = delta_t + gamma * lam * (1 - d_t) A_{t+1}
    where V_next_t is V(s_{t+1}) inside an episode; at an episode end (d_t) it is
    ``final_values[t]`` (a time limit: bootstrap from the state before the reset) or 0 when
    ``final_values`` is None (terminal). The recursion never crosses an episode end.
    """
    rewards, values, last_value = f32(rewards), f32(values), f32(last_value)
    next_values = torch.cat([values[1:], last_value[None]], dim=0)  # (T, N)
    at_end = torch.zeros_like(values) if final_values is None else f32(final_values)
    next_values = torch.where(dones, at_end, next_values)
    deltas = rewards + gamma * next_values - values
    carry = (~dones).to(F32) * (gamma * lam)  # (T, N)
    advantages = torch.empty_like(deltas)
    running = torch.zeros_like(last_value)
    for t in range(rewards.shape[0] - 1, -1, -1):
        running = deltas[t] + carry[t] * running
        advantages[t] = running
    return advantages, advantages + values


def clipped_surrogate(
    new_logp: torch.Tensor,  # (B,) log pi_theta(a|s)
    old_logp: torch.Tensor,  # (B,) log pi_old(a|s) from the rollout
    advantages: torch.Tensor,  # (B,)
    clip_coef: float,
) -> torch.Tensor:
    """The PPO-clip policy loss, to minimize: -mean(min(r A, clip(r, 1-eps, 1+eps) A)). f32."""
    ratio = torch.exp(f32(new_logp) - f32(old_logp))
    advantages = f32(advantages)
    unclipped = ratio * advantages
    clipped = ratio.clamp(1.0 - clip_coef, 1.0 + clip_coef) * advantages
    return -torch.minimum(unclipped, clipped).mean()


def value_loss(
    value: torch.Tensor,  # (B,) V_theta(s)
    old_value: torch.Tensor,  # (B,) V(s) at collection
    returns: torch.Tensor,  # (B,) lambda-returns
    value_clip: float,
) -> torch.Tensor:
    """0.5 * mean squared error; with ``value_clip > 0`` PPO2's pessimistic clipped form
    0.5 * mean(max((V - R)^2, (V_old + clip(V - V_old, -c, c) - R)^2)). f32."""
    value, old_value, returns = f32(value), f32(old_value), f32(returns)
    squared = (value - returns).square()
    if value_clip > 0.0:
        clipped = old_value + (value - old_value).clamp(-value_clip, value_clip)
        squared = torch.maximum(squared, (clipped - returns).square())
    return 0.5 * squared.mean()


def _reset(state: LSTMState | None, start: torch.Tensor) -> LSTMState | None:
    """Zero the LSTM state (B, H) of the rows where ``start`` (B,): a new episode begins."""
    if state is None:
        return None
    keep = ~start[:, None]
    return torch.where(keep, state[0], 0.0), torch.where(keep, state[1], 0.0)


def _cat(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.cat([a, b.to(a.dtype)])


def _cat_states(a: LSTMState | None, b: LSTMState | None) -> LSTMState | None:
    """Row-wise concatenation of two LSTM states (None when not recurrent)."""
    if a is None or b is None:
        return None
    return _cat(a[0], b[0]), _cat(a[1], b[1])


def normalize(x: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    x = f32(x)
    return (x - x.mean()) / (x.std() + eps)


# --------------------------------------------------------------------------------------
# Rollout storage


class Rollout:
    """One rollout of ``T`` vectorized steps of ``N`` environments, allocated once on the
    device. Observations and LSTM states in the data dtype, what the objective reads in f32.
    ``start[t]``: obs[t] is the first of an episode (the LSTM state was zeroed before it)."""

    FIELDS = (
        "window",
        "position",
        "action",
        "logprob",
        "value",
        "reward",
        "done",
        "final_value",
        "advantage",
        "returns",
        "start",
        "h",
        "c",
    )

    def __init__(
        self,
        n_steps: int,
        num_envs: int,
        window_shape: tuple[int, int],  # (L, F)
        hidden: int | None,  # LSTM width, None when not recurrent
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        size = (n_steps, num_envs)
        self.window = torch.zeros(*size, *window_shape, dtype=dtype, device=device)
        self.position = torch.zeros(size, dtype=dtype, device=device)
        self.action = torch.zeros(size, dtype=torch.int64, device=device)
        self.logprob = torch.zeros(size, dtype=F32, device=device)
        self.value = torch.zeros(size, dtype=F32, device=device)
        self.reward = torch.zeros(size, dtype=F32, device=device)
        self.done = torch.zeros(size, dtype=torch.bool, device=device)
        self.final_value = torch.zeros(size, dtype=F32, device=device)
        self.advantage = torch.zeros(size, dtype=F32, device=device)
        self.returns = torch.zeros(size, dtype=F32, device=device)
        self.start = torch.zeros(size, dtype=torch.bool, device=device)
        self.h: torch.Tensor | None = None  # (T, N, H) pre-step LSTM states, if recurrent
        self.c: torch.Tensor | None = None
        if hidden is not None:
            self.h = torch.zeros(*size, hidden, dtype=dtype, device=device)
            self.c = torch.zeros_like(self.h)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {
            name: getattr(self, name) for name in self.FIELDS if getattr(self, name) is not None
        }

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        for name, mine in self.state_dict().items():
            if name not in state:
                raise ValueError(f"ppo rollout state has no {name!r} (recurrent changed?)")
            if state[name].shape != mine.shape:
                raise ValueError(
                    f"ppo rollout {name!r} has shape {tuple(state[name].shape)}, expected "
                    f"{tuple(mine.shape)} (n_steps, num_envs, lookback, features or hidden "
                    "changed?)"
                )
            mine.copy_(state[name])  # copy_ casts to this run's dtype and device


# --------------------------------------------------------------------------------------
# Learner


class PPOLearner(nn.Module):
    """The ``RLLearner`` of the PPO family (see :class:`models.base.RLLearner`).

    ``collect`` runs ``n_steps`` vectorized steps with actions sampled from the policy
    (Gumbel-max on the f32 log-probabilities: no ``multinomial``, no host sync), then
    computes GAE. ``losses`` yields ``ppo_epochs * minibatches`` losses over that rollout,
    each minibatch drawn after the previous optimizer step; a rollout is used once.
    ``act`` is the greedy (argmax) policy. The rollout and the generator are built on the
    first ``collect`` (or ``load_buffer_state``) on the environment's device in its data
    dtype, once.

    Randomness: a seed is drawn from torch's global generator at construction (the trainer
    seeds it per trial); action sampling and minibatch order use one device generator of
    this learner, saved in :meth:`buffer_state`.

    ``stats`` holds device tensors of the last loss (policy_loss, value_loss, entropy,
    approx_kl, clip_fraction): read them on the host only when logging.
    """

    def __init__(self, config: PPOConfig, shape: DataShape) -> None:
        super().__init__()
        if shape.n_actions < 2:
            raise ValueError(f"ppo needs n_actions >= 2, got {shape.n_actions}")
        self.config = config
        self.shape = shape
        self.n_actions = shape.n_actions
        self.net = ActorCritic(config, shape)
        self.seed = int(torch.randint(0, 2**62, ()).item())
        self.rollout: Rollout | None = None
        self.generator: torch.Generator | None = None
        self.env_steps = 0  # vectorized environment steps taken by collect
        self.grad_steps = 0  # after_step calls (optimizer steps)
        self.pending = False  # a collected rollout not yet trained on
        # Carried across collects: episode starts (N,) and the LSTM state of each env.
        self._start: torch.Tensor | None = None
        self._state: LSTMState | None = None
        self._eval_state: LSTMState | None = None
        self.stats: dict[str, torch.Tensor] = {}

    # -- storage ---------------------------------------------------------------------------
    def _ensure_storage(self, dtype: torch.dtype, device: torch.device) -> None:
        if self.rollout is not None:
            return
        cfg = self.config
        self.rollout = Rollout(
            cfg.n_steps,
            cfg.num_envs,
            (self.shape.lookback, self.shape.n_features),
            cfg.hidden if cfg.recurrent else None,
            dtype,
            device,
        )
        self.generator = torch.Generator(device=device).manual_seed(self.seed)
        # Every environment starts an episode at the first collect.
        self._start = torch.ones(cfg.num_envs, dtype=torch.bool, device=device)
        reference = torch.zeros((), dtype=dtype, device=device)
        self._state = self.net.zero_state(cfg.num_envs, reference)

    # -- RLLearner -------------------------------------------------------------------------
    @torch.no_grad()
    def collect(self, env: TradingEnvLike, progress: float) -> None:
        """``n_steps`` sampled vectorized steps into the rollout, then GAE. ``progress`` is
        unused: PPO here has no schedule of its own (lr annealing is the trainer's).

        One network pass per step: where the environment hands ``final_obs`` (a time
        limit), the pass runs on [final_obs; next_obs] (2N rows), giving the bootstrap
        value of the pre-reset state and the next step's policy at once."""
        del progress
        cfg = self.config
        if env.num_envs != cfg.num_envs or env.n_actions != self.n_actions:
            raise ValueError(
                f"environment has num_envs={env.num_envs}, n_actions={env.n_actions}; this ppo "
                f"was built for num_envs={cfg.num_envs}, n_actions={self.n_actions}"
            )
        obs = env.observe()
        self._ensure_storage(obs[0].dtype, obs[0].device)
        ro, n = self.rollout, cfg.num_envs
        assert ro is not None and self._start is not None
        start, state = self._start, self._state  # state: already zeroed where start
        logits, value, next_state = self._forward(obs, state)
        time_limits = False  # the environment hands final_obs: episode ends are truncations
        for t in range(cfg.n_steps):
            ro.window[t].copy_(obs[0])
            ro.position[t].copy_(obs[1])
            ro.start[t].copy_(start)
            if state is not None:
                assert ro.h is not None and ro.c is not None
                ro.h[t].copy_(state[0])
                ro.c[t].copy_(state[1])
            logp = F.log_softmax(f32(logits), dim=-1)  # (N, A)
            action = self._sample(logp)
            ro.action[t].copy_(action)
            ro.logprob[t].copy_(logp.gather(1, action[:, None]).squeeze(1))
            ro.value[t].copy_(value)
            transition = env.step(action)
            ro.reward[t].copy_(transition.reward)
            ro.done[t].copy_(transition.done)
            start, obs = transition.done, transition.next_obs
            state = _reset(next_state, start)
            if transition.final_obs is None:  # every end is terminal: nothing to bootstrap
                logits, value, next_state = self._forward(obs, state)
                continue
            time_limits = True
            # The pre-reset state continues the LSTM state this step produced.
            both_obs = (
                _cat(transition.final_obs[0], obs[0]),
                _cat(transition.final_obs[1], obs[1]),
            )
            logits, value, both_next = self._forward(both_obs, _cat_states(next_state, state))
            ro.final_value[t].copy_(value[:n])
            logits, value = logits[n:], value[n:]
            next_state = None if both_next is None else (both_next[0][n:], both_next[1][n:])
        advantage, returns = gae(
            ro.reward,
            ro.value,
            ro.done,
            f32(value),
            cfg.gamma,
            cfg.gae_lambda,
            ro.final_value if time_limits else None,
        )
        ro.advantage.copy_(advantage)
        ro.returns.copy_(returns)
        self._start = start.clone()
        self._state = (
            None if state is None else (like(state[0], ro.window), like(state[1], ro.window))
        )
        self.env_steps += cfg.n_steps
        self.pending = True

    def _forward(
        self, obs: Obs, state: LSTMState | None
    ) -> tuple[torch.Tensor, torch.Tensor, LSTMState | None]:
        """Logits (B, A), value (B,) and the next LSTM state of one step from ``state``."""
        z, state = self.net.core(self.net.features(obs), state)
        logits, value = self.net.heads(z)
        return logits, value, state

    def _sample(self, logp: torch.Tensor) -> torch.Tensor:
        """(N,) actions drawn from the categorical ``logp`` (N, A) f32 by Gumbel-max."""
        u = torch.rand(logp.shape, generator=self.generator, device=logp.device, dtype=F32)
        u = u.clamp(1e-12, 1.0 - 1e-7)
        return (logp - torch.log(-torch.log(u))).argmax(-1)

    def losses(self) -> Iterator[torch.Tensor]:
        """``ppo_epochs`` passes over the last rollout in ``minibatches`` random minibatches
        (of transitions, or of whole ``bptt`` sequences if recurrent); nothing before the
        first ``collect`` or when the rollout was already used. A generator: each minibatch
        is evaluated after the previous step's ``after_step``."""
        if not self.pending or self.rollout is None:
            return
        self.pending = False
        cfg = self.config
        device = self.rollout.value.device
        items = cfg.num_envs * cfg.n_steps
        if cfg.recurrent:
            items //= cfg.bptt  # sequences
        for _ in range(cfg.ppo_epochs):
            order = torch.randperm(items, generator=self.generator, device=device)
            for batch in order.tensor_split(cfg.minibatches):
                yield self.loss(batch)

    def _gather(self, batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(time, env) rollout indices of minibatch ``batch``, each (S, M): S = bptt steps of
        M sequences if recurrent, else S = 1 and M transitions."""
        cfg, n = self.config, self.config.num_envs
        if not cfg.recurrent:
            return (batch // n)[None], (batch % n)[None]
        # Sequence s covers steps [k * bptt, (k + 1) * bptt) of env s % N, with k = s // N.
        steps = torch.arange(cfg.bptt, device=batch.device)[:, None]  # (S, 1)
        return (batch // n)[None] * cfg.bptt + steps, (batch % n)[None].expand(cfg.bptt, -1)

    def evaluate(
        self, batch: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Re-run the current networks on minibatch ``batch`` of the rollout: its (time,
        env) indices t, e (S, M), the f32 log-probabilities of every action (S*M, A) and the
        values (S*M,), rows in (step, sequence) order. Recurrent: each sequence replays from
        its stored state, zeroed at episode starts inside it."""
        ro = self.rollout
        assert ro is not None
        t, e = self._gather(batch)  # (S, M) each
        obs = (ro.window[t, e].flatten(0, 1), ro.position[t, e].flatten(0, 1))  # (S*M, ...)
        z = self.net.features(obs)  # (S*M, H): the non-recurrent part in one batch
        if ro.h is not None and ro.c is not None:
            seq, m = t.shape
            state: LSTMState | None = (ro.h[t[0], e[0]], ro.c[t[0], e[0]])  # stored, (M, H)
            starts = ro.start[t, e]  # (S, M)
            outs = []
            for j, zj in enumerate(z.view(seq, m, -1)):
                out, state = self.net.core(zj, _reset(state, starts[j]))
                outs.append(out)
            z = torch.cat(outs)
        logits, value = self.net.heads(z)
        return t, e, F.log_softmax(f32(logits), dim=-1), value

    def loss(self, batch: torch.Tensor) -> torch.Tensor:
        """The PPO loss (f32 scalar) of minibatch ``batch`` (indices of transitions or
        sequences): clipped surrogate + vf_coef * value loss - ent_coef * entropy."""
        cfg, ro = self.config, self.rollout
        assert ro is not None
        t, e, logp_all, value = self.evaluate(batch)
        action = ro.action[t, e].flatten()
        new_logp = logp_all.gather(1, action[:, None]).squeeze(1)
        old_logp = ro.logprob[t, e].flatten()
        advantages = ro.advantage[t, e].flatten()
        if cfg.norm_adv:
            advantages = normalize(advantages)
        policy_loss = clipped_surrogate(new_logp, old_logp, advantages, cfg.clip_coef)
        v_loss = value_loss(
            value, ro.value[t, e].flatten(), ro.returns[t, e].flatten(), cfg.value_clip
        )
        entropy = -(logp_all.exp() * logp_all).sum(-1).mean()
        with torch.no_grad():
            log_ratio = new_logp - old_logp
            self.stats = {
                "policy_loss": policy_loss.detach(),
                "value_loss": v_loss.detach(),
                "entropy": entropy.detach(),
                # the low-variance estimator k3 = (r - 1) - log r (Schulman 2020)
                "approx_kl": (log_ratio.exp() - 1.0 - log_ratio).mean(),
                "clip_fraction": ((log_ratio.exp() - 1.0).abs() > cfg.clip_coef).to(F32).mean(),
            }
        return policy_loss + cfg.vf_coef * v_loss - cfg.ent_coef * entropy

    def after_step(self) -> None:
        self.grad_steps += 1

    # -- greedy policy -----------------------------------------------------------------------
    def train(self, mode: bool = True) -> PPOLearner:
        """Also resets the eval-time LSTM state: every evaluation span (the trainer calls
        ``eval()`` before each) starts from zero."""
        self._eval_state = None
        return super().train(mode)

    def reset_eval_state(self) -> None:
        self._eval_state = None

    @torch.no_grad()
    def act(self, obs: Obs) -> torch.Tensor:
        """(N,) greedy action indices. Recurrent: call once per bar in time order; the state
        carries from call to call (reset rules in the module docstring)."""
        return self._greedy_logits(obs).argmax(-1)

    def _greedy_logits(self, obs: Obs) -> torch.Tensor:
        """(N, n_actions) policy logits of one eval-time step (advances the LSTM state)."""
        z = self.net.features(obs)  # (N, H)
        if self.net.lstm is not None:
            state = self._eval_state
            if state is None or state[0].shape != z.shape or state[0].device != z.device:
                state = self.net.zero_state(z.shape[0], z)
            z, self._eval_state = self.net.core(z, state)
        logits: torch.Tensor = self.net.policy(z)  # the value head is not needed to act
        return logits

    @torch.no_grad()
    def positions(self, obs: Obs) -> torch.Tensor:
        """(N,) f32 greedy positions in [-1, 1]: the family's output-to-position mapping."""
        return greedy_position(self._greedy_logits(obs))

    @torch.no_grad()
    def act_and_confidence(self, obs: Obs) -> tuple[torch.Tensor, torch.Tensor]:
        """Greedy actions (one recurrent step, exactly as ``act``) and confidence = the
        policy's probability of the chosen action (softmax in f32)."""
        logits = self._greedy_logits(obs)
        action = logits.argmax(-1)
        probs = F.softmax(f32(logits), dim=-1)
        return action, probs.gather(-1, action.unsqueeze(-1)).squeeze(-1)

    def trainable_parameters(self) -> Iterator[nn.Parameter]:
        return self.net.parameters()

    # -- checkpointable state --------------------------------------------------------------
    def buffer_state(self) -> dict[str, torch.Tensor]:
        """Counters and seed; once collecting has begun also the rollout (so a fallback or
        resume between two of its minibatches continues on the same data), the carried
        episode starts and LSTM states, and the generator state. Keys are namespaced
        ``learner.``, ``rollout.``, ``carry.``."""
        state = {
            "learner.counters": torch.tensor(
                [self.env_steps, self.grad_steps, int(self.pending)], dtype=torch.int64
            ),
            "learner.seed": torch.tensor(self.seed, dtype=torch.int64),
        }
        if self.rollout is not None and self.generator is not None and self._start is not None:
            state |= {f"rollout.{k}": v for k, v in self.rollout.state_dict().items()}
            state["carry.start"] = self._start
            if self._state is not None:
                state["carry.h"], state["carry.c"] = self._state
            state["learner.generator"] = self.generator.get_state()
        return state

    def load_buffer_state(self, state: dict[str, torch.Tensor]) -> None:
        """Restore :meth:`buffer_state`; storage is built in this run's parameter dtype and
        device (equal to the data dtype under every policy)."""
        counters = [int(v) for v in state["learner.counters"].tolist()]
        self.env_steps, self.grad_steps, self.pending = counters[0], counters[1], bool(counters[2])
        self.seed = int(state["learner.seed"])
        self.rollout = self.generator = self._start = self._state = None
        self._eval_state = None
        if "rollout.value" not in state:
            self.pending = False
            return
        reference = next(self.net.parameters())
        self._ensure_storage(reference.dtype, reference.device)
        assert self.rollout is not None and self.generator is not None
        self.rollout.load_state_dict(
            {k.removeprefix("rollout."): v for k, v in state.items() if k.startswith("rollout.")}
        )
        self._start = state["carry.start"].to(reference.device)
        if self._state is not None:
            self._state = (
                like(state["carry.h"].to(reference.device), reference),
                like(state["carry.c"].to(reference.device), reference),
            )
        self.generator.set_state(state["learner.generator"].cpu())


def build(config: PPOConfig, shape: DataShape) -> PPOLearner:
    return PPOLearner(config, shape)
