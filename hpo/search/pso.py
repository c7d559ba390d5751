"""Asynchronous particle-swarm optimization over a mixed search space.

PSO (Kennedy & Eberhart 1995) in the inertia-weight form (Shi & Eberhart 1998): after an
evaluation, particle ``i`` (position ``x_i``, velocity ``v_i``, personal best ``p_i``;
swarm best ``g``) moves by

    v_i <- w * v_i + c1 * r1 * (p_i - x_i) + c2 * r2 * (g - x_i)      r1, r2 ~ U(0, 1) per dim
    x_i <- x_i + v_i

with ``w = 0.7298``, ``c1 = c2 = 1.49618`` by default (Clerc & Kennedy 2002). Every
dimension lives on [0, 1]: ``Float`` linearly (or in log space), ``Int`` over
``[low - 0.5, high + 0.5]`` then rounded (an equal share per integer), ``Choice`` by
``floor`` over ``[0, n)`` in the listed order. Velocities are clamped per dimension to
``[-v_max, v_max]`` (default 0.2); a position leaving [0, 1] is reflected off the wall.

``ask`` hands out the longest-idle particle's position (FIFO); ``tell`` updates the bests
and moves that particle at once. The swarm starts on a Latin hypercube. With every particle
out, ``ask`` returns an *extra* point (the global best perturbed by
``N(0, explore_sigma^2)``, uniform before any result) that moves no particle. A failed
trial (``None``, NaN, +-inf) updates no best and restarts its particle at a random
position; early-stopped trials report their last value. ``maximize=False`` negates values
internally and reports them in their own sign. :meth:`PSOParamSearcher.state` is plain
JSON; after :meth:`load_state` the next suggestions are those of an uninterrupted run.
Why these choices: docs/search.md#pso
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from typing import Any

import numpy as np

from hpo.search.param_searcher import ParamSearcher
from models.family import Choice, Dim, Float, Int

STATE_VERSION = 1

# Clerc & Kennedy (2002) constriction, chi = 2 / |2 - phi - sqrt(phi^2 - 4 phi)|, phi = 4.1.
DEFAULT_INERTIA = 0.7298
DEFAULT_ACCEL = 1.49618  # chi * phi / 2


def _span(dim: Float | Int) -> tuple[float, float]:
    """The continuous interval a numeric dimension's unit coordinate maps onto."""
    low, high = float(dim.low), float(dim.high)
    if isinstance(dim, Int):
        low, high = low - 0.5, high + 0.5
    if dim.log:
        return math.log(low), math.log(high)
    return low, high


def decode(dim: Dim, u: float) -> Any:
    """The parameter value at unit coordinate ``u`` in [0, 1]."""
    u = min(max(float(u), 0.0), 1.0)
    if isinstance(dim, Choice):
        n = len(dim.options)
        return dim.options[min(math.floor(u * n), n - 1)]
    a, b = _span(dim)
    x = a + u * (b - a)
    if dim.log:
        x = math.exp(x)
    if isinstance(dim, Int):
        return min(max(math.floor(x + 0.5), dim.low), dim.high)
    return min(max(x, float(dim.low)), float(dim.high))


def encode(dim: Dim, value: Any) -> float:
    """The unit coordinate that :func:`decode` maps to ``value`` (the middle of its
    stratum for an integer or a choice)."""
    if isinstance(dim, Choice):
        if value not in dim.options:
            raise ValueError(f"{value!r} is not one of the choices {list(dim.options)}")
        return (dim.options.index(value) + 0.5) / len(dim.options)
    a, b = _span(dim)
    x = float(value)
    if dim.log:
        x = math.log(x)
    return min(max((x - a) / (b - a), 0.0), 1.0) if b > a else 0.5


