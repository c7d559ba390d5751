"""Device-resident experience replay for the vectorized trading environment.

Two pieces, both pure tensor code that never reads a tensor on the host:

* :class:`NStepAccumulator` turns the environment's one-step :class:`~models.base.Transition`
  s into n-step transitions, one per environment per step, ``n - 1`` steps late
  (Sutton 1988; the multi-step target of Rainbow, Hessel et al. 2018).
* :class:`PrioritizedReplay` is a circular buffer with proportional prioritized sampling
  (Schaul et al. 2016, "Prioritized Experience Replay").

Dtypes: observation windows and positions are stored in the training data dtype (the dtype
the environment hands out: bf16 under the ``bf16`` policy, so the buffer is cast once, at
the boundary, and sampling needs no cast); rewards, discounts and priorities are f32
(sums of rewards and priority ratios are what bf16 would blur); actions int64; dones bool.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from models.base import Obs, Transition
from models.ops import F32


@dataclass(frozen=True)
class NStepTransition:
    """A batch of n-step transitions (one per environment, or a replay sample).

    ``reward`` is the discounted sum of the k <= n rewards that belong to the same episode,
    ``done`` says the episode reached a terminal state within those k steps (then there is
    no bootstrap; an episode cut by a time limit is not terminal), and ``discount`` is
    gamma**k, the factor of the bootstrap value of ``next_obs``.
    """

    obs: Obs  # window (B, L, F), position (B,) in the data dtype
    action: torch.Tensor  # (B,) int64
    reward: torch.Tensor  # (B,) f32
    done: torch.Tensor  # (B,) bool
    next_obs: Obs  # the observation k steps later (meaningless where done)
    discount: torch.Tensor  # (B,) f32, gamma**k

    @property
    def bootstrap(self) -> torch.Tensor:
        """(B,) f32 factor of the next state's value in the target: gamma**k, or 0 if done."""
        return torch.where(self.done, torch.zeros_like(self.discount), self.discount)


@dataclass(frozen=True)
class ReplaySample(NStepTransition):
    """A prioritized minibatch: the transitions, where they live, and their IS weights."""

    indices: torch.Tensor  # (B,) int64 buffer rows
    weights: torch.Tensor  # (B,) f32 importance-sampling weights in (0, 1], max 1


# --------------------------------------------------------------------------------------
# n-step returns


