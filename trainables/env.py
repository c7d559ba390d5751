"""A vectorized trading environment over the same bars the supervised path uses.

Each of ``num_envs`` environments trades one asset from a random decision time inside the
training split for ``episode_len`` bars. At decision time t the agent sees the window of
the last ``lookback`` bars' features of its asset and its current position, picks an action
(an index into ``n_actions`` positions evenly spaced over [-1, 1]) and earns

    reward_t = reward_scale * (w_t * R_{t+1} - cost * |w_t - w_{t-1}|)

which is the backtest's r_{t+1} = w_t R_{t+1} - cost |w_t - w_{t-1}| regrouped so that
the cost of a trade lands on the step that made it. Everything lives on the training
device and is tensor arithmetic: a step never syncs with the host.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from models.base import Obs, Transition, action_to_position


class TradingEnv:
    def __init__(
        self,
        features: torch.Tensor,  # (T, A, F) in the policy's data dtype, on the device
        bar_returns: torch.Tensor,  # (T, A) f32: bar_returns[t] = close[t] / close[t-1] - 1
        lookback: int,
        decision_range: tuple[int, int],  # [start, stop) decision times episodes may use
        num_envs: int,
        episode_len: int,
        cost: float,
        n_actions: int = 3,
        reward_scale: float = 100.0,
        seed: int = 0,
    ) -> None:
        start, stop = decision_range
        if start < lookback - 1:
            raise ValueError(
                f"decision_range starts at {start}, before a full window ({lookback - 1})"
            )
        if stop > features.shape[0] - 1:
            raise ValueError(
                "decision_range must end before the last bar (its label is the next bar)"
            )
        if stop - start <= episode_len:
            raise ValueError(
                f"the training split has {stop - start} decision bars, "
                f"fewer than one episode ({episode_len}); lower episode_len"
            )
        self.device = features.device
        self.windows = features.unfold(0, lookback, 1)  # (T-L+1, A, F, L), a view
        self.bar_returns = bar_returns
        self.lookback = lookback
        self.start, self.stop = start, stop
        self.num_envs = num_envs
        self.episode_len = episode_len
        self.cost = cost
        self.n_actions = n_actions
        self.reward_scale = reward_scale
        self.n_assets = features.shape[1]
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self.t = torch.zeros(num_envs, dtype=torch.int64, device=self.device)
        self.asset = torch.zeros_like(self.t)
        self.age = torch.zeros_like(self.t)
        self.position = torch.zeros(num_envs, dtype=features.dtype, device=self.device)
        self._restart(torch.ones(num_envs, dtype=torch.bool, device=self.device))

    def _restart(self, mask: torch.Tensor) -> None:
        """Send the environments in ``mask`` to a fresh random (asset, start) with no position."""
        n = self.num_envs
        t = torch.randint(
            self.start,
            self.stop - self.episode_len,
            (n,),
            generator=self.generator,
            device=self.device,
        )
        asset = torch.randint(0, self.n_assets, (n,), generator=self.generator, device=self.device)
        self.t = torch.where(mask, t, self.t)
        self.asset = torch.where(mask, asset, self.asset)
        self.age = torch.where(mask, torch.zeros_like(self.age), self.age)
        self.position = torch.where(mask, torch.zeros_like(self.position), self.position)

    def observe(self) -> Obs:
        window = self.windows[self.t - (self.lookback - 1), self.asset]  # (N, F, L)
        return window.transpose(1, 2), self.position.clone()

    def step(self, action: torch.Tensor) -> Transition:
        obs = self.observe()
        new_position = action_to_position(action, self.n_actions)
        previous = self.position.float()
        next_return = self.bar_returns[self.t + 1, self.asset]
        reward = self.reward_scale * (
            new_position * next_return - self.cost * (new_position - previous).abs()
        )
        self.position = new_position.to(self.position.dtype)
        self.t = self.t + 1
        self.age = self.age + 1
        done = self.age >= self.episode_len
        # Episodes end only by the time limit: the market goes on, so the state the step
        # led to is handed over as final_obs for bootstrapping (before the restart).
        final_obs = self.observe()
        self._restart(done)
        return Transition(
            obs=obs,
            action=action,
            reward=reward,
            done=done,
            next_obs=self.observe(),
            final_obs=final_obs,
        )

    # -- checkpointable state --------------------------------------------------------------
    def state_dict(self) -> dict[str, torch.Tensor]:
        return {
            "t": self.t,
            "asset": self.asset,
            "age": self.age,
            "position": self.position.float(),
            "generator": self.generator.get_state(),
        }

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.t = state["t"].to(self.device)
        self.asset = state["asset"].to(self.device)
        self.age = state["age"].to(self.device)
        self.position = state["position"].to(self.device, self.position.dtype)
        self.generator.set_state(state["generator"].cpu())


@torch.no_grad()
def greedy_positions(
    positions: Callable[[Obs], torch.Tensor],
    features: torch.Tensor,  # (T, A, F)
    lookback: int,
    decision_range: tuple[int, int],
) -> torch.Tensor:
    """Trade every asset through ``decision_range`` with the learner's greedy ``positions``
    (its family's score-to-position mapping, NaN where a score is not finite): (T_range, A) f32.

    Sequential in time (the position is part of the state) and batched over assets.
    """
    start, stop = decision_range
    windows = features.unfold(0, lookback, 1)  # (T-L+1, A, F, L)
    n_assets = features.shape[1]
    position = torch.zeros(n_assets, dtype=features.dtype, device=features.device)
    out = torch.empty(stop - start, n_assets, dtype=torch.float32, device=features.device)
    for i, t in enumerate(range(start, stop)):
        window = windows[t - (lookback - 1)].transpose(1, 2)  # (A, L, F)
        out[i] = positions((window, position))
        position = out[i].to(features.dtype)
    return out