class PSOParamSearcher(ParamSearcher):
    """Asynchronous PSO over one space; the same ask / tell / state interface as Optuna's.

    Args:
        dims: the space, name -> ``Float`` / ``Int`` / ``Choice``.
        seed: seeds the ``numpy.random.Generator`` behind every random draw.
        maximize: maximize the told values (default) or minimize them.
        swarm_size: number of particles (default 8: sweeps here are tens of trials, so a
            small swarm gets several moves per particle).
        inertia, c1, c2: ``w`` and the cognitive / social accelerations.
        v_max: velocity clamp as a fraction of each dimension's (unit) range.
        explore_sigma: std of the perturbation of an extra point around the global best.
    """

    def __init__(
        self,
        dims: dict[str, Dim],
        seed: int = 0,
        maximize: bool = True,
        swarm_size: int = 8,
        inertia: float = DEFAULT_INERTIA,
        c1: float = DEFAULT_ACCEL,
        c2: float = DEFAULT_ACCEL,
        v_max: float = 0.2,
        explore_sigma: float = 0.1,
    ) -> None:
        if swarm_size < 1:
            raise ValueError(f"swarm_size must be >= 1, got {swarm_size}")
        if not 0.0 < v_max <= 1.0:
            raise ValueError(f"v_max is a fraction of the range in (0, 1], got {v_max}")
        self.dims = dict(dims)
        self.names = list(self.dims)
        self.seed = seed
        self.maximize = maximize
        self.swarm_size = swarm_size
        self.inertia = inertia
        self.c1 = c1
        self.c2 = c2
        self.v_max = v_max
        self.explore_sigma = explore_sigma
        self.rng = np.random.default_rng(seed)
        d = len(self.names)
        self.x = self._latin_hypercube(swarm_size, d)
        self.v = self.rng.uniform(-v_max, v_max, size=(swarm_size, d))
        # Scores are internal, always maximized (negated values when minimizing).
        self.pbest_x: list[np.ndarray | None] = [None] * swarm_size
        self.pbest_score: list[float | None] = [None] * swarm_size
        self.gbest_x: np.ndarray | None = None
        self.gbest_score: float | None = None
        self.idle: deque[int] = deque(range(swarm_size))
        self.outstanding: dict[str, tuple[int | None, np.ndarray]] = {}  # token -> (particle, x)
        self._n_told = 0
        self.n_failed = 0

    # -- ask / tell ------------------------------------------------------------------------
    def ask(self, token: str, fixed: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Parameters for trial ``token``: an idle particle's position, else an extra point.
        Dimensions in ``fixed`` are moved to its values (the particle with them: the
        particles of a group share its shape, and each moves on from where it was
        evaluated)."""
        particle, x = self._next_point()
        for name, value in (fixed or {}).items():
            if name in self.dims:
                x[self.names.index(name)] = encode(self.dims[name], value)
        if particle is not None:
            self.x[particle] = x.copy()
        self.outstanding[token] = (particle, x)
        # The held values themselves: a log-scale float decoded from its coordinate can
        # come back an ulp off, and a group trial's trials must share the shape exactly.
        return {**self._decode(x), **{k: v for k, v in (fixed or {}).items() if k in self.dims}}

    def _next_point(self) -> tuple[int | None, np.ndarray]:
        """The longest-idle particle and its position, or (None, an extra point)."""
        if self.idle:
            particle: int | None = self.idle.popleft()
            x = self.x[particle].copy()
        else:
            particle = None
            d = len(self.names)
            if self.gbest_x is None:
                x = self.rng.uniform(0.0, 1.0, size=d)
            else:
                x = np.clip(
                    self.gbest_x + self.rng.normal(0.0, self.explore_sigma, size=d), 0.0, 1.0
                )
        return particle, x

    def tell(self, token: str, value: float | None) -> None:
        """The result of trial ``token``; ``None`` or a non-finite value marks a failure."""
        entry = self.outstanding.pop(token, None)
        if entry is None:
            return  # unknown or already told
        particle, x = entry
        self._n_told += 1
        ok = value is not None and math.isfinite(float(value))
        if not ok:
            self.n_failed += 1
            if particle is not None:
                d = len(self.names)
                self.x[particle] = self.rng.uniform(0.0, 1.0, size=d)
                self.v[particle] = self.rng.uniform(-self.v_max, self.v_max, size=d)
                self.idle.append(particle)
            return
        score = float(value) if self.maximize else -float(value)  # type: ignore[arg-type]
        if self.gbest_score is None or score > self.gbest_score:
            self.gbest_score, self.gbest_x = score, x.copy()
        if particle is None:
            return
        best = self.pbest_score[particle]
        if best is None or score > best:
            self.pbest_score[particle], self.pbest_x[particle] = score, x.copy()
        self._move(particle)
        self.idle.append(particle)

    def _move(self, i: int) -> None:
        d = len(self.names)
        r1 = self.rng.uniform(0.0, 1.0, size=d)
        r2 = self.rng.uniform(0.0, 1.0, size=d)
        x, v = self.x[i], self.inertia * self.v[i]
        pbest = self.pbest_x[i]
        if pbest is not None:
            v = v + self.c1 * r1 * (pbest - x)
        if self.gbest_x is not None:
            v = v + self.c2 * r2 * (self.gbest_x - x)
        v = np.clip(v, -self.v_max, self.v_max)
        x = x + v
        # Reflect off the walls (|v| <= v_max <= 1 keeps one reflection enough).
        low, high = x < 0.0, x > 1.0
        x = np.where(low, -x, np.where(high, 2.0 - x, x))
        v = np.where(low | high, -v, v)
        self.x[i] = np.clip(x, 0.0, 1.0)
        self.v[i] = v

    # -- results ---------------------------------------------------------------------------
    @property
    def n_told(self) -> int:
        return self._n_told

    def best(self) -> tuple[dict[str, Any], float] | None:
        """The best parameters told so far and their value, or None before any success."""
        if self.gbest_x is None or self.gbest_score is None:
            return None
        value = self.gbest_score if self.maximize else -self.gbest_score
        return self._decode(self.gbest_x), value

    # -- state as plain data ---------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "names": self.names,
            "seed": self.seed,
            "maximize": self.maximize,
            "swarm_size": self.swarm_size,
            "inertia": self.inertia,
            "c1": self.c1,
            "c2": self.c2,
            "v_max": self.v_max,
            "explore_sigma": self.explore_sigma,
            "x": self.x.tolist(),
            "v": self.v.tolist(),
            "pbest_x": [None if p is None else p.tolist() for p in self.pbest_x],
            "pbest_score": list(self.pbest_score),
            "gbest_x": None if self.gbest_x is None else self.gbest_x.tolist(),
            "gbest_score": self.gbest_score,
            "idle": list(self.idle),
            "outstanding": {
                t: {"particle": p, "x": x.tolist()} for t, (p, x) in self.outstanding.items()
            },
            "n_told": self._n_told,
            "n_failed": self.n_failed,
            "rng": self.rng.bit_generator.state,
        }

    def load_state(self, state: dict[str, Any]) -> None:
        if state.get("version") != STATE_VERSION:
            raise ValueError(
                f"PSO state version {state.get('version')!r}, expected {STATE_VERSION}"
            )
        if list(state["names"]) != self.names:
            raise ValueError(
                f"PSO state is for dimensions {state['names']}, this space has {self.names}"
            )
        self.seed = state["seed"]
        self.maximize = bool(state["maximize"])
        self.swarm_size = int(state["swarm_size"])
        self.inertia = float(state["inertia"])
        self.c1, self.c2 = float(state["c1"]), float(state["c2"])
        self.v_max = float(state["v_max"])
        self.explore_sigma = float(state["explore_sigma"])
        d = len(self.names)
        self.x = np.asarray(state["x"], dtype=float).reshape(self.swarm_size, d)
        self.v = np.asarray(state["v"], dtype=float).reshape(self.swarm_size, d)
        self.pbest_x = [None if p is None else np.asarray(p, dtype=float) for p in state["pbest_x"]]
        self.pbest_score = [None if s is None else float(s) for s in state["pbest_score"]]
        gx = state["gbest_x"]
        self.gbest_x = None if gx is None else np.asarray(gx, dtype=float)
        gs = state["gbest_score"]
        self.gbest_score = None if gs is None else float(gs)
        self.idle = deque(int(i) for i in state["idle"])
        self.outstanding = {
            t: (
                None if o["particle"] is None else int(o["particle"]),
                np.asarray(o["x"], dtype=float),
            )
            for t, o in state["outstanding"].items()
        }
        self._n_told = int(state["n_told"])
        self.n_failed = int(state["n_failed"])
        self.rng.bit_generator.state = state["rng"]  # a PCG64 state dict, restored as is

    # -- helpers ---------------------------------------------------------------------------
    def _latin_hypercube(self, n: int, d: int) -> np.ndarray:
        """``n`` points in [0, 1]^d, one in each of the ``n`` strata of every dimension."""
        strata = (
            np.stack([self.rng.permutation(n) for _ in range(d)], axis=1) if d else np.zeros((n, 0))
        )
        return (strata + self.rng.uniform(0.0, 1.0, size=(n, d))) / n

    def _decode(self, x: np.ndarray) -> dict[str, Any]:
        return {
            name: decode(self.dims[name], float(u)) for name, u in zip(self.names, x, strict=True)
        }