class NStepAccumulator:
    """Per-environment ring of the last ``n`` steps that emits n-step transitions.

    After the step at time s has been pushed (s >= n - 1), the transition that started at
    s - n + 1 has all the rewards it can use, so :meth:`push` returns it for every
    environment at once:

        R = r_t + gamma r_{t+1} + ... + gamma^{k-1} r_{t+k-1}
        k = n, or fewer when the episode ended at step t + k - 1
        next_obs = the state step t + k - 1 led to, discount = gamma^k

    Transitions are emitted with a fixed lag of n - 1 steps and each step is emitted exactly
    once, so an episode end needs no flush: the steps just before it are emitted later,
    truncated at the end. How an episode end is read depends on the environment:

    * it hands ``final_obs`` (the state before the reset): the end is a time limit, the
      return is cut there but still bootstraps from ``final_obs`` (``done`` False;
      Pardo et al. 2018, "Time Limits in Reinforcement Learning");
    * it does not: the end is terminal (``done`` True, no bootstrap), since ``next_obs``
      is already the next episode's first observation.

    The returned ``obs``/``action`` are views into the ring: copy them (the replay does)
    before the next :meth:`push`.
    """

    def __init__(
        self,
        n: int,
        gamma: float,
        num_envs: int,
        window_shape: tuple[int, int],  # (L, F)
        dtype: torch.dtype,  # data dtype of windows and positions
        device: torch.device | str,
    ) -> None:
        if n < 1:
            raise ValueError(f"n_step must be >= 1, got {n}")
        self.n, self.gamma, self.num_envs = n, gamma, num_envs
        self.dtype, self.device = dtype, torch.device(device)
        ring = (n, num_envs)
        self.window = torch.zeros(*ring, *window_shape, dtype=dtype, device=self.device)
        self.position = torch.zeros(ring, dtype=dtype, device=self.device)
        self.action = torch.zeros(ring, dtype=torch.int64, device=self.device)
        self.reward = torch.zeros(ring, dtype=F32, device=self.device)
        self.done = torch.zeros(ring, dtype=torch.bool, device=self.device)  # episode ended
        self.terminal = torch.zeros_like(self.done)  # ... in a terminal state (no bootstrap)
        self.next_window = torch.zeros_like(self.window)  # the state each step led to
        self.next_position = torch.zeros_like(self.position)
        # Constants, built once: gamma^j for j = 0..n, ring rows in age order for each
        # possible oldest row (orders[o] = [o, o+1, ..., o+n-1] mod n), env indices.
        self.gamma_powers = gamma ** torch.arange(n + 1, dtype=F32, device=self.device)
        ages = torch.arange(n, device=self.device)
        self.orders = (ages[:, None] + ages[None, :]) % n  # (n, n)
        self.env_index = torch.arange(num_envs, device=self.device)
        self.steps = 0  # vectorized steps pushed (a Python int: known without reading tensors)

    def push(self, transition: Transition) -> NStepTransition | None:
        """Store one vectorized step; return the n-step transitions now complete, if any."""
        row = self.steps % self.n
        window, position = transition.obs
        if transition.final_obs is None:  # every episode end is terminal
            next_window, next_position = transition.next_obs
            self.terminal[row].copy_(transition.done)
        else:  # episode ends are time limits: bootstrap from the state before the reset
            next_window, next_position = transition.final_obs
            self.terminal[row].zero_()
        self.window[row].copy_(window)
        self.position[row].copy_(position)
        self.action[row].copy_(transition.action)
        self.reward[row].copy_(transition.reward)
        self.done[row].copy_(transition.done)
        self.next_window[row].copy_(next_window)
        self.next_position[row].copy_(next_position)
        self.steps += 1
        if self.steps < self.n:
            return None
        oldest = self.steps % self.n  # the row written n - 1 steps ago
        order = self.orders[oldest]
        rewards = self.reward.index_select(0, order)  # (n, N), oldest first
        dones = self.done.index_select(0, order).to(torch.int64)  # (n, N)
        # Step j of the window belongs to the start's episode iff no done came before it.
        alive = (dones.cumsum(0) - dones) == 0  # (n, N) bool
        ret = (self.gamma_powers[: self.n, None] * rewards * alive).sum(0)  # (N,) f32
        k = alive.sum(0)  # (N,) steps used, in [1, n]
        last = (oldest + k - 1) % self.n  # (N,) ring row of the last step used
        return NStepTransition(
            obs=(self.window[oldest], self.position[oldest]),
            action=self.action[oldest],
            reward=ret,
            done=self.terminal[last, self.env_index],  # only the last step used can end it
            next_obs=(
                self.next_window[last, self.env_index],
                self.next_position[last, self.env_index],
            ),
            discount=self.gamma_powers[k],
        )

    # -- checkpointable state --------------------------------------------------------------
    def state_dict(self) -> dict[str, torch.Tensor]:
        """The whole ring (it is small: n x num_envs windows) and the step count."""
        return {
            "window": self.window,
            "position": self.position,
            "action": self.action,
            "reward": self.reward,
            "done": self.done,
            "terminal": self.terminal,
            "next_window": self.next_window,
            "next_position": self.next_position,
            "steps": torch.tensor(self.steps, dtype=torch.int64),
        }

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        for name in (
            "window",
            "position",
            "action",
            "reward",
            "done",
            "terminal",
            "next_window",
            "next_position",
        ):
            mine = getattr(self, name)
            if state[name].shape != mine.shape:
                raise ValueError(
                    f"n-step state {name!r} has shape {tuple(state[name].shape)}, expected "
                    f"{tuple(mine.shape)} (n_step, num_envs, lookback or features changed?)"
                )
            mine.copy_(state[name])  # copy_ casts to this run's data dtype and device
        self.steps = int(state["steps"])


# --------------------------------------------------------------------------------------
# Prioritized replay


class PrioritizedReplay:
    """Circular buffer of n-step transitions with proportional prioritized sampling.

    Item i is drawn with probability P(i) = p_i^alpha / sum_j p_j^alpha (``alpha = 0`` is
    uniform) and weighted by w_i = (size * P(i))^-beta / max_{j in batch} (size * P(j))^-beta,
    i.e. normalized by the largest weight in the sampled batch (as in Hessel et al.'s
    Rainbow and Dopamine), so weights lie in (0, 1] and the batch's least likely item
    counts fully. Normalizing by the largest weight any stored item could get (the buffer's
    least likely item, OpenAI baselines) instead ties the loss scale to the one item with
    the smallest |TD| in the whole buffer: in this environment a flat-to-flat step has a
    reward of exactly 0 and a near-zero error, so every weight shrank to ~1e-2 and kept
    shrinking as training went on; the logged loss read 0 and Adam's second-moment
    estimate, which lags a decaying gradient scale, shrank the effective step size.
    New items get the largest priority seen so far, so each is likely to be replayed at
    least once.

    Sampling is ``torch.multinomial`` over all ``size`` priorities on the device: O(C) work
    per draw, which on a GPU is a few microseconds for C ~ 1e5-1e6 and needs no sum tree
    (whose per-item updates would be sequential or host-side). With replacement and a batch
    of at least 2, ``torch.multinomial`` launches its kernels without a host sync.

    Every tensor is allocated here, once; ``add`` writes with slice copies at a cursor kept
    as a Python int (the number of items added is known without reading a tensor).
    """

    def __init__(
        self,
        capacity: int,
        window_shape: tuple[int, int],  # (L, F)
        dtype: torch.dtype,  # data dtype of observation windows and positions
        device: torch.device | str,
        alpha: float = 0.5,
        eps: float = 1e-6,
        seed: int = 0,
    ) -> None:
        if capacity < 2:
            raise ValueError(f"replay capacity must be >= 2, got {capacity}")
        if alpha < 0:
            raise ValueError(f"PER alpha must be >= 0, got {alpha}")
        self.capacity, self.alpha, self.eps = capacity, alpha, eps
        self.dtype, self.device = dtype, torch.device(device)
        c = capacity
        self.window = torch.zeros(c, *window_shape, dtype=dtype, device=self.device)
        self.position = torch.zeros(c, dtype=dtype, device=self.device)
        self.action = torch.zeros(c, dtype=torch.int64, device=self.device)
        self.reward = torch.zeros(c, dtype=F32, device=self.device)
        self.done = torch.zeros(c, dtype=torch.bool, device=self.device)
        self.next_window = torch.zeros_like(self.window)
        self.next_position = torch.zeros_like(self.position)
        self.discount = torch.zeros(c, dtype=F32, device=self.device)
        self.priority = torch.zeros(c, dtype=F32, device=self.device)  # raw |TD| + eps
        self.max_priority = torch.ones((), dtype=F32, device=self.device)
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self.count = 0  # items ever added

    @property
    def size(self) -> int:
        return min(self.count, self.capacity)

    def __len__(self) -> int:
        return self.size

    # -- writing ---------------------------------------------------------------------------
    def add(self, batch: NStepTransition) -> None:
        """Append a batch of B <= capacity transitions, overwriting the oldest when full."""
        window, position = batch.obs
        next_window, next_position = batch.next_obs
        if window.dtype != self.dtype or next_window.dtype != self.dtype:
            raise ValueError(
                f"the replay stores observations as {self.dtype}, got {window.dtype}: "
                "the environment's data dtype changed after the buffer was built"
            )
        b = window.shape[0]
        if b > self.capacity:
            raise ValueError(f"cannot add {b} transitions to a replay of capacity {self.capacity}")
        start = self.count % self.capacity
        pairs = (
            (self.window, window),
            (self.position, position),
            (self.action, batch.action),
            (self.reward, batch.reward),
            (self.done, batch.done),
            (self.next_window, next_window),
            (self.next_position, next_position),
            (self.discount, batch.discount),
        )
        # At most two contiguous slices: [start, start + b) possibly wrapping to [0, rest).
        head = min(b, self.capacity - start)
        for dst, src in pairs:
            dst[start : start + head].copy_(src[:head])
            if head < b:
                dst[: b - head].copy_(src[head:])
        self.priority[start : start + head].copy_(self.max_priority.expand(head))
        if head < b:
            self.priority[: b - head].copy_(self.max_priority.expand(b - head))
        self.count += b

    def update_priorities(self, indices: torch.Tensor, td_abs: torch.Tensor) -> None:
        """Set p_i = |TD_i| + eps for sampled rows; tensor ops only, no host sync.

        A row drawn twice in one batch gets the larger of its two errors (deterministic,
        unlike an indexed assignment with duplicate indices). Non-finite errors (a skipped
        step) leave the row at the current maximum priority instead of poisoning sampling.
        """
        td = td_abs.detach().to(F32)
        td = torch.where(torch.isfinite(td), td, self.max_priority)
        new = td + self.eps
        self.priority.scatter_reduce_(0, indices, new, reduce="amax", include_self=False)
        torch.maximum(self.max_priority, new.max(), out=self.max_priority)

    # -- sampling --------------------------------------------------------------------------
    def probabilities(self) -> torch.Tensor:
        """(size,) f32 sampling probabilities P(i)."""
        scaled = self.priority[: self.size].pow(self.alpha)
        return scaled / scaled.sum()

    def sample(self, batch_size: int, beta: float) -> ReplaySample:
        """Draw ``batch_size`` (>= 2) transitions with replacement, with IS weights."""
        if self.size == 0:
            raise RuntimeError("cannot sample from an empty replay")
        probs = self.probabilities()
        idx = torch.multinomial(probs, batch_size, replacement=True, generator=self.generator)
        # (size P_i)^-beta / max_batch (size P_j)^-beta = (P_i / min_batch P_j)^-beta
        drawn = probs[idx]
        weights = (drawn / drawn.min()).pow(-beta)
        return ReplaySample(
            obs=(self.window[idx], self.position[idx]),
            action=self.action[idx],
            reward=self.reward[idx],
            done=self.done[idx],
            next_obs=(self.next_window[idx], self.next_position[idx]),
            discount=self.discount[idx],
            indices=idx,
            weights=weights,
        )

    # -- checkpointable state --------------------------------------------------------------
    _STORED = (
        "window",
        "position",
        "action",
        "reward",
        "done",
        "next_window",
        "next_position",
        "discount",
        "priority",
    )

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Tensors only (safetensors-ready). Only the filled part [0, size) is stored: items
        are written from row 0 on, so the filled part is always a prefix. The slices are
        contiguous views; the checkpoint writer copies them out."""
        n = self.size
        state = {name: getattr(self, name)[:n] for name in self._STORED}
        state["max_priority"] = self.max_priority
        state["count"] = torch.tensor(self.count, dtype=torch.int64)
        state["capacity"] = torch.tensor(self.capacity, dtype=torch.int64)
        state["generator"] = self.generator.get_state()
        return state

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        capacity = int(state["capacity"])
        if capacity != self.capacity:
            raise ValueError(
                f"replay checkpoint has capacity {capacity}, this run's buffer_capacity is "
                f"{self.capacity}"
            )
        self.count = int(state["count"])
        n = self.size
        for name in self._STORED:
            src, dst = state[name], getattr(self, name)[:n]
            if src.shape != dst.shape:
                raise ValueError(
                    f"replay state {name!r} has shape {tuple(src.shape)}, expected {tuple(dst.shape)}"
                )
            dst.copy_(src)  # casts a bf16 checkpoint to this run's data dtype when they differ
        self.max_priority.copy_(state["max_priority"])
        self.generator.set_state(state["generator"].cpu())
